// The DLRM interaction as plain pairwise loops: the definition the backends' kernels are tested
// against (the CPU backend's equal them bit for bit; see Backend::Interaction for the layout).
#pragma once

namespace parasol {

void InteractionReference(float* out, int out_ld, const float* z, const float* e, int batch,
                          int fields, int dim);
void InteractionBackwardReference(float* dz, float* de, const float* dout, int dout_ld,
                                  const float* z, const float* e, int batch, int fields, int dim);

}  // namespace parasol
