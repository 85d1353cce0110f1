// Binary data: a pre-parsed, column-wise copy of a Criteo-format file (`parasol convert`), which
// workers read through mmap without parsing, as HugeCTR's raw format is read. Each row holds
// exactly what the text reader makes of it (worker/data_reader.hpp, ParseCriteoRow): its label,
// its 13 dense features as log(1 + max(x, 0)) (0 when empty), and its 26 keys
// (CriteoKey(field, value)). A data file given to a worker (data.train, data.eval) is read as
// binary when it starts with the magic below, as text otherwise.
//
// Layout (little-endian):
//   header, 64 bytes: magic "PARASOLB", version (u32, 1), has_label (u32, 0 or 1), rows (u64),
//     block_rows (u32), dense features (u32, 13), sparse fields (u32, 26), 20 bytes of zeros,
//     the XXH3-64 of the 56 bytes before it (u64);
//   then block b of the rows [b * block_rows, min(rows, (b + 1) * block_rows)), n rows:
//     labels f32[n], dense f32[n * 13], keys u64[n * 26], the XXH3-64 of those bytes (u64).
// A block is checked the first time a reader takes a row of it: its checksum, and its values
// (labels 0 or 1, or 0 without labels; dense features finite and >= 0, as the text reader makes
// them), so a file written by other means cannot feed what text cannot. A changed byte, a short
// file, a bad header or a value out of range is refused with the file (and the block) named.
// A file that starts with a NUL-bearing header but not the magic is refused as damaged binary
// data, not read as text.
//
// The file is mapped: a process that cuts it short or rewrites it in place while a worker reads
// it kills that worker (SIGBUS). `parasol convert` replaces a file by renaming a new one over it,
// which is safe; do not truncate or overwrite a binary file a job is reading.
//
// Malformed text rows are left out of the copy (and counted), so when the text has any, the
// rows after them sit at other positions than in the text: which worker reads which row, and
// --trace-rows' positions, differ from the text's. Clean text gives exactly the text's batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"
#include "worker/batch.hpp"

namespace parasol {

inline constexpr char kBinaryDataMagic[8] = {'P', 'A', 'R', 'A', 'S', 'O', 'L', 'B'};
inline constexpr uint32_t kBinaryDataVersion = 1;

class BinaryData {
 public:
  // Whether `path` starts with the magic (a file that cannot be read is not binary: the text
  // reader then says why it cannot read it).
  static bool IsBinary(const std::string& path);
  // Whether `path` is no text either: a NUL byte in its first 64 bytes (Criteo and libsvm text
  // have none), as in a binary file whose magic was damaged.
  static bool LooksBinary(const std::string& path);
  // Maps the file and checks its header and size.
  static Result<std::unique_ptr<BinaryData>> Open(const std::string& path);
  ~BinaryData();
  BinaryData(const BinaryData&) = delete;
  BinaryData& operator=(const BinaryData&) = delete;

  uint64_t rows() const { return rows_; }
  bool has_label() const { return has_label_; }
  // Appends row `row` (below rows()) to `batch`, as ParseCriteoRow would the row it came from.
  // An error (naming the file and the block) when the row's block fails its checksum.
  Status AppendRow(uint64_t row, Batch* batch);

 private:
  BinaryData() = default;
  // Where block `b` begins, and how many rows it has.
  uint64_t BlockOffset(uint64_t b) const;
  uint64_t BlockRows(uint64_t b) const;

  std::string path_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t rows_ = 0;
  uint32_t block_rows_ = 0;
  bool has_label_ = true;
  std::vector<uint8_t> checked_;  // per block: 0 not yet, 1 good
};

// The bytes of a block of `n` rows, its checksum included.
uint64_t BinaryBlockBytes(uint64_t n);

struct ConvertReport {
  uint64_t rows = 0;      // rows written
  uint64_t bad_rows = 0;  // malformed rows left out (on_bad_row: skip)
  std::string first_bad;  // "file:line: why" of the first one
};

// Writes the binary copy of Criteo-format text file `in` to `out` (through a temporary file in
// the same folder, renamed into place once complete and synced). `has_label`: 40 fields a row
// (train) or 39 (Criteo's unlabeled test file). Malformed rows are left out and counted, or end
// the conversion with an error naming the line (on_bad_row: fail); `out` is then not written.
Result<ConvertReport> ConvertCriteo(const std::string& in, const std::string& out, bool has_label,
                                    DataOptions::OnBadRow on_bad_row,
                                    uint32_t block_rows = 65536);

}  // namespace parasol
