// Criteo-shaped synthetic data: 13 integer features and 26 categorical fields whose values
// follow a Zipf distribution (cardinalities from tens to millions), and a label drawn from a
// hidden logistic model of those features, so that a model can learn it.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"

namespace parasol {

struct GeneratorOptions {
  uint64_t rows = 100000;
  uint64_t seed = 1;
  double zipf_s = 1.1;
};

// Writes `rows` Criteo TSV lines to `path`.
Status GenerateCriteo(const std::string& path, const GeneratorOptions& options);

// The cardinality of categorical field f (0..25): from 10 up to 2 million, log-spaced.
uint64_t GeneratedCardinality(uint32_t field);

}  // namespace parasol
