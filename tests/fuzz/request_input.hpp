// The input format of the request-path fuzzer (request_fuzzer.cc), shared with the program that
// writes its seed corpus (request_seeds.cc).
//
// Byte 0 picks the job (JobSpecOf): consistency mode, shard layout, workers, what a silent
// worker means, engine threads. The rest is read with FuzzedDataProvider as a sequence of
// steps: a message to the shard, the serve loop's timed work, a stats call, a restart from the
// checkpoints, damage to the newest checkpoint, a pause, a message of raw frames, or a Step
// message of up to four messages.
//
// A step holds decisions, not bytes: "the worker's clock", "the next sequence number", "as many
// frames as the header implies". The fuzzer resolves them against what it knows of the session
// (clocks, sequence numbers, barrier ids, the tables' dims and slices), so most messages are
// near what a real client sends, and a few bytes of input reach deep into a handler. Each
// decision has a few values that mean "as a client would" and a few that mean "something
// else": an out-of-job worker, an extreme clock, a header field set to 2^64-1, a frame short by
// some bytes.
//
// VisitStep() is the grammar, written once: with StepReader it reads a step, with StepWriter it
// writes the bytes from which StepReader reads that step back. StepWriter knows how
// FuzzedDataProvider consumes its input: integers from the end (first byte consumed = most
// significant), byte strings from the front.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

