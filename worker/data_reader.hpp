// Readers of Criteo TSV and libsvm data, and the thread that turns a worker's share of the
// input into batches ahead of the trainer.
//
// Criteo: label, 13 integer and 26 categorical fields, tab separated, empty fields allowed, no
// header. Categorical values become keys by hashing (field index, value string); an empty field
// becomes that field's "missing" key. Integers x become log(1 + max(x, 0)); empty -> 0.
// libsvm: `label index:value ...`; label 0/1 (or -1/+1); each index becomes a key with its value.
// The workers split the lines by the job's membership (common/membership.hpp): the lines of every
// epoch's files, one after another, form one stream; each step takes the next chunk of n x
// batch_size lines for the n workers present, and the i-th of them takes lines i, i + n, ... of
// it. So every line is trained once per epoch whatever the membership does, and with W workers
// throughout, worker r takes the lines r modulo W. A malformed line leaves its batch one short.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <istream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/manifest.hpp"
#include "common/membership.hpp"
#include "common/status.hpp"
#include "worker/batch.hpp"

namespace parasol {

// The key of categorical value `value` in field `field` (0-based); empty -> the missing key.
uint64_t CriteoKey(uint32_t field, std::string_view value);
// The key of libsvm feature `index`.
uint64_t LibsvmKey(uint64_t index);

// The longest row a data file may have. A longer line is a malformed row (skipped or failed
// as data.on_bad_row says), not a string as large as the rest of the file.
inline constexpr size_t kMaxRowBytes = size_t{16} << 20;

// Reads the next line of `in` (its '\n' removed) into *line; false at the end of the input. A
// line of more than `max_bytes` bytes is read to its end but kept only up to `max_bytes`, and
// *too_long is set.
bool ReadRow(std::istream& in, std::string* line, bool* too_long, size_t max_bytes = kMaxRowBytes);

// Appends one parsed row to `batch`, or returns why the row is malformed (and leaves the batch
// as it was). `has_label`: 40 fields (train) or 39 (Criteo's unlabeled test file, label 0).
Status ParseCriteoRow(std::string_view line, bool has_label, Batch* batch);
Status ParseLibsvmRow(std::string_view line, Batch* batch);

struct ReaderOptions {
  DataOptions::Format format = DataOptions::Format::kCriteo;
  std::vector<std::string> files;
  uint32_t batch_size = 256;
  uint32_t epochs = 1;
  uint32_t rank = 0;     // this worker's share ...
  uint32_t workers = 1;  // ... of this many (when `membership` names no ranks)
  // Who trains at which step; default: `workers` ranks throughout.
  Membership membership;
  // The first step to read (a restarted worker's clock, or a joining one's), and the batches of
  // each step (training.accumulate: each step's chunk is cut into that many micro-batches).
  int64_t start_step = 0;
  uint32_t batches_per_step = 1;
  DataOptions::OnBadRow on_bad_row = DataOptions::OnBadRow::kSkip;
  uint32_t queue_batches = 8;
  bool has_label = true;
  // Each batch's keys deduplicated into Batch::distinct on the reader's thread, off the
  // consumer's.
  bool deduplicate = false;
  // Threads that parse text rows (data.reader_threads): with more than one, one thread reads
  // the lines and these parse whole batches at once; the batches come out in the same order
  // and with the same contents whatever the count.
  uint32_t reader_threads = 1;
};

// Reads on a thread of its own and hands out full batches (the last of an epoch may be short).
// Thread-safety: Next() from one consumer thread.
class BatchReader {
 public:
  explicit BatchReader(ReaderOptions options);
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // The next batch; an empty optional at the end of the last epoch; an error for a file that
  // cannot be read, or a malformed row under on_bad_row: fail (naming file and line).
  Result<std::optional<Batch>> Next();
  // Gives a consumed batch back: its buffers are filled again by a later batch, so a steady
  // consumer that recycles what it takes causes no allocation. Optional.
  void Recycle(Batch batch);

  // The membership changed (a newer copy): the batches of steps from `step` on are read again
  // for it; those of earlier steps stand. REQUIRES: no batch of `step` or later was taken yet.
  void Reposition(const Membership& membership, int64_t step);

  uint64_t bad_rows() const;
  uint64_t rows_read() const;
  // "file:line: why" of the first malformed row of the batches taken (Next), or "".
  std::string first_bad_row() const;

 private:
  // Where the stream was when the thread began a micro-batch: enough to read on from there.
  struct Cursor {
    uint32_t epoch = 0;
    uint32_t file = 0;
    std::streamoff offset = 0;  // in the file
    uint64_t line_no = 0;       // lines of the file before `offset`
    uint64_t pos = 0;           // stream position
  };
  struct Unit;
  // Reads micro-batches from unit `unit` (step x batches_per_step + micro) on, from `at`.
  void Run(uint64_t unit, Cursor at);
  // Parses a unit's text rows taken so far into its batch (they are then gone from the unit).
  void ParseRows(Unit& u) const;
  // Parses a unit's text rows into its batch, and deduplicates its keys with `dedup`.
  void ParseUnit(Unit& u, KeyIndex& dedup) const;
  // Hands a parsed unit out (or ends the reader with its error); false when the reader is done
  // or stopping.
  bool HandOut(Unit& u);
  // False when the reader is stopping.
  bool Emit(Batch batch);
  // An empty batch: a recycled one (its buffers kept) or a new one.
  Batch Fresh();
  void Finish(Status status);

  const ReaderOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;      // guarded by mu_
  std::vector<Batch> free_;      // guarded by mu_: recycled, at most queue_batches + 4
  bool done_ = false;            // guarded by mu_
  Membership membership_;        // guarded by mu_ (the thread reads a copy)
  // Guarded by mu_: where each micro-batch from the oldest one not taken began, and the first
  // unit the thread has not handed out (or dropped as empty).
  std::map<uint64_t, Cursor> cursors_;
  uint64_t reading_unit_ = 0;
  bool stopping_ = false;        // guarded by mu_
  Status status_;                // guarded by mu_
  uint64_t bad_rows_ = 0;        // guarded by mu_
  uint64_t rows_ = 0;            // guarded by mu_
  std::string first_bad_;        // guarded by mu_
  KeyIndex dedup_index_;         // the reader thread's (with one reader thread)
  std::thread thread_;
};

// Reads every row of `file` (no sharding) into batches of `batch_size`: for evaluation.
Result<std::vector<Batch>> ReadAll(DataOptions::Format format, const std::string& file,
                                   uint32_t batch_size, bool has_label, uint64_t* bad_rows);

}  // namespace parasol
