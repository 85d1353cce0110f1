#include "server/dense_table.hpp"

#include "common/initializer.hpp"

namespace parasol {

DenseTable::DenseTable(const TableOptions& options, SliceRange slice)
    : options_(options),
      slice_(slice),
      data_(std::make_unique_for_overwrite<float[]>(slice.size() == 0 ? 1 : slice.size())) {
  InitDenseRange(options_.init, options_.seed, slice_.begin,
                 std::span<float>(data_.get(), slice_.size()));
}

}  // namespace parasol
