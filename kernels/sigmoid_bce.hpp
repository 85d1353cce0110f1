// Sigmoid and binary cross-entropy on the device, forward and backward in one pass:
//   probs = sigmoid(logits), dlogits = (probs - labels) / n, *loss_sum = sum of the losses
#pragma once

#include "common/status.hpp"

namespace parasol {

// `loss_sum` is one device double (overwritten; 0 when n is 0).
Status SigmoidBceCuda(float* probs, float* dlogits, double* loss_sum, const float* logits,
                      const float* labels, int n, void* stream);

}  // namespace parasol
