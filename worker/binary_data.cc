#include "worker/binary_data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/model_tables.hpp"
#include "worker/data_reader.hpp"

namespace parasol {
namespace {

constexpr size_t kHeaderBytes = 64;
constexpr size_t kHeaderChecked = 56;  // the bytes the header's checksum covers
constexpr uint64_t kRowBytes =
    sizeof(float) * (1 + kCriteoDenseFeatures) + sizeof(uint64_t) * kCriteoSparseFields;

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Writes all of `bytes` to `fd`.
Status WriteAll(int fd, const char* bytes, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, bytes, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return IoError("cannot write '" + path + "': " + std::strerror(errno));
    bytes += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

uint64_t BinaryBlockBytes(uint64_t n) { return n * kRowBytes + sizeof(uint64_t); }

bool BinaryData::IsBinary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kBinaryDataMagic)] = {};
  in.read(magic, sizeof(magic));
  return in.gcount() == sizeof(magic) &&
         std::memcmp(magic, kBinaryDataMagic, sizeof(magic)) == 0;
}

bool BinaryData::LooksBinary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[kHeaderBytes] = {};
  in.read(head, sizeof(head));
  return std::memchr(head, '\0', static_cast<size_t>(in.gcount())) != nullptr;
}

Result<std::unique_ptr<BinaryData>> BinaryData::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot read data file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return IoError("cannot read data file '" + path + "': " + std::strerror(e));
  }
  std::unique_ptr<BinaryData> d(new BinaryData());
  d->path_ = path;
  d->size_ = static_cast<uint64_t>(st.st_size);
  auto bad = [&](const std::string& why) {
    return InvalidArgument("binary data file '" + path + "': " + why +
                    " (write it again with `parasol convert`)");
  };
  if (d->size_ < kHeaderBytes) {
    ::close(fd);
    return bad("shorter (" + std::to_string(d->size_) + " bytes) than its 64-byte header");
  }
  void* m = ::mmap(nullptr, d->size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    return IoError("cannot map data file '" + path + "': " + std::strerror(errno));
  }
  d->data_ = static_cast<const char*>(m);
  ::madvise(m, d->size_, MADV_SEQUENTIAL);
  const char* h = d->data_;
  if (std::memcmp(h, kBinaryDataMagic, sizeof(kBinaryDataMagic)) != 0) {
    return bad("no PARASOLB magic");
  }
  if (XXH3_64bits(h, kHeaderChecked) != Load<uint64_t>(h + kHeaderChecked)) {
    return bad("its header fails its checksum");
  }
  const uint32_t version = Load<uint32_t>(h + 8);
  if (version != kBinaryDataVersion) {
    return bad("version " + std::to_string(version) + ", this build reads version " +
               std::to_string(kBinaryDataVersion));
  }
  const uint32_t has_label = Load<uint32_t>(h + 12);
  d->rows_ = Load<uint64_t>(h + 16);
  d->block_rows_ = Load<uint32_t>(h + 24);
  const uint32_t dense = Load<uint32_t>(h + 28), fields = Load<uint32_t>(h + 32);
  if (has_label > 1 || d->block_rows_ == 0 || dense != kCriteoDenseFeatures ||
      fields != kCriteoSparseFields) {
    return bad("a header this build does not read (label " + std::to_string(has_label) +
               ", block rows " + std::to_string(d->block_rows_) + ", " + std::to_string(dense) +
               " dense features, " + std::to_string(fields) + " sparse fields)");
  }
  d->has_label_ = has_label == 1;
  const uint64_t blocks = (d->rows_ + d->block_rows_ - 1) / d->block_rows_;
  if (d->rows_ > (d->size_ / kRowBytes) + 1) return bad("more rows in its header than bytes");
  const uint64_t want = blocks == 0 ? kHeaderBytes
                                    : d->BlockOffset(blocks - 1) + BinaryBlockBytes(d->BlockRows(blocks - 1));
  if (d->size_ != want) {
    return bad(std::to_string(d->size_) + " bytes where its header's " +
               std::to_string(d->rows_) + " rows make " + std::to_string(want) +
               (d->size_ < want ? " (cut short)" : ""));
  }
  d->checked_.assign(blocks, 0);
  return d;
}

