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
  // The largest field's cardinality (the others log-spaced from 10 up to it).
  uint64_t vocabulary = 2000000;
};

// Writes `rows` Criteo TSV lines to `path`.
Status GenerateCriteo(const std::string& path, const GeneratorOptions& options);

// The cardinality of categorical field f (0..25): from 10 up to `vocabulary` (2 million
// unless given), log-spaced.
uint64_t GeneratedCardinality(uint32_t field, uint64_t vocabulary = 2000000);

}  // namespace parasol