namespace parasol::fuzz {

// --- The job -------------------------------------------------------------------------------

struct JobSpec {
  enum class Mode { kBsp, kSsp1, kSsp2, kAsp };
  enum class Loss { kNever, kFail, kContinue };  // kFail, kContinue: worker_timeout is 1 ms
  Mode mode = Mode::kBsp;
  uint32_t shards = 1;
  uint32_t rank = 0;
  uint32_t workers = 2;
  Loss loss = Loss::kNever;
  uint32_t engines = 2;
  uint32_t initial = 1;  // shards holding keys at the start (cluster.initial_servers)
};

// bits 0-1: mode; 2-3: 1 of 1, rank 0 of 2, rank 1 of 2, rank 0 of 3 listed with 2 holding keys
// (the shard count may change); 4: 2 or 3 workers;
// 5-6: no loss, no loss, loss fails the job, loss drops the worker; 7: 2 or 1 engine threads.
inline JobSpec JobSpecOf(uint8_t b) {
  JobSpec s;
  s.mode = static_cast<JobSpec::Mode>(b & 3);
  const uint32_t layout = (b >> 2) & 3;
  s.shards = layout == 0 ? 1 : (layout == 3 ? 3 : 2);
  s.initial = layout == 0 ? 1 : 2;
  s.rank = layout == 2 ? 1 : 0;
  s.workers = (b >> 4) & 1 ? 3 : 2;
  const uint32_t loss = (b >> 5) & 3;
  s.loss = loss < 2 ? JobSpec::Loss::kNever
                    : (loss == 2 ? JobSpec::Loss::kFail : JobSpec::Loss::kContinue);
  s.engines = (b >> 7) & 1 ? 1 : 2;
  return s;
}

inline uint8_t ConfigByte(JobSpec::Mode mode, uint32_t layout, uint32_t workers) {
  return static_cast<uint8_t>(static_cast<uint32_t>(mode) | (layout << 2) |
                              ((workers == 3 ? 1u : 0u) << 4));
}

// The tables of every fuzzed job, in manifest order (table id = position).
enum FuzzTable : uint32_t {
  kSparseSgd,      // dim 1, uniform init, eviction max_rows 16
  kSparseAdagrad,  // dim 3
  kSparseRowwise,  // dim 4, adagrad_rowwise
  kSparseAdam,     // dim 8, normal init
  kSparseFtrl,     // dim 4, admission min_count 2, eviction ttl_clocks 2 and max_rows 8,
                   // tiered with one engine thread (a budget of a few rows: rows cross to
                   // disk and back)
  kDenseSgd,       // [10]
  kDenseAdagrad,   // [4, 6]
  kDenseAdam,      // [40, 40]: many frames
  kDenseFtrl,      // [3, 5, 7]
  kTableCount
};

inline const char* const kTablesYaml =
    "tables:\n"
    "  - {name: s_sgd, kind: sparse, dim: 1, optimizer: {kind: sgd, lr: 0.5},\n"
    "     eviction: {max_rows: 16}}\n"
    "  - {name: s_adagrad, kind: sparse, dim: 3, init: {kind: zeros},\n"
    "     optimizer: {kind: adagrad, lr: 0.1, initial_accumulator: 0.1}}\n"
    "  - {name: s_rowwise, kind: sparse, dim: 4, init: {kind: constant, value: 1.0},\n"
    "     optimizer: {kind: adagrad_rowwise, lr: 0.1, weight_decay: 0.01}}\n"
    "  - {name: s_adam, kind: sparse, dim: 8, init: {kind: normal, stddev: 0.1},\n"
    "     optimizer: {kind: adam, lr: 0.01, weight_decay: 0.001},\n"
    "     dtype: f16, state_dtype: bf16}\n"
    "  - {name: s_ftrl, kind: sparse, dim: 4, optimizer: {kind: ftrl, l1: 0.1, l2: 0.1},\n"
    "     admission: {min_count: 2}, eviction: {ttl_clocks: 2, max_rows: 8}, storage: %s}\n"
    "  - {name: d_sgd, kind: dense, shape: [10], optimizer: {kind: sgd}}\n"
    "  - {name: d_adagrad, kind: dense, shape: [4, 6], init: {kind: zeros},\n"
    "     optimizer: {kind: adagrad}, dtype: bf16}\n"
    "  - {name: d_adam, kind: dense, shape: [40, 40], optimizer: {kind: adam, bias_correction: "
    "false}}\n"
    "  - {name: d_ftrl, kind: dense, shape: [3, 5, 7], init: {kind: constant, value: 0.5},\n"
    "     optimizer: {kind: ftrl, l1: 0.01}, dtype: f16, state_dtype: bf16,\n"
    "     rounding: stochastic}\n";

// The manifest of job `s`, with checkpoints (and the disk tier) in `checkpoint_dir`.
inline std::string ManifestText(const JobSpec& s, const std::string& checkpoint_dir) {
  // ssp with staleness 2 prefetches two steps ahead: requests up to 2 clocks past the sender's.
  static const char* const kModes[] = {"consistency: bsp", "consistency: ssp, staleness: 1",
                                       "consistency: ssp, staleness: 2, prefetch_depth: 2",
                                       "consistency: asp"};
  std::string y = "job: {name: fuzz, seed: 7}\ncluster:\n  servers: [127.0.0.1:1";
  for (uint32_t r = 1; r < s.shards; ++r) y += ", 127.0.0.1:" + std::to_string(r + 1);
  y += "]\n  workers: " + std::to_string(s.workers) + "\n";
  if (s.initial < s.shards) y += "  initial_servers: " + std::to_string(s.initial) + "\n";
  // Two ranks more may join the running job (Op::Membership, Hello with join).
  y += "  max_workers: " + std::to_string(s.workers + 2) + "\n";
  // Limits small enough that a few messages reach them.
  y += "server: {engine_threads: " + std::to_string(s.engines) +
       ", max_request_bytes: 1MiB, frame_bytes: 4096, max_held_pulls: 8, max_held_bytes: 64KiB,"
       " max_pending_clocks: 3, max_pending_bytes: 256KiB, memory_budget: 1KiB,"
       " disk_dir: '" + checkpoint_dir + "/disk'}\n";
  y += "training: {" + std::string(kModes[static_cast<int>(s.mode)]);
  if (s.loss == JobSpec::Loss::kNever) {
    y += ", worker_timeout: 1h}\n";
  } else {
    y += std::string(", worker_timeout: 1ms, on_worker_loss: ") +
         (s.loss == JobSpec::Loss::kFail ? "fail" : "continue") + "}\n";
  }
  // Written in the foreground: the fuzzer takes every answer at once, and polls for none.
  y += "checkpoint: {dir: '" + checkpoint_dir + "', keep: 2, every_steps: 2, background: false}\n";
  // s_ftrl is tiered in the jobs with one engine thread: opening the disk tier (RocksDB) for
  // every input would slow the other half down sevenfold.
  std::string tables = kTablesYaml;
  tables.replace(tables.find("%s"), 2, s.engines == 1 ? "tiered" : "memory");
  return y + tables;
}

// --- The steps -----------------------------------------------------------------------------

// A 64-bit header field chosen among the values that break arithmetic.
struct Special {
  uint8_t kind = 0;  // [0, 11]: 0, 1, 2, raw u8, raw u16, 2^32-1, 2^32, 2^61, 2^63, 2^64-1,
                     // 2^64-2, raw u64
  uint64_t raw = 0;
  bool operator==(const Special&) const = default;
  uint64_t Value() const {
    static constexpr uint64_t kFixed[] = {
        0, 1, 2, 0, 0, 0xffffffffull, 1ull << 32, 1ull << 61, 1ull << 63, ~0ull, ~0ull - 1, 0};
    return kind == 3 || kind == 4 || kind == 11 ? raw : kFixed[kind % 12];
  }
};

// key_count, value_dim, offset, value_frames and rows_per_frame.
struct Shape {
  uint8_t mode = 0;  // [0, 7]: 0-4 as a client, 5-6 as a client but one field, 7 all fuzzed
  uint8_t rows = 0;  // 255: rows_raw
  uint32_t rows_raw = 0;
  uint16_t offset = 0;  // dense: the first element, modulo the slice
  uint8_t field = 0;    // mode 5-6: which field (0-4 as above, 5 dtype)
  Special value;
  std::vector<Special> fields;  // mode 7: all six
  bool operator==(const Shape&) const = default;
};

struct Keys {
  uint8_t mode = 0;   // [0, 2]: 0 a small key space (bytes % 48), 1 base + i * stride, 2 raw
  std::string bytes;  // 0 and 2, cycled
  uint8_t base = 0;
  uint8_t stride = 1;  // [0, 4]
  bool operator==(const Keys&) const = default;
};

struct Values {
  uint8_t mode = 0;     // [0, 3]: 0 one value, 1 a value per byte, 2 raw bytes, 3 a ramp
  uint8_t special = 0;  // [0, 15]: see SpecialFloat(); 0-10 ordinary
  std::string bytes;
  bool operator==(const Values&) const = default;
};

// The payload frames.
struct Frames {
  uint8_t mode = 0;  // [0, 7]: 0-5 as the header implies, 6 one edit, 7 arbitrary sizes
  uint8_t edit = 0;  // [0, 3]: drop the last frame, add one, resize one, swap the first two
  uint8_t at = 0;
  int16_t delta = 0;            // [-64, 64]: the resize; the added frame's size when positive
  std::vector<uint16_t> sizes;  // mode 7: [0, 6] frames of [0, 1024] bytes
  bool operator==(const Frames&) const = default;
};

enum class StepKind { kMessage, kPeriodic, kStats, kRestart, kDamage, kPause, kRaw, kStep };

struct Step {
  uint8_t kind = 0;  // [0, 31]: see KindOf()

