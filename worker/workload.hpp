// A generated push/pull workload against a running job, checked against a reference the
// worker computes itself. It drives `parasol loadgen` (the demo) and the integration tests.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"
#include "worker/ps_client.hpp"

namespace parasol {

struct WorkloadOptions {
  uint32_t steps = 20;          // push/pull rounds
  uint32_t batch_keys = 4096;   // sparse keys per round, drawn from a Zipf distribution
  uint64_t key_space = 1000000; // distinct keys the draws come from
  double zipf_s = 1.05;         // Zipf exponent
  uint64_t key_offset = 0;      // added to every key (gives workers disjoint key sets)
  uint64_t seed = 1;
  bool push_dense = true;       // also push/pull every dense table each round
  bool verify = true;           // compare the final state with the local reference
};

struct WorkloadReport {
  uint64_t rounds = 0;
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
  uint64_t unique_keys = 0;
  uint64_t dense_elements = 0;
  uint64_t values_checked = 0;
  double max_abs_error = 0.0;
  double seconds = 0.0;
  std::string ToString() const;
};

// Runs the workload on every table of the client's manifest. The reference assumes this
// worker is the only writer of its keys (use key_offset for several workers) and of the dense
// tables (push_dense = false for all but one worker).
Result<WorkloadReport> RunWorkload(PsClient& client, const WorkloadOptions& options);

}  // namespace parasol
