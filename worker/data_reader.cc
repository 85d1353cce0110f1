#include "worker/data_reader.hpp"

#include "worker/binary_data.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <system_error>

#include <spdlog/spdlog.h>

#include "common/cpu_affinity.hpp"
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

// One micro-batch on its way: the rows the reading thread took for it (text lines, not yet
// parsed; binary rows are appended to `batch` as they are read), then parsed, then handed out
// in the stream's order.
// The largest line buffer a unit keeps from one row to the next.
constexpr size_t kKeptLineBytes = size_t{1} << 20;

struct BatchReader::Unit {
  uint64_t unit = 0;
  Batch batch;
  size_t rows = 0;                   // text rows taken: lines[0 .. rows)
  std::vector<std::string> lines;    // buffers kept from unit to unit
  std::vector<uint64_t> pos;         // each row's stream position
  std::vector<uint32_t> file;        // its file
  std::vector<uint64_t> line_no;     // its line in the file (1-based)
  std::vector<uint8_t> too_long;     // longer than kMaxRowBytes
  bool ended = false;                // the data ended in (or before) this unit
  Status fatal;                      // a read error: the reader stops here
  Status fail;                       // a malformed row under on_bad_row: fail
  bool parsed = false;

  void Reset(uint64_t u, Batch b) {
    unit = u;
    batch = std::move(b);
    rows = 0;
    ended = false;
    fatal = Status::Ok();
    fail = Status::Ok();
    parsed = false;
  }
  void Take(std::string& line, uint64_t p, uint32_t f, uint64_t l, bool long_row) {
    if (rows == lines.size()) {
      lines.emplace_back();
      pos.push_back(0);
      file.push_back(0);
      line_no.push_back(0);
      too_long.push_back(0);
    }
    if (long_row) {
      // Never parsed: its text is not kept, nor the buffer that held it (up to kMaxRowBytes).
      lines[rows].clear();
      std::string().swap(line);
    } else {
      lines[rows].swap(line);  // the line's buffer goes to the unit, the unit's old one back
    }
    pos[rows] = p;
    file[rows] = f;
    line_no[rows] = l;
    too_long[rows] = long_row ? 1 : 0;
    ++rows;
  }
};

void BatchReader::ParseRows(Unit& u) const {
  const size_t rows = u.rows;
  u.rows = 0;
  for (size_t i = 0; i < rows && u.fail.ok(); ++i) {
    Status st;
    if (u.too_long[i]) {
      st = InvalidArgument("row longer than " + std::to_string(kMaxRowBytes) + " bytes");
    } else if (options_.format == DataOptions::Format::kCriteo) {
      st = ParseCriteoRow(u.lines[i], options_.has_label, &u.batch);
    } else {
      st = ParseLibsvmRow(u.lines[i], &u.batch);
    }
    // A slot keeps its buffer for the next unit's row, unless a long row made it large.
    if (u.lines[i].capacity() > kKeptLineBytes) std::string().swap(u.lines[i]);
    if (st.ok()) {
      u.batch.positions.push_back(u.pos[i]);
      continue;
    }
    const std::string where = options_.files[u.file[i]] + ":" + std::to_string(u.line_no[i]) +
                              ": " + st.message();
    if (options_.on_bad_row == DataOptions::OnBadRow::kFail) {
      u.fail = InvalidArgument("malformed row at " + where + " (data.on_bad_row: fail)");
      return;
    }
    ++u.batch.bad_rows;
    if (u.batch.first_bad.empty()) u.batch.first_bad = where;
  }
}

void BatchReader::ParseUnit(Unit& u, KeyIndex& dedup) const {
  ParseRows(u);
  if (u.fail.ok() && options_.deduplicate) {
    DeduplicateKeys(u.batch.keys, dedup, &u.batch.distinct);
  }
}

bool BatchReader::HandOut(Unit& u) {
  if (!u.fatal.ok()) {
    Finish(u.fatal);
    return false;
  }
  if (!u.fail.ok()) {
    Finish(u.fail);
    return false;
  }
  // A batch that the end of the data left empty is not a step; one that malformed rows left
  // empty is (the worker's place in the job's steps stays the same).
  if (u.batch.size > 0 || (!u.ended && u.batch.bad_rows > 0)) {
    if (!Emit(std::move(u.batch))) return false;
  } else {
    if (u.batch.bad_rows > 0) {  // the data's last rows, all malformed: still counted
      std::lock_guard<std::mutex> lock(mu_);
      bad_rows_ += u.batch.bad_rows;
      if (first_bad_.empty()) first_bad_ = u.batch.first_bad;
    }
    Recycle(std::move(u.batch));
  }
  {
    // This unit is out: a Reposition reads on from the next one (never this one again).
    std::lock_guard<std::mutex> lock(mu_);
    reading_unit_ = u.unit + 1;
  }
  if (u.ended) {
    Finish(Status::Ok());
    return false;
  }
  return true;
}