  // A message.
  uint8_t op = 0;       // [0, 15]: see OpByte()
  uint8_t raw_op = 11;  // op 15: a byte past Op::MAX
  uint8_t peer = 0;     // [0, 3]: the identity it comes from
  uint8_t worker = 0;   // [0, 7]: 0-4 a worker of the job, 5 the first one past it,
                        //         6 2^32-1, 7 worker_raw
  uint32_t worker_raw = 0;
  uint8_t anomaly = 0;  // [0, 15]: 0-10 none, 11 is_reply, 12 a status, 13 a version,
                        //          14 a message text, 15 a dtype
  uint8_t anomaly_value = 0;
  std::string text;
  uint8_t hello = 0;        // Hello [0, 7]: 7 a wrong manifest hash
  uint8_t seq = 0;          // pushes [0, 3]: 0-1 the next, 2 the last again, 3 seq_raw
  uint8_t seq_raw = 0;      // [0, 15]
  uint8_t incarnation = 0;  // [0, 7]: 0-5 one, 6 another, 7 zero
  uint8_t table = 0;        // [0, 15]: past the tables: that id; 15: table_raw
  uint32_t table_raw = 0;
  uint8_t clock = 0;  // [0, 7]: see ResolveClock() in the fuzzer
  uint8_t clock_small = 0;
  uint8_t clock_extreme = 0;  // [0, 7]
  int64_t clock_raw = 0;
  uint8_t with_state = 0;  // pulls and pushes [0, 3]: 3 with state
  uint8_t done = 0;        // Clock [0, 7]: 7 done; 4-6: the tick names 1-3 pushes (key_count)
  uint8_t barrier = 0;     // Barrier [0, 3]: 0 the current id, 1 the next, 2 the last, 3 raw
  Special barrier_raw;
  Shape shape;
  Keys keys;
  Values values;
  Frames frames;

