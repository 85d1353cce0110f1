#include "worker/data_reader.hpp"

#include "worker/binary_data.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <algorithm>

#include "common/hash.hpp"
#include "common/model_tables.hpp"

namespace parasol {
namespace {

constexpr uint64_t kMissingSalt = 0x4d495353494e47ULL;  // "MISSING"
constexpr uint64_t kLibsvmSalt = 0x4c4942535653ULL;     // "LIBSVS"

bool ParseInt64(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  const char* b = s.data();
  if (*b == '+') {
    ++b;
    if (b != s.data() + s.size() && *b == '-') return false;  // "+-1"
  }
  auto [p, ec] = std::from_chars(b, s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ParseFloat(std::string_view s, float* out) {
  if (s.empty() || s.size() > 64) return false;
  char buf[65];
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(buf, &end);
  if (end != buf + s.size() || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Calls fn(field) for each tab-separated field; never collapses repeated tabs.
template <typename Fn>
size_t SplitTabs(std::string_view line, Fn&& fn) {
  size_t count = 0, start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    fn(count, line.substr(start, tab == std::string_view::npos ? std::string_view::npos
                                                               : tab - start));
    ++count;
    if (tab == std::string_view::npos) return count;
    start = tab + 1;
  }
}

}  // namespace

uint64_t CriteoKey(uint32_t field, std::string_view value) {
  if (value.empty()) return HashKey(field, kMissingSalt);
  return HashBytes(value, SplitMix64(field + 1));
}

uint64_t LibsvmKey(uint64_t index) { return HashKey(index, kLibsvmSalt); }

bool ReadRow(std::istream& in, std::string* line, bool* too_long, size_t max_bytes) {
  line->clear();
  *too_long = false;
  std::streambuf* buf = in.rdbuf();
  bool any = false;
  while (true) {
    const int c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return any;
    }
    any = true;
    if (c == '\n') return true;
    if (line->size() < max_bytes) {
      line->push_back(static_cast<char>(c));
    } else {
      *too_long = true;
    }
  }
}

Status ParseCriteoRow(std::string_view line, bool has_label, Batch* batch) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t want = (has_label ? 1 : 0) + kCriteoDenseFeatures + kCriteoSparseFields;
  std::string_view fields[48];
  const size_t n = SplitTabs(line, [&](size_t i, std::string_view f) {
    if (i < 48) fields[i] = f;
  });
  if (n != want) {
    return InvalidArgument("expected " + std::to_string(want) + " tab-separated fields, found " +
                           std::to_string(n));
  }
  size_t i = 0;
  float label = 0;
  if (has_label) {
    if (fields[0] != "0" && fields[0] != "1") {
      return InvalidArgument("label must be 0 or 1, found '" + std::string(fields[0]) + "'");
    }
    label = fields[0] == "1" ? 1.0f : 0.0f;
    i = 1;
  }
  float dense[kCriteoDenseFeatures];
  for (uint32_t d = 0; d < kCriteoDenseFeatures; ++d, ++i) {
    if (fields[i].empty()) {
      dense[d] = 0.0f;
      continue;
    }
    int64_t x = 0;
    if (!ParseInt64(fields[i], &x)) {
      return InvalidArgument("integer feature I" + std::to_string(d + 1) + " is '" +
                             std::string(fields[i]) + "', not an integer");
    }
    dense[d] = static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(x, 0))));
  }
  batch->labels.push_back(label);
  batch->dense.insert(batch->dense.end(), dense, dense + kCriteoDenseFeatures);
  for (uint32_t c = 0; c < kCriteoSparseFields; ++c, ++i) {
    batch->keys.push_back(CriteoKey(c, fields[i]));
    batch->values.push_back(1.0f);
  }
  batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
  ++batch->size;
  return Status::Ok();
}