BinaryData::~BinaryData() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

uint64_t BinaryData::BlockOffset(uint64_t b) const {
  return kHeaderBytes + b * BinaryBlockBytes(block_rows_);
}

uint64_t BinaryData::BlockRows(uint64_t b) const {
  return std::min<uint64_t>(block_rows_, rows_ - b * block_rows_);
}

Status BinaryData::AppendRow(uint64_t row, Batch* batch) {
  if (row >= rows_) {
    return InvalidArgument("row " + std::to_string(row) + " of binary data file '" + path_ +
                      "', which has " + std::to_string(rows_));
  }
  const uint64_t b = row / block_rows_, i = row % block_rows_, n = BlockRows(b);
  const char* block = data_ + BlockOffset(b);
  if (!checked_[b]) {
    const uint64_t bytes = n * kRowBytes;
    const std::string where = "binary data file '" + path_ + "': block " + std::to_string(b) +
                              " (rows " + std::to_string(b * block_rows_) + " to " +
                              std::to_string(b * block_rows_ + n - 1) + ")";
    if (XXH3_64bits(block, bytes) != Load<uint64_t>(block + bytes)) {
      return InvalidArgument(where + " fails its checksum (write it again with `parasol "
                             "convert`)");
    }
    // What the text reader could have made: labels 0 or 1 (0 without labels), dense features
    // log(1 + max(x, 0)): finite and >= 0.
    for (uint64_t r = 0; r < n; ++r) {
      const float label = Load<float>(block + r * sizeof(float));
      if (!(label == 0.0f || (has_label_ && label == 1.0f))) {
        return InvalidArgument(where + ": row " + std::to_string(b * block_rows_ + r) +
                               " has label " + std::to_string(label));
      }
    }
    const char* dense = block + n * sizeof(float);
    for (uint64_t i = 0; i < n * kCriteoDenseFeatures; ++i) {
      const float x = Load<float>(dense + i * sizeof(float));
      if (!std::isfinite(x) || x < 0.0f) {
        return InvalidArgument(where + ": row " +
                               std::to_string(b * block_rows_ + i / kCriteoDenseFeatures) +
                               " has dense feature I" +
                               std::to_string(i % kCriteoDenseFeatures + 1) + " = " +
                               std::to_string(x) + " (not a log(1 + x) of x >= 0)");
      }
    }
    checked_[b] = 1;
  }
  const char* labels = block;
  const char* dense = labels + n * sizeof(float);
  const char* keys = dense + n * kCriteoDenseFeatures * sizeof(float);
  batch->labels.push_back(Load<float>(labels + i * sizeof(float)));
  const size_t d0 = batch->dense.size();
  batch->dense.resize(d0 + kCriteoDenseFeatures);
  std::memcpy(batch->dense.data() + d0, dense + i * kCriteoDenseFeatures * sizeof(float),
              kCriteoDenseFeatures * sizeof(float));
  const size_t k0 = batch->keys.size();
  batch->keys.resize(k0 + kCriteoSparseFields);
  std::memcpy(batch->keys.data() + k0, keys + i * kCriteoSparseFields * sizeof(uint64_t),
              kCriteoSparseFields * sizeof(uint64_t));
  batch->values.resize(batch->values.size() + kCriteoSparseFields, 1.0f);
  batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
  ++batch->size;
  return Status::Ok();
}

