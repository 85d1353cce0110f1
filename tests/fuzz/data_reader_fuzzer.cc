// libFuzzer target for the data readers: the bytes are a data file, split into rows by the
// reader's own line reader (with a small row limit, so over-long rows are reached too), and
// each row is parsed as a Criteo row with and without its label and as a libsvm row. Whatever
// a parser accepts must leave the batch consistent; whatever it refuses must leave it as it was.
// Bytes that start as binary data (worker/binary_data.hpp) are also opened as a binary file
// (through a memfd, no disk) and every row it claims is read: each accepted row must leave the
// batch consistent, and a refused one (its block's checksum) must leave it as it was.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "worker/binary_data.hpp"
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

void FuzzBinary(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("binary_data", MFD_CLOEXEC);
  if (fd < 0) return;
  if (::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = parasol::BinaryData::Open(path);
  if (file.ok()) {
    // Open checked the size against the rows, so every row it claims lies in the file.
    if ((*file)->rows() > size) std::abort();
    Batch b;
    b.Clear();
    for (uint64_t r = 0; r < (*file)->rows(); ++r) {
      const uint32_t before = b.size;
      const parasol::Status st = (*file)->AppendRow(r, &b);
      if (b.size != before + (st.ok() ? 1 : 0)) std::abort();
      if (!st.ok() && st.message().find(path) == std::string::npos) std::abort();
      CheckBatch(b);
    }
    if ((*file)->AppendRow((*file)->rows(), &b).ok()) std::abort();  // past the end
  } else if (file.status().message().find(path) == std::string::npos) {
    std::abort();  // every refusal names the file
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= sizeof(parasol::kBinaryDataMagic) &&
      std::memcmp(data, parasol::kBinaryDataMagic, sizeof(parasol::kBinaryDataMagic)) == 0) {
    FuzzBinary(data, size);
  }
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