Status ParseLibsvmRow(std::string_view line, Batch* batch) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::vector<std::pair<uint64_t, float>> features;
  float label = 0;
  size_t pos = 0, token = 0;
  while (pos < line.size()) {
    while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
    if (pos >= line.size()) break;
    size_t end = pos;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
    const std::string_view t = line.substr(pos, end - pos);
    if (token == 0) {
      int64_t l = 0;
      if (!ParseInt64(t, &l) || (l != 0 && l != 1 && l != -1)) {
        return InvalidArgument("label must be 0, 1, -1 or +1, found '" + std::string(t) + "'");
      }
      label = l == 1 ? 1.0f : 0.0f;
    } else {
      const size_t colon = t.find(':');
      int64_t index = 0;
      float value = 0;
      if (colon == std::string_view::npos || !ParseInt64(t.substr(0, colon), &index) ||
          index < 0 || !ParseFloat(t.substr(colon + 1), &value)) {
        return InvalidArgument("feature '" + std::string(t) + "' is not index:value");
      }
      features.emplace_back(LibsvmKey(static_cast<uint64_t>(index)), value);
    }
    ++token;
    pos = end;
  }
  if (token == 0) return InvalidArgument("empty row");
  batch->labels.push_back(label);
  batch->dense.insert(batch->dense.end(), kCriteoDenseFeatures, 0.0f);
  for (const auto& [k, v] : features) {
    batch->keys.push_back(k);
    batch->values.push_back(v);
  }
  batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
  ++batch->size;
  return Status::Ok();
}

BatchReader::BatchReader(ReaderOptions options) : options_(std::move(options)) {
  membership_ = options_.membership.max_ranks() > 0
                    ? options_.membership
                    : Membership(options_.workers, std::max(options_.workers, options_.rank + 1));
  const uint64_t unit = static_cast<uint64_t>(std::max<int64_t>(0, options_.start_step)) *
                        std::max<uint32_t>(1, options_.batches_per_step);
  thread_ = std::thread([this, unit] { Run(unit, Cursor{}); });
}

BatchReader::~BatchReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool BatchReader::Emit(Batch batch) {
  if (options_.deduplicate) DeduplicateKeys(batch.keys, dedup_index_, &batch.distinct);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopping_ || queue_.size() < options_.queue_batches; });
  if (stopping_) return false;
  queue_.push_back(std::move(batch));
  cv_.notify_all();
  return true;
}

Batch BatchReader::Fresh() {
  Batch b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
  }
  b.Clear();
  return b;
}

void BatchReader::Recycle(Batch batch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < size_t{options_.queue_batches} + 4) free_.push_back(std::move(batch));
}

void BatchReader::Finish(Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  status_ = std::move(status);
  cv_.notify_all();
}

namespace {

// Skips the next line of `in`; false at the end of the input.
bool SkipRow(std::istream& in) {
  in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  return in.gcount() > 0;
}

}  // namespace

