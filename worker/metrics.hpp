// Evaluation metrics over (predicted probability, label) pairs.
#pragma once

#include <span>

namespace parasol {

// Mean binary cross-entropy; probabilities are clipped to [1e-7, 1 - 1e-7].
double LogLoss(std::span<const float> probs, std::span<const float> labels);

// Exact ROC AUC: the probability that a random positive scores above a random negative, ties
// counting one half (the Mann-Whitney statistic with average ranks). 0.5 when one class is
// absent.
double Auc(std::span<const float> scores, std::span<const float> labels);

}  // namespace parasol
