// The batch's row index on the device (see BuildRowIndex in kernels/embedding_pool.hpp for the
// CPU version and the layout): a stable radix sort of the key positions by row (CUB), the row
// starts from the sorted rows' boundaries, and the hot rows by an ordered selection. Stable, so
// the index is the CPU's exactly and the row gradients summed from it are deterministic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.hpp"

namespace parasol {

// Device scratch the index of up to max_keys keys and max_rows rows needs.
size_t RowIndexScratchBytes(uint32_t max_keys, uint32_t max_rows);

// indices[0, keys) (each < counts[0], the number of rows, in device memory; max_rows bounds
// it) -> row_start [counts[0] + 1], occ [keys], hot_rows and counts[1] (their number).
Status BuildRowIndexCuda(const uint32_t* indices, uint32_t keys, uint32_t max_rows,
                         uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows,
                         uint32_t* counts, void* scratch, size_t scratch_bytes, void* stream);

}  // namespace parasol
