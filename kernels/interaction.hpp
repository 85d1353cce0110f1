// The DLRM dot interaction on the device (see Backend::Interaction for the layout):
//   out[b] = [z[b, :], dot(v_i, v_j) for i > j]   with v_0 = z[b], v_i = e[b, i - 1]
// A block takes up to 8 samples, loads their vectors (and, backward, their pair gradients) into
// shared memory once, and writes whole output rows; shapes too large for shared memory fall back
// to a kernel reading global memory.
#pragma once

#include "common/status.hpp"

namespace parasol {

// Output rows out_ld floats apart; columns past the width are zeroed.
Status InteractionCuda(float* out, int out_ld, const float* z, const float* e, int batch,
                       int fields, int dim, void* stream);
// dz and de from dout (rows dout_ld floats apart; both outputs overwritten).
Status InteractionBackwardCuda(float* dz, float* de, const float* dout, int dout_ld,
                               const float* z, const float* e, int batch, int fields, int dim,
                               void* stream);

}  // namespace parasol