void BatchReader::Run(uint64_t unit, Cursor at) {
  // Started by the training thread, which may be kept to one core (worker.pin_compute_threads):
  // the reader and its parsing threads run on any of the process's cores.
  (void)UseProcessCores();
  Membership membership;
  {
    std::lock_guard<std::mutex> lock(mu_);
    membership = membership_;
    reading_unit_ = unit;
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

  // With data.reader_threads = N > 1, N threads parse text rows while this one reads on; the
  // units are handed out in order. At most N + 1 units are on their way.
  uint32_t parsers = options_.reader_threads > 1 ? options_.reader_threads : 0;
  std::mutex pmu;
  std::condition_variable pcv;
  std::deque<Unit*> todo;                      // guarded by pmu: units to parse
  std::deque<std::unique_ptr<Unit>> inflight;  // this thread's: units not handed out, in order
  std::vector<std::unique_ptr<Unit>> spare;    // this thread's: units to reuse
  bool pool_stop = false;                      // guarded by pmu
  std::vector<std::thread> pool;
  std::vector<KeyIndex> indexes(parsers);
  struct PoolStop {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::vector<std::thread>& threads;
    ~PoolStop() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (std::thread& t : threads) t.join();
    }
  } pool_stop_guard{pmu, pcv, pool_stop, pool};
  for (uint32_t i = 0; i < parsers; ++i) {
    try {
      pool.emplace_back([&, i] {
        while (true) {
          Unit* u = nullptr;
          {
            std::unique_lock<std::mutex> lock(pmu);
            pcv.wait(lock, [&] { return pool_stop || !todo.empty(); });
            if (pool_stop) return;
            u = todo.front();
            todo.pop_front();
          }
          ParseUnit(*u, indexes[i]);
          {
            std::lock_guard<std::mutex> lock(pmu);
            u->parsed = true;
          }
          pcv.notify_all();
        }
      });
    } catch (const std::system_error& e) {
      // No more threads to be had: parse with those that started (or on this thread).
      spdlog::warn("data reader: {} of {} parsing threads started ({}); reading on with them",
                   pool.size(), parsers, e.what());
      break;
    }
  }
  parsers = static_cast<uint32_t>(pool.size());
  // Hands out the oldest unit once it is parsed (waiting for it when `wait`); false when the
  // reader is done or stopping.
  auto hand_out_front = [&](bool wait) -> std::optional<bool> {
    Unit* front = inflight.front().get();
    {
      std::unique_lock<std::mutex> lock(pmu);
      if (!front->parsed && !wait) return std::nullopt;
      pcv.wait(lock, [&] { return front->parsed; });
    }
    const bool go_on = HandOut(*front);
    spare.push_back(std::move(inflight.front()));
    inflight.pop_front();
    return go_on;
  };
  // Queues `u` (parsed here when there are no other threads), and hands out what is ready.
  auto submit = [&](std::unique_ptr<Unit> u) -> bool {
    if (parsers == 0 || !u->fatal.ok()) {
      if (parsers == 0 && u->fatal.ok()) ParseUnit(*u, dedup_index_);
      u->parsed = true;
    } else {
      {
        std::lock_guard<std::mutex> lock(pmu);
        todo.push_back(u.get());
      }
      pcv.notify_all();
    }
    inflight.push_back(std::move(u));
    const bool last = !inflight.back()->fatal.ok() || inflight.back()->ended;
    while (!inflight.empty()) {
      const bool must = last || inflight.size() > parsers;
      std::optional<bool> r = hand_out_front(must);
      if (!r) break;
      if (!*r) return false;
    }
    return !last;
  };
  auto fresh_unit = [&](uint64_t u) {
    std::unique_ptr<Unit> unit_ptr;
    if (!spare.empty()) {
      unit_ptr = std::move(spare.back());
      spare.pop_back();
    } else {
      unit_ptr = std::make_unique<Unit>();
    }
    unit_ptr->Reset(u, Fresh());
    return unit_ptr;
  };

  for (;; ++unit) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      cursors_[unit] = here();
    }
    const auto step = static_cast<int64_t>(unit / per);
    const auto micro = static_cast<uint32_t>(unit % per);
    const StepChunk chunk = ChunkOf(membership, options_.rank, step, batch_size * per);
    if (chunk.index < 0) {  // not present from this step on: what was read goes out first
      while (!inflight.empty()) {
        if (!*hand_out_front(true)) return;
      }
      return Finish(Status::Ok());
    }
    const uint64_t first = chunk.first + uint64_t{micro} * chunk.ranks * batch_size +
                           static_cast<uint64_t>(chunk.index);
    std::unique_ptr<Unit> u = fresh_unit(unit);
    u->batch.step = step;
    u->batch.micro = micro;
    for (uint32_t r = 0; r < batch_size && !u->ended && u->fatal.ok() && u->fail.ok(); ++r) {
      const uint64_t want = first + uint64_t{r} * chunk.ranks;
      while (cur.pos < want) {
        if ((cur.pos & 4095) == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) return;
        }
        Result<bool> skipped = next_line(false);
        if (!skipped.ok()) {
          u->fatal = skipped.status();
          break;
        }
        if (!*skipped) {
          u->ended = true;
          break;
        }
      }
      if (u->ended || !u->fatal.ok()) break;
      const uint32_t file = cur.file;
      Result<bool> got = next_line(true);
      if (!got.ok()) {
        u->fatal = got.status();
        break;
      }
      if (!*got) {
        u->ended = true;
        break;
      }
      if (bin) {
        // The text rows before it in this unit (the end of a text file) go in first.
        if (u->rows > 0) {
          ParseRows(*u);
          if (!u->fail.ok()) break;
        }
        // Rows of a binary file were checked when it was written: a failure is a damaged file.
        Status st = bin->AppendRow(bin_row, &u->batch);
        if (!st.ok()) {
          u->fatal = st;
          break;
        }
        u->batch.positions.push_back(cur.pos - 1);
      } else {
        u->Take(line, cur.pos - 1, file, cur.line_no, too_long);
      }
    }
    {
      // Where the next unit begins (a Reposition may read on from there).
      std::lock_guard<std::mutex> lock(mu_);
      cursors_[unit + 1] = here();
    }
    if (!submit(std::move(u))) return;
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
    if (first_bad_.empty() && !b.first_bad.empty()) first_bad_ = b.first_bad;
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
