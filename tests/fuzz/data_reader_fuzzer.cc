// libFuzzer target for the data readers: the bytes are a data file, split into rows by the
// reader's own line reader (with a small row limit, so over-long rows are reached too), and
// each row is parsed as a Criteo row with and without its label and as a libsvm row. Whatever
// a parser accepts must leave the batch consistent; whatever it refuses must leave it as it was.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "worker/data_reader.hpp"

namespace {

using parasol::Batch;

void CheckBatch(const Batch& b) {
  if (b.labels.size() != b.size || b.dense.size() != size_t{b.size} * 13 ||
      b.offsets.size() != size_t{b.size} + 1 || b.offsets.back() != b.keys.size() ||
      b.values.size() != b.keys.size()) {
    std::abort();
  }
  for (uint32_t i = 0; i < b.size; ++i) {
    if (b.offsets[i] > b.offsets[i + 1]) std::abort();
    if (b.labels[i] != 0.0f && b.labels[i] != 1.0f) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  Batch criteo, unlabeled, libsvm;
  criteo.Clear();
  unlabeled.Clear();
  libsvm.Clear();
  std::string line;
  bool too_long = false;
  while (parasol::ReadRow(in, &line, &too_long, 4096)) {
    if (line.size() > 4096 || line.find('\n') != std::string::npos) std::abort();
    if (too_long) continue;
    for (auto [batch, parse] : {std::pair{&criteo, 0}, {&unlabeled, 1}, {&libsvm, 2}}) {
      const uint32_t before = batch->size;
      const parasol::Status st = parse == 0   ? parasol::ParseCriteoRow(line, true, batch)
                                 : parse == 1 ? parasol::ParseCriteoRow(line, false, batch)
                                              : parasol::ParseLibsvmRow(line, batch);
      if (batch->size != before + (st.ok() ? 1 : 0)) std::abort();
      CheckBatch(*batch);
    }
  }
  return 0;
}