void BatchReader::Run(uint64_t unit, Cursor at) {
  Membership membership;
  {
    std::lock_guard<std::mutex> lock(mu_);
    membership = membership_;
  }
  const uint32_t per = std::max<uint32_t>(1, options_.batches_per_step);
  const uint32_t batch_size = std::max<uint32_t>(1, options_.batch_size);
  Cursor cur = at;  // the next line of the stream
  std::ifstream in;
  std::string line;
  bool too_long = false;
  // A binary file (worker/binary_data.hpp) instead of `in`: its rows are its lines, and a
  // cursor's line_no is the next row (its offset stays 0).
  std::unique_ptr<BinaryData> bin;
  uint64_t bin_row = 0;  // the row next_line(true) took from `bin`
  // The next line of the stream into `line` (skipped when `keep` is false); false at its end.
  auto next_line = [&](bool keep) -> Result<bool> {
    while (cur.epoch < options_.epochs && !options_.files.empty()) {
      if (!in.is_open() && !bin) {
        const std::string& file = options_.files[cur.file];
        if (BinaryData::IsBinary(file)) {
          PARASOL_ASSIGN_OR_RETURN(bin, BinaryData::Open(file));
          if (options_.format != DataOptions::Format::kCriteo) {
            return InvalidArgument("data file '" + file + "' is binary Criteo data (parasol "
                                   "convert), and data.format is libsvm");
          }
          if (bin->has_label() != options_.has_label) {
            return InvalidArgument(
                "data file '" + file + "' is binary data " +
                (bin->has_label() ? "with labels, read here as a file without them"
                                  : "without labels, read here as a file with them"));
          }
        } else if (BinaryData::LooksBinary(file)) {
          return InvalidArgument("data file '" + file + "' is neither text nor binary data of "
                                 "`parasol convert` (a NUL byte in its first 64 bytes, and no "
                                 "PARASOLB magic): a damaged binary file?");
        } else {
          in.clear();
          in.open(file);
          if (!in) {
            return NotFound("cannot read data file '" + file + "': " + std::strerror(errno));
          }
          if (cur.offset > 0) in.seekg(cur.offset);
        }
      }
      const bool got = bin ? cur.line_no < bin->rows()
                           : (keep ? ReadRow(in, &line, &too_long) : SkipRow(in));
      if (got) {
        if (bin) bin_row = cur.line_no;
        ++cur.line_no;
        ++cur.pos;
        return true;
      }
      bin.reset();
      in.close();
      cur.offset = 0;
      cur.line_no = 0;
      if (++cur.file == options_.files.size()) {
        cur.file = 0;
        ++cur.epoch;
      }
    }
    return false;
  };
  // Where the next line is, to read on from there later.
  auto here = [&]() {
    Cursor c = cur;
    if (in.is_open()) {
      if (in.eof()) {  // the file's last line, without a newline, was read
        c.offset = 0;
        c.line_no = 0;
        if (++c.file == options_.files.size()) {
          c.file = 0;
          ++c.epoch;
        }
      } else {
        c.offset = static_cast<std::streamoff>(in.tellg());
      }
    }
    return c;
  };
  for (;; ++unit) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      cursors_[unit] = here();
      reading_unit_ = unit;
    }
    const auto step = static_cast<int64_t>(unit / per);
    const auto micro = static_cast<uint32_t>(unit % per);
    const StepChunk chunk = ChunkOf(membership, options_.rank, step, batch_size * per);
    if (chunk.index < 0) return Finish(Status::Ok());  // not present from this step on
    const uint64_t first = chunk.first + uint64_t{micro} * chunk.ranks * batch_size +
                           static_cast<uint64_t>(chunk.index);
    Batch batch = Fresh();
    batch.step = step;
    batch.micro = micro;
    bool ended = false;
    for (uint32_t r = 0; r < batch_size && !ended; ++r) {
      const uint64_t want = first + uint64_t{r} * chunk.ranks;
      while (cur.pos < want) {
        if ((cur.pos & 4095) == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) return;
        }
        Result<bool> skipped = next_line(false);
        if (!skipped.ok()) return Finish(skipped.status());
        if (!*skipped) {
          ended = true;
          break;
        }
      }
      if (ended) break;
      const uint32_t file = cur.file;
      Result<bool> got = next_line(true);
      if (!got.ok()) return Finish(got.status());
      if (!*got) {
        ended = true;
        break;
      }
      Status st;
      if (bin) {
        // Rows of a binary file were checked when it was written: a failure is a damaged file.
        st = bin->AppendRow(bin_row, &batch);
        if (!st.ok()) return Finish(st);
      } else if (too_long) {
        st = InvalidArgument("row longer than " + std::to_string(kMaxRowBytes) + " bytes");
      } else if (options_.format == DataOptions::Format::kCriteo) {
        st = ParseCriteoRow(line, options_.has_label, &batch);
      } else {
        st = ParseLibsvmRow(line, &batch);
      }
      if (st.ok()) batch.positions.push_back(cur.pos - 1);
      if (!st.ok()) {
        const std::string where =
            options_.files[file] + ":" + std::to_string(cur.line_no) + ": " + st.message();
        if (options_.on_bad_row == DataOptions::OnBadRow::kFail) {
          return Finish(InvalidArgument("malformed row at " + where +
                                        " (data.on_bad_row: fail)"));
        }
        ++batch.bad_rows;
        std::lock_guard<std::mutex> lock(mu_);
        if (first_bad_.empty()) first_bad_ = where;
      }
    }
    // A batch that the end of the data left empty is not a step; one that malformed rows left
    // empty is (the worker's place in the job's steps stays the same).
    if (batch.size > 0 || (!ended && batch.bad_rows > 0)) {
      if (!Emit(std::move(batch))) return;
    } else {
      Recycle(std::move(batch));
    }
    {
      // This unit is out: a Reposition reads on from the next one (never this one again).
      std::lock_guard<std::mutex> lock(mu_);
      cursors_[unit + 1] = here();
      reading_unit_ = unit + 1;
    }
    if (ended) return Finish(Status::Ok());
  }
}