  // Damage to the newest checkpoint.
  uint8_t damage = 0;  // [0, 2]: flip a byte, truncate, put a file where the shard's folder is
  uint32_t damage_at = 0;
  uint8_t damage_xor = 1;

  // Raw frames after the identity.
  std::vector<std::string> raw_frames;  // [0, 5] frames of [0, 512] bytes

  // A Step message: its parts are messages built as above.
  uint8_t step_mode = 0;  // [0, 3]: 0-2 the parts take the first part's worker, incarnation
                          //         and clock (as a client sends them), 3 as built
  std::vector<Step> parts;  // [1, 4]

  bool operator==(const Step&) const = default;

  StepKind Kind() const {
    if (kind <= 20) return StepKind::kMessage;
    if (kind <= 23) return StepKind::kPeriodic;
    if (kind <= 25) return StepKind::kStats;
    if (kind == 26) return StepKind::kRestart;
    if (kind == 27) return StepKind::kDamage;
    if (kind == 28) return StepKind::kPause;
    if (kind == 30) return StepKind::kStep;
    return StepKind::kRaw;
  }
  // The op byte: Hello, PullSparse, PushSparse, PullDense, PushDense, Clock, Barrier, Stats,
  // Shutdown, Error, Checkpoint, then again PullSparse, Membership, Migrate, PushDense, raw_op
  // (Step is raw_op 11).
  uint8_t OpByte() const {
    static constexpr uint8_t kOps[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 12, 13, 4};
    return op < 15 ? kOps[op] : raw_op;
  }
};

// Some floats: 0-10 ordinary, then 1e30, FLT_MAX, NaN, Inf, a denormal.
inline float SpecialFloat(uint8_t i) {
  constexpr float kNaN = __builtin_nanf(""), kInf = __builtin_inff();
  static constexpr float kValues[] = {0.0f,          1.0f,  -1.0f, 0.5f,  0.01f, -0.01f,
                                      3.0f,          -2.5f, 1e-3f, 100.f, -0.0f, 1e30f,
                                      3.4028235e38f, kNaN,  kInf,  1e-40f};
  return kValues[i & 15];
}

// Reads decisions from a FuzzedDataProvider.
class StepReader {
 public:
  explicit StepReader(FuzzedDataProvider& in) : in_(in) {}
  template <typename T>
  void Int(T min, T max, T& v) {
    v = in_.ConsumeIntegralInRange<T>(min, max);
  }
  void Bytes(uint16_t max_len, std::string& s) {
    uint16_t n = 0;
    Int<uint16_t>(0, max_len, n);
    s = in_.ConsumeBytesAsString(n);
  }

 private:
  FuzzedDataProvider& in_;
};

// Writes the bytes from which StepReader reads the same decisions back.
class StepWriter {
 public:
  template <typename T>
  void Int(T min, T max, T& v) {
    const uint64_t range = static_cast<uint64_t>(max) - static_cast<uint64_t>(min);
    const uint64_t r = static_cast<uint64_t>(v) - static_cast<uint64_t>(min);
    int n = 0;
    for (size_t offset = 0; offset < sizeof(T) * 8 && (range >> offset) > 0; offset += 8) ++n;
    for (int i = n - 1; i >= 0; --i) back_.push_back(static_cast<char>(r >> (8 * i)));
  }
  void Bytes(uint16_t max_len, std::string& s) {
    uint16_t n = static_cast<uint16_t>(std::min<size_t>(s.size(), max_len));
    Int<uint16_t>(0, max_len, n);
    front_ += s.substr(0, n);
  }
  std::string Finish() const { return front_ + std::string(back_.rbegin(), back_.rend()); }

