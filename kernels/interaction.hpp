// The DLRM dot interaction on the device (see Backend::Interaction for the layout):
//   out[b] = [z[b, :], dot(v_i, v_j) for i > j]   with v_0 = z[b], v_i = e[b, i - 1]
#pragma once

#include "common/status.hpp"

namespace parasol {

Status InteractionCuda(float* out, const float* z, const float* e, int batch, int fields,
                       int dim, void* stream);
// dz and de from dout (both overwritten).
Status InteractionBackwardCuda(float* dz, float* de, const float* dout, const float* z,
                               const float* e, int batch, int fields, int dim, void* stream);

}  // namespace parasol