void BatchReader::Reposition(const Membership& membership, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = false;
  const uint32_t per = std::max<uint32_t>(1, options_.batches_per_step);
  const uint64_t from_unit = static_cast<uint64_t>(std::max<int64_t>(0, step)) * per;
  // Batches of the steps from `step` on are read again; earlier ones stand.
  for (auto it = queue_.begin(); it != queue_.end();) {
    const uint64_t unit = static_cast<uint64_t>(it->step) * per + it->micro;
    if (unit < from_unit) {
      ++it;
      continue;
    }
    if (free_.size() < size_t{options_.queue_batches} + 4) free_.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  membership_ = membership;
  if (done_ && !status_.ok()) return;  // a read error stands
  const uint64_t from = std::min(from_unit, reading_unit_);
  const auto at = cursors_.find(from);
  if (at == cursors_.end()) {
    done_ = true;
    status_ = Internal("data reader: no position recorded for batch " + std::to_string(from));
    cv_.notify_all();
    return;
  }
  const Cursor cursor = at->second;
  cursors_.erase(std::next(at), cursors_.end());
  reading_unit_ = from;
  done_ = false;
  thread_ = std::thread([this, from, cursor] { Run(from, cursor); });
}

Result<std::optional<Batch>> BatchReader::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || done_; });
  if (!queue_.empty()) {
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    rows_ += b.size;
    bad_rows_ += b.bad_rows;
    // Positions before this batch are not needed again (Reposition reads on from later ones).
    const uint64_t unit =
        static_cast<uint64_t>(b.step) * std::max<uint32_t>(1, options_.batches_per_step) + b.micro;
    cursors_.erase(cursors_.begin(), cursors_.lower_bound(unit));
    cv_.notify_all();
    return std::optional<Batch>(std::move(b));
  }
  if (!status_.ok()) return status_;
  return std::optional<Batch>();
}

uint64_t BatchReader::bad_rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bad_rows_;
}

uint64_t BatchReader::rows_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rows_;
}

std::string BatchReader::first_bad_row() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_bad_;
}

Result<std::vector<Batch>> ReadAll(DataOptions::Format format, const std::string& file,
                                   uint32_t batch_size, bool has_label, uint64_t* bad_rows) {
  ReaderOptions o;
  o.format = format;
  o.files = {file};
  o.batch_size = batch_size;
  o.has_label = has_label;
  BatchReader reader(o);
  std::vector<Batch> out;
  while (true) {
    PARASOL_ASSIGN_OR_RETURN(std::optional<Batch> b, reader.Next());
    if (!b) break;
    out.push_back(std::move(*b));
  }
  if (bad_rows) *bad_rows = reader.bad_rows();
  return out;
}

}  // namespace parasol