 private:
  std::string front_;
  std::string back_;  // in the order FuzzedDataProvider consumes it
};

template <typename IO>
void VisitSpecial(IO& io, Special& s) {
  io.template Int<uint8_t>(0, 11, s.kind);
  if (s.kind == 3) {
    uint8_t v = static_cast<uint8_t>(s.raw);
    io.template Int<uint8_t>(0, 255, v);
    s.raw = v;
  } else if (s.kind == 4) {
    uint16_t v = static_cast<uint16_t>(s.raw);
    io.template Int<uint16_t>(0, 65535, v);
    s.raw = v;
  } else if (s.kind == 11) {
    io.template Int<uint64_t>(0, ~0ull, s.raw);
  }
}

template <typename IO>
void VisitShape(IO& io, Shape& s) {
  io.template Int<uint8_t>(0, 7, s.mode);
  if (s.mode == 7) {
    s.fields.resize(6);
    for (Special& f : s.fields) VisitSpecial(io, f);
    return;
  }
  io.template Int<uint8_t>(0, 255, s.rows);
  if (s.rows == 255) io.template Int<uint32_t>(0, 1u << 20, s.rows_raw);
  io.template Int<uint16_t>(0, 65535, s.offset);
  if (s.mode >= 5) {
    io.template Int<uint8_t>(0, 5, s.field);
    VisitSpecial(io, s.value);
  }
}

template <typename IO>
void VisitPayload(IO& io, Step& s) {
  io.template Int<uint8_t>(0, 2, s.keys.mode);
  if (s.keys.mode == 1) {
    io.template Int<uint8_t>(0, 255, s.keys.base);
    io.template Int<uint8_t>(0, 4, s.keys.stride);
  } else {
    io.Bytes(s.keys.mode == 0 ? 1024 : 2048, s.keys.bytes);
  }
  io.template Int<uint8_t>(0, 3, s.values.mode);
  if (s.values.mode == 0 || s.values.mode == 3) {
    io.template Int<uint8_t>(0, 15, s.values.special);
  } else {
    io.Bytes(4096, s.values.bytes);
  }
  Frames& f = s.frames;
  io.template Int<uint8_t>(0, 7, f.mode);
  if (f.mode == 6) {
    io.template Int<uint8_t>(0, 3, f.edit);
    io.template Int<uint8_t>(0, 255, f.at);
    io.template Int<int16_t>(-64, 64, f.delta);
  } else if (f.mode == 7) {
    uint8_t n = static_cast<uint8_t>(f.sizes.size());
    io.template Int<uint8_t>(0, 6, n);
    f.sizes.resize(n);
    for (uint16_t& size : f.sizes) io.template Int<uint16_t>(0, 1024, size);
  }
}

template <typename IO>
void VisitMessage(IO& io, Step& s) {
  io.template Int<uint8_t>(0, 15, s.op);
  if (s.op == 15) io.template Int<uint8_t>(11, 255, s.raw_op);
  io.template Int<uint8_t>(0, 3, s.peer);
  io.template Int<uint8_t>(0, 7, s.worker);
  if (s.worker == 7) io.template Int<uint32_t>(0, ~0u, s.worker_raw);
  io.template Int<uint8_t>(0, 15, s.anomaly);
  if (s.anomaly == 14) {
    io.Bytes(64, s.text);
  } else if (s.anomaly >= 11) {
    io.template Int<uint8_t>(0, 255, s.anomaly_value);
  }
  switch (s.OpByte()) {
    case 0:  // Hello
      io.template Int<uint8_t>(0, 7, s.hello);
      break;
    case 1:  // PullSparse
    case 2:  // PushSparse
    case 3:  // PullDense
    case 4:  // PushDense
      if (s.OpByte() == 2 || s.OpByte() == 4) {
        io.template Int<uint8_t>(0, 3, s.seq);
        if (s.seq == 3) io.template Int<uint8_t>(0, 15, s.seq_raw);
        io.template Int<uint8_t>(0, 7, s.incarnation);
      }
      io.template Int<uint8_t>(0, 15, s.table);
      if (s.table == 15) io.template Int<uint32_t>(0, ~0u, s.table_raw);
      [[fallthrough]];
    case 5:  // Clock
      io.template Int<uint8_t>(0, 7, s.clock);
      if (s.clock == 6) io.template Int<uint8_t>(0, 15, s.clock_small);
      if (s.clock == 7) {
        io.template Int<uint8_t>(0, 7, s.clock_extreme);
        if (s.clock_extreme == 7) {
          io.template Int<int64_t>(INT64_MIN, INT64_MAX, s.clock_raw);
        }
      }
      if (s.OpByte() == 5) {
        io.template Int<uint8_t>(0, 7, s.done);
        break;
      }
      io.template Int<uint8_t>(0, 3, s.with_state);
      VisitShape(io, s.shape);
      VisitPayload(io, s);
      break;
    case 12:  // Membership: join (hello), leave (done), a worker count (seq_raw) or a shard
              // count (seq)
      io.template Int<uint8_t>(0, 7, s.hello);
      io.template Int<uint8_t>(0, 7, s.done);
      io.template Int<uint8_t>(0, 3, s.seq);
      io.template Int<uint8_t>(0, 15, s.seq_raw);
      break;
    case 13:  // Migrate: the step (seq), the shard count (done), the change's clock (clock),
              // the rows (shape, payload), a clock since (incarnation)
      io.template Int<uint8_t>(0, 3, s.seq);
      io.template Int<uint8_t>(0, 7, s.done);
      io.template Int<uint8_t>(0, 7, s.incarnation);
      io.template Int<uint8_t>(0, 15, s.table);
      if (s.table == 15) io.template Int<uint32_t>(0, ~0u, s.table_raw);
      io.template Int<uint8_t>(0, 7, s.clock);
      if (s.clock == 6) io.template Int<uint8_t>(0, 15, s.clock_small);
      if (s.clock == 7) {
        io.template Int<uint8_t>(0, 7, s.clock_extreme);
        if (s.clock_extreme == 7) io.template Int<int64_t>(INT64_MIN, INT64_MAX, s.clock_raw);
      }
      VisitShape(io, s.shape);
      VisitPayload(io, s);
      break;
    case 6:  // Barrier
      io.template Int<uint8_t>(0, 3, s.barrier);
      if (s.barrier == 3) VisitSpecial(io, s.barrier_raw);
      break;
    default:
      break;
  }
}

template <typename IO>
void VisitStep(IO& io, Step& s) {
  io.template Int<uint8_t>(0, 31, s.kind);
  switch (s.Kind()) {
    case StepKind::kMessage:
      VisitMessage(io, s);
      break;
    case StepKind::kDamage:
      io.template Int<uint8_t>(0, 2, s.damage);
      io.template Int<uint32_t>(0, ~0u, s.damage_at);
      io.template Int<uint8_t>(1, 255, s.damage_xor);
      break;
    case StepKind::kRaw: {
      uint8_t n = static_cast<uint8_t>(s.raw_frames.size());
      io.template Int<uint8_t>(0, 5, n);
      s.raw_frames.resize(n);
      for (std::string& f : s.raw_frames) io.Bytes(512, f);
      break;
    }
    case StepKind::kStep: {
      uint8_t n = static_cast<uint8_t>(s.parts.size());
      io.template Int<uint8_t>(1, 4, n);
      io.template Int<uint8_t>(0, 3, s.step_mode);
      s.parts.resize(n);
      for (Step& part : s.parts) VisitMessage(io, part);
      break;
    }
    default:
      break;
  }
}

}  // namespace parasol::fuzz