Result<ConvertReport> ConvertCriteo(const std::string& in, const std::string& out, bool has_label,
                                    DataOptions::OnBadRow on_bad_row, uint32_t block_rows) {
  if (block_rows == 0) return InvalidArgument("convert: block_rows must be at least 1");
  std::error_code same_ec;
  if (std::filesystem::equivalent(in, out, same_ec)) {
    return InvalidArgument("convert: '" + out + "' is the text file itself");
  }
  if (std::error_code ec; !std::filesystem::is_regular_file(in, ec)) {
    return NotFound("cannot read data file '" + in + "': " +
                    (ec ? ec.message() : std::string("not a regular file")));
  }
  std::ifstream text(in, std::ios::binary);
  if (!text) return NotFound("cannot read data file '" + in + "': " + std::strerror(errno));
  if (BinaryData::IsBinary(in)) {
    return InvalidArgument("'" + in + "' is binary data already (written by parasol convert)");
  }
  const std::string tmp = out + ".partial";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot write '" + tmp + "': " + std::strerror(errno));
  auto fail = [&](Status st) {
    ::close(fd);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return st;
  };
  ConvertReport report;
  std::vector<char> header(kHeaderBytes, 0);  // written last, once the rows are known
  Status st = WriteAll(fd, header.data(), header.size(), tmp);
  if (!st.ok()) return fail(st);
  Batch batch;
  batch.Clear();
  std::vector<char> block;
  auto flush = [&]() -> Status {
    const uint64_t n = batch.size;
    if (n == 0) return Status::Ok();
    block.resize(BinaryBlockBytes(n));
    char* p = block.data();
    std::memcpy(p, batch.labels.data(), n * sizeof(float));
    p += n * sizeof(float);
    std::memcpy(p, batch.dense.data(), n * kCriteoDenseFeatures * sizeof(float));
    p += n * kCriteoDenseFeatures * sizeof(float);
    std::memcpy(p, batch.keys.data(), n * kCriteoSparseFields * sizeof(uint64_t));
    p += n * kCriteoSparseFields * sizeof(uint64_t);
    Store<uint64_t>(p, XXH3_64bits(block.data(), n * kRowBytes));
    report.rows += n;
    batch.Clear();
    return WriteAll(fd, block.data(), block.size(), tmp);
  };
  std::string line;
  bool too_long = false;
  uint64_t line_no = 1;
  // A read error surfaces from the stream buffer as an exception (libstdc++).
  auto read_row = [&]() -> Result<bool> {
    try {
      return ReadRow(text, &line, &too_long);
    } catch (const std::exception& e) {
      return IoError("cannot read data file '" + in + "' at line " + std::to_string(line_no) +
                     ": " + e.what());
    }
  };
  for (;; ++line_no) {
    Result<bool> got = read_row();
    if (!got.ok()) return fail(got.status());
    if (!*got) break;
    Status row = too_long ? InvalidArgument("row longer than " + std::to_string(kMaxRowBytes) +
                                            " bytes")
                          : ParseCriteoRow(line, has_label, &batch);
    if (!row.ok()) {
      const std::string where = in + ":" + std::to_string(line_no) + ": " + row.message();
      if (on_bad_row == DataOptions::OnBadRow::kFail) {
        return fail(InvalidArgument("malformed row at " + where + " (--on-bad-row fail)"));
      }
      if (report.first_bad.empty()) report.first_bad = where;
      ++report.bad_rows;
      continue;
    }
    if (batch.size == block_rows && !(st = flush()).ok()) return fail(st);
  }
  if (text.bad()) return fail(IoError("cannot read data file '" + in + "'"));
  if (!(st = flush()).ok()) return fail(st);
  std::memcpy(header.data(), kBinaryDataMagic, sizeof(kBinaryDataMagic));
  Store<uint32_t>(header.data() + 8, kBinaryDataVersion);
  Store<uint32_t>(header.data() + 12, has_label ? 1 : 0);
  Store<uint64_t>(header.data() + 16, report.rows);
  Store<uint32_t>(header.data() + 24, block_rows);
  Store<uint32_t>(header.data() + 28, kCriteoDenseFeatures);
  Store<uint32_t>(header.data() + 32, kCriteoSparseFields);
  Store<uint64_t>(header.data() + kHeaderChecked, XXH3_64bits(header.data(), kHeaderChecked));
  if (::pwrite(fd, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
    return fail(IoError("cannot write '" + tmp + "': " + std::strerror(errno)));
  }
  if (::fsync(fd) != 0) return fail(IoError("cannot sync '" + tmp + "': " + std::strerror(errno)));
  ::close(fd);
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return IoError("cannot rename '" + tmp + "' to '" + out + "': " + ec.message());
  }
  // The rename itself made durable.
  const std::string dir = std::filesystem::path(out).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return report;
}

}  // namespace parasol
