// libFuzzer target for the whole request path of one shard: an in-process ShardServer (no
// socket) is fed a session of messages built from the input (request_input.hpp says how), with
// the serve loop's timed work, checkpoints, restarts from them and damage to them in between.
// Every reply goes through a sink and is checked:
//   - it decodes, is a reply, goes to the identity its request came from, answers a request
//     that was sent, and no request is answered twice;
//   - an error reply carries no payload, nor does an OK reply to anything but a pull;
//   - an OK pull reply's payload passes PayloadView::Parse (with the limit a worker uses), has
//     the request's row count (and dim, or offset), and is read in full;
//   - under BSP and SSP, without lost workers, an OK pull by a worker of the job at clock c
//     comes only once every worker not done has had a clock of at least c (c - staleness)
//     accepted;
//   - every request but a pull (held for the read bound) and a barrier is answered at once,
//     and a message the shard cannot read gets exactly one Error reply;
//   - StatsJson()'s held_pulls are the pulls sent to this shard and not answered yet;
//   - the Stats reply and StatsJson() are well-formed JSON.
// A failed check prints what failed and traps, so libFuzzer keeps the input.
#include <fuzzer/FuzzedDataProvider.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <zmq.hpp>

#include "common/manifest.hpp"
#include "common/sharding.hpp"
#include "common/wire.hpp"
#include "server/checkpoint.hpp"
#include "server/optimizer.hpp"
#include "server/shard_server.hpp"
#include "tests/fuzz/request_input.hpp"

#define FUZZ_CHECK(cond)                                                                    \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "request_fuzzer: %s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                  \
      __builtin_trap();                                                                     \
    }                                                                                       \
  } while (0)

namespace parasol::fuzz {
namespace {

constexpr int kMaxSteps = 512;
constexpr int kMaxPauses = 2;
// Request ids the fuzzer gives its messages; a raw message may carry any other.
constexpr uint64_t kIdBase = uint64_t{1} << 62;
// What the fuzzer builds of one message's payload, whatever its header claims: just over the
// jobs' server.max_request_bytes (1 MiB), so the limit is crossed but no time is wasted past it.
constexpr uint64_t kMaxPayloadBytes = (uint64_t{1} << 20) + 64;
constexpr uint32_t kMaxValueFrames = 4096;
// Values travel in frames of this many bytes, below the manifest's minimum (4096) so that
// small inputs make multi-frame values. A row larger than a frame is legal anyway (dim may be
// up to 65536), so the shard meets nothing it could not meet in a real job.
constexpr uint64_t kFrameBytes = 256;

// --- The job -------------------------------------------------------------------------------

struct TableInfo {
  bool sparse = false;
  uint32_t dim = 4;         // sparse
  uint32_t row_floats = 4;  // sparse: values and optimizer state
  SliceRange slice{0, 16};  // dense: this shard's at the start
  uint32_t dense_floats = 1;  // dense: an element's value and optimizer state
};

struct Job {
  JobSpec spec;
  Manifest manifest;
  uint64_t fingerprint = 0;
  std::vector<TableInfo> tables;
};

const std::string& CheckpointDir() {
  static const std::string dir = [] {
    // On tmpfs where there is one: a checkpoint fsyncs its file and its folder, which on a
    // disk would cost more than the rest of an input.
    std::error_code ec;
    const std::filesystem::path base = ::access("/dev/shm", W_OK) == 0
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path(ec);
    std::string tmpl = (base / "parasol-fuzz-request-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      std::perror("request_fuzzer: mkdtemp");
      std::abort();
    }
    return tmpl;
  }();
  return dir;
}

// Registered after CheckpointDir() has made the folder, so it runs before the name is destroyed.
void RemoveCheckpointDir() {
  std::error_code ec;
  std::filesystem::remove_all(CheckpointDir(), ec);
}

// Every input starts with no checkpoint.
void WipeCheckpoints() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(CheckpointDir(), ec)) {
    std::filesystem::remove_all(e.path(), ec);
  }
}

const Job& JobFor(uint8_t config) {
  static std::array<std::unique_ptr<Job>, 256> jobs;
  std::unique_ptr<Job>& job = jobs[config];
  if (job) return *job;
  job = std::make_unique<Job>();
  job->spec = JobSpecOf(config);
  Result<Manifest> m = ParseManifest(ManifestText(job->spec, CheckpointDir()), "fuzz");
  if (!m.ok()) {
    std::fprintf(stderr, "request_fuzzer: the job's manifest does not parse: %s\n",
                 m.status().ToString().c_str());
    std::abort();
  }
  job->manifest = std::move(*m);
  job->manifest.server.frame_bytes = kFrameBytes;
  job->fingerprint = job->manifest.Fingerprint();
  for (const TableOptions& t : job->manifest.tables) {
    TableInfo info;
    const Optimizer opt(t.optimizer);
    if (t.kind == TableKind::kSparse) {
      info.sparse = true;
      info.dim = t.dim;
      info.row_floats = t.dim + opt.SparseStateFloats(t.dim);
    } else {
      info.slice = Placement(job->manifest.cluster.InitialServers())
                       .DenseSliceOf(t.NumElements(), job->spec.rank);
      info.dense_floats = 1 + opt.DenseStateArrays();
    }
    job->tables.push_back(info);
  }
  return *job;
}

// --- Checks --------------------------------------------------------------------------------

// A strict JSON syntax check (RFC 8259), enough to catch unescaped text and stray separators.
class JsonSyntax {
 public:
  explicit JsonSyntax(std::string_view s) : s_(s) {}
  bool Valid() {
    Space();
    if (!Value(0)) return false;
    Space();
    return i_ == s_.size();
  }

 private:
  bool Value(int depth) {
    if (depth > 64 || i_ >= s_.size()) return false;
    switch (s_[i_]) {
      case '{':
        return Container('}', depth, true);
      case '[':
        return Container(']', depth, false);
      case '"':
        return String();
      case 't':
        return Word("true");
      case 'f':
        return Word("false");
      case 'n':
        return Word("null");
      default:
        return Number();
    }
  }
  bool Container(char close, int depth, bool object) {
    ++i_;
    Space();
    if (Eat(close)) return true;
    while (true) {
      if (object) {
        if (!String()) return false;
        Space();
        if (!Eat(':')) return false;
        Space();
      }
      if (!Value(depth + 1)) return false;
      Space();
      if (Eat(close)) return true;
      if (!Eat(',')) return false;
      Space();
    }
  }
  bool String() {
    if (!Eat('"')) return false;
    while (i_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      if (e == 'u') {
        for (int k = 0; k < 4; ++k, ++i_) {
          if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
        }
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
        return false;
      }
    }
    return false;
  }
  bool Number() {
    Eat('-');
    if (!Digits()) return false;
    if (Eat('.') && !Digits()) return false;
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!Digits()) return false;
    }
    return true;
  }
  bool Digits() {
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    return i_ > start;
  }
  bool Word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void Space() {
    while (i_ < s_.size() && std::string_view(" \t\r\n").find(s_[i_]) != std::string_view::npos) {
      ++i_;
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

// --- The session ---------------------------------------------------------------------------

class Session {
 public:
  explicit Session(const Job& job)
      : job_(job),
        clocks_(job.spec.workers, 0),
        done_(job.spec.workers, false),
        seqs_(job.spec.workers + 1, 0) {
    Start(/*restore=*/false);
  }

  void Run(const Step& s) {
    awaited_ = 0;
    may_wait_ = false;
    anonymous_replies_ = 0;
    switch (s.Kind()) {
      case StepKind::kMessage:
        SendMessage(s);
        break;
      case StepKind::kPeriodic:
        server_->RunPeriodic();
        break;
      case StepKind::kStats:
        CheckStats();
        break;
      case StepKind::kRestart:
        Start(/*restore=*/true);
        break;
      case StepKind::kDamage:
        Damage(s);
        break;
      case StepKind::kPause:
        // Past worker_timeout in the jobs where it is 1 ms: the next RunPeriodic loses workers.
        if (pauses_++ < kMaxPauses) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        break;
      case StepKind::kRaw:
        SendRaw(s);
        break;
      case StepKind::kStep:
        SendStep(s);
        break;
    }
    Drain();
    // Only a pull (held for the read bound) and a barrier may wait for their answer.
    if (awaited_ != 0) FUZZ_CHECK(sent_.at(awaited_).answered);
    // A message the shard cannot read gets one Error reply.
    const bool message = s.Kind() == StepKind::kMessage || s.Kind() == StepKind::kRaw;
    if (message && awaited_ == 0 && !may_wait_) FUZZ_CHECK(anonymous_replies_ == 1);
  }

  // StatsJson() is JSON, and its held_pulls are the pulls sent to this shard and not answered.
  void CheckStats() {
    const std::string stats = server_->StatsJson();
    FUZZ_CHECK(JsonSyntax(stats).Valid());
    FUZZ_CHECK(!server_->MetricsText().empty());
    CheckHeldPulls(stats);
  }

  void CheckHeldPulls(const std::string& stats) const {
    const std::string key = "\"held_pulls\":";
    const size_t at = stats.find(key);
    FUZZ_CHECK(at != std::string::npos);
    if (!raw_ids_.empty()) return;  // a raw message that reads as a pull may be held too
    // A Step's pulls wait together: one held pull.
    uint64_t waiting = 0;
    std::unordered_set<uint64_t> steps;
    for (const auto& [id, sent] : sent_) {
      const Op op = sent.request.op;
      if (sent.generation != generation_ || sent.answered ||
          (op != Op::PullSparse && op != Op::PullDense)) {
        continue;
      }
      if (sent.step == 0) {
        ++waiting;
      } else if (steps.insert(sent.step).second) {
        ++waiting;
      }
    }
    FUZZ_CHECK(std::strtoull(stats.c_str() + at + key.size(), nullptr, 10) == waiting);
  }

  ~Session() { CheckHeldPulls(server_->StatsJson()); }

 private:
  struct Sent {
    Header request;
    std::string identity;
    uint32_t generation = 0;  // of the shard it was sent to
    bool answered = false;
    uint64_t step = 0;  // the request id of the Step it is a part of (0: none)
    std::vector<uint64_t> parts;  // a Step: its parts' request ids
  };

  void Start(bool restore) {
    ++generation_;
    server_.reset();  // one set of engine threads at a time
    server_ = NewServer();
    if (restore && !server_->Restore().ok()) {
      // No checkpoint loads: as an operator would, start the shard without one.
      server_.reset();
      server_ = NewServer();
    }
  }

  std::unique_ptr<ShardServer> NewServer() {
    auto server = std::make_unique<ShardServer>(job_.manifest, job_.spec.rank);
    server->set_reply_sink(
        [this](std::vector<zmq::message_t>& frames) { replies_.push_back(std::move(frames)); });
    return server;
  }

  static const std::string& Identity(uint8_t peer) {
    static const std::string kIds[] = {"w0", "w1", "w2", "observer"};
    return kIds[peer & 3];
  }

  uint32_t Worker(const Step& s) const {
    switch (s.worker) {
      case 5:
        return job_.spec.workers;
      case 6:
        return UINT32_MAX;
      case 7:
        return s.worker_raw;
      default:
        return s.worker % job_.spec.workers;
    }
  }

  // `tick`: the clock of a Clock message (the worker's next), else of a pull or push.
  int64_t ResolveClock(const Step& s, uint32_t worker, bool tick) const {
    const int64_t base = worker < job_.spec.workers ? clocks_[worker] : 0;
    static constexpr int64_t kExtreme[] = {
        INT64_MIN, INT64_MIN + 1, -1, INT64_MAX, INT64_MAX - 1, int64_t{1} << 31, int64_t{1} << 32};
    switch (s.clock) {
      case 4:
        return tick ? base : SaturatingAdd(base, 1);
      case 5:
        return tick ? SaturatingAdd(base, 2) : SaturatingAdd(base, -1);
      case 6:
        return s.clock_small;
      case 7:
        return s.clock_extreme < 7 ? kExtreme[s.clock_extreme] : s.clock_raw;
      default:
        return tick ? SaturatingAdd(base, 1) : base;
    }
  }

  uint32_t TableId(const Step& s) const { return s.table == 15 ? s.table_raw : s.table; }
  TableInfo Table(uint32_t id) const {
    return id < job_.tables.size() ? job_.tables[id] : TableInfo{};
  }

  // key_count, value_dim, offset, value_frames and rows_per_frame as a client fills them.
  void FillShape(const Step& s, Header& h) const {
    const Shape& shape = s.shape;
    uint64_t rows = shape.rows == 255 ? shape.rows_raw : shape.rows;
    const TableInfo t = Table(h.table_id);
    const bool push = h.op == Op::PushSparse || h.op == Op::PushDense;
    if (h.op == Op::PullSparse || h.op == Op::PushSparse) {
      h.value_dim = t.sparse ? (h.with_state ? t.row_floats : t.dim) : 4;
    } else if (h.op == Op::Migrate) {
      // Rows as an export gives them: the clock word, the values and the state (dense: each
      // element's value and state).
      h.value_dim = t.sparse ? 1 + t.row_floats : t.dense_floats;
      h.offset = shape.offset;
    } else {
      const SliceRange slice = t.sparse ? SliceRange{0, 16} : t.slice;
      h.offset = slice.begin + shape.offset % (slice.size() + 1);
      rows = std::min(rows, slice.end - h.offset);
      h.value_dim = 1;
    }
    h.key_count = rows;
    if (push || h.op == Op::Migrate) {
      const FramePlan plan = PlanValueFrames(rows, h.value_dim, kFrameBytes);
      h.value_frames = plan.frames;
      h.rows_per_frame = plan.rows_per_frame;
    }
    if (shape.mode == 5 || shape.mode == 6) SetField(h, shape.field, shape.value.Value());
    if (shape.mode == 7) {
      for (size_t f = 0; f < shape.fields.size(); ++f) {
        SetField(h, static_cast<uint8_t>(f), shape.fields[f].Value());
      }
    }
  }

  static void SetField(Header& h, uint8_t field, uint64_t v) {
    switch (field) {
      case 0:
        h.key_count = v;
        break;
      case 1:
        h.value_dim = static_cast<uint32_t>(v);
        break;
      case 2:
        h.offset = v;
        break;
      case 3:
        h.value_frames = static_cast<uint32_t>(v);
        break;
      case 4:
        h.rows_per_frame = v;
        break;
      default:
        h.dtype = static_cast<wire::DType>(v & 0xff);
        break;
    }
  }

  Header BuildHeader(const Step& s) {
    Header h;
    h.op = static_cast<Op>(s.OpByte());
    h.request_id = next_id_++;
    h.worker_id = Worker(s);
    const uint32_t slot = std::min(h.worker_id, job_.spec.workers);
    switch (s.OpByte()) {
      case 0:
        h.manifest_hash = s.hello == 7 ? job_.fingerprint ^ 1 : job_.fingerprint;
        break;
      case 2:
      case 4:
        h.seq = s.seq == 3 ? s.seq_raw : (s.seq == 2 ? seqs_[slot] : ++seqs_[slot]);
        h.incarnation = s.incarnation < 6 ? 1 : (s.incarnation == 6 ? 2 : 0);
        [[fallthrough]];
      case 1:
      case 3:
        h.table_id = TableId(s);
        h.clock = ResolveClock(s, h.worker_id, /*tick=*/false);
        h.with_state = s.with_state == 3;
        FillShape(s, h);
        break;
      case 5:
        h.clock = ResolveClock(s, h.worker_id, /*tick=*/true);
        h.done = s.done == 7;
        // The pushes of the clock it leaves that the tick follows: refused unless all applied.
        h.key_count = s.done >= 4 && s.done <= 6 ? s.done - 3u : 0u;
        break;
      case 12:  // Membership: join, leave, or (from outside the job) a worker or shard count
        h.manifest_hash = s.hello == 7 ? job_.fingerprint ^ 1 : job_.fingerprint;
        h.join = (s.hello & 1) != 0;
        h.done = s.done == 7;
        h.key_count = s.seq_raw;
        h.shard_count = s.seq;  // 0: none
        break;
      case 13:  // Migrate: a copy ahead (clock -1), or of the change shard 0 named last
        h.seq = 1 + s.seq;
        h.shard_count = 1 + s.done % 4;
        h.table_id = TableId(s);
        h.clock = s.clock < 2 ? -1
                  : s.clock < 4 ? named_change_
                                : ResolveClock(s, h.worker_id, /*tick=*/false);
        h.worker_clock = s.incarnation < 4 ? -1 : ResolveClock(s, h.worker_id, false);
        h.known_epoch = s.incarnation == 7 ? s.clock_raw : 0;
        FillShape(s, h);
        break;
      case 6:
        switch (s.barrier) {
          case 0:
            h.offset = static_cast<uint64_t>(barrier_);
            break;
          case 1:
            h.offset = static_cast<uint64_t>(++barrier_);
            break;
          case 2:
            h.offset = static_cast<uint64_t>(barrier_ - 1);
            break;
          default:
            h.offset = s.barrier_raw.Value();
            break;
        }
        break;
      default:
        break;
    }
    if (s.OpByte() == 0) h.join = s.hello == 6;
    // Hellos, ticks and membership requests may carry membership entries of their own making
    // (anomaly 1-10, which is otherwise none): a rank in or past the job, joining and leaving at
    // clocks near the job's or far off, and entries that contradict each other.
    if ((s.OpByte() == 0 || s.OpByte() == 5 || s.OpByte() == 12) && s.anomaly >= 1 &&
        s.anomaly <= 10) {
      const uint32_t a = s.anomaly;
      MemberEntry e;
      e.worker = (a + s.peer) % (job_.spec.workers + 3);
      e.join = (a & 1) ? ResolveClock(s, h.worker_id, /*tick=*/false) : -1;
      if (a == 9) e.join = kMaxMemberClock + 5;
      e.leave = (a & 2) ? SaturatingAdd(std::max<int64_t>(e.join, 0), 1 + a) : -1;
      h.members.push_back(e);
      if (a & 4) h.members.push_back(MemberEntry{e.worker, SaturatingAdd(e.join, 1), -1});
      // A change of the shard count, near or far, to a count in or past the listed shards.
      if (a == 10) {
        h.members.push_back(MemberEntry{kServerEntry | (1 + s.peer % 4),
                                        ResolveClock(s, h.worker_id, /*tick=*/false), -1});
      }
      h.membership_version = a;
    }
    switch (s.anomaly) {
      case 11:
        h.is_reply = true;
        break;
      case 12:
        h.status = static_cast<StatusCode>(s.anomaly_value);
        break;
      case 13:
        h.version = s.anomaly_value;
        break;
      case 14:
        h.message = s.text;
        break;
      case 15:
        // A dtype (the compressed ones more often, with an f16 scale in and out of range).
        h.dtype = static_cast<wire::DType>(s.anomaly_value < 192 ? 1 + s.anomaly_value % 2
                                                                 : s.anomaly_value);
        h.value_scale = static_cast<int16_t>(static_cast<int8_t>(s.text.empty() ? 0 : s.text[0]));
        break;
      default:
        break;
    }
    return h;
  }

  static uint64_t KeyAt(const Keys& k, uint64_t i) {
    const size_t n = k.bytes.size();
    switch (k.mode) {
      case 1:
        return k.base + i * k.stride;
      case 2: {
        if (n == 0) return i;
        uint64_t v = 0;
        for (uint64_t b = 0; b < 8; ++b) {
          v |= uint64_t{static_cast<uint8_t>(k.bytes[(i * 8 + b) % n])} << (8 * b);
        }
        return v;
      }
      default:
        return n == 0 ? i % 48 : static_cast<uint8_t>(k.bytes[i % n]) % 48;
    }
  }

  // `bytes` bytes of values, continuing from float `*next`.
  static std::string ValueBytes(const Values& v, uint64_t bytes, uint64_t* next) {
    std::string out(bytes, '\0');
    const size_t n = v.bytes.size();
    if (v.mode == 2) {
      for (uint64_t j = 0; j < bytes && n > 0; ++j) out[j] = v.bytes[(*next * 4 + j) % n];
      *next += bytes / 4;
      return out;
    }
    for (uint64_t j = 0; j + 4 <= bytes; j += 4, ++*next) {
      float f = 0;
      switch (v.mode) {
        case 0:
          f = SpecialFloat(v.special);
          break;
        case 1:
          f = n ? SpecialFloat(static_cast<uint8_t>(v.bytes[*next % n])) : 0.0f;
          break;
        default:
          f = SpecialFloat(v.special) + static_cast<float>(*next % 1000) * 1e-3f;
          break;
      }
      std::memcpy(out.data() + j, &f, sizeof(f));
    }
    return out;
  }

  // The payload frames the header implies, then the step's edit of them.
  std::vector<std::string> Payload(const Step& s, const Header& h) const {
    std::vector<std::string> frames;
    uint64_t budget = kMaxPayloadBytes;
    uint64_t next_float = 0;
    if (s.frames.mode == 7) {
      for (uint16_t size : s.frames.sizes)
        frames.push_back(ValueBytes(s.values, size, &next_float));
      return frames;
    }
    const PayloadLayout layout = PayloadLayoutOf(h.op, h.is_reply, h.status);
    if (layout.keys) {
      const uint64_t n = std::min<uint64_t>(h.key_count, budget / 8);
      std::string keys(n * 8, '\0');
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t k = KeyAt(s.keys, i);
        std::memcpy(keys.data() + i * 8, &k, 8);
      }
      budget -= keys.size();
      frames.push_back(std::move(keys));
    }
    if (layout.values) {
      // 16-bit values (wire compression) when the header says so: the server widens them
      // before any handler reads them.
      const bool half = h.dtype == wire::DType::F16 || h.dtype == wire::DType::BF16;
      const uint64_t row_bytes = uint64_t{h.value_dim} * (half ? 2 : 4);
      const uint32_t count = std::min(h.value_frames, kMaxValueFrames);
      for (uint32_t f = 0; f < count; ++f) {
        uint64_t first = 0, rows = 0, bytes = 0;
        if (!__builtin_mul_overflow(uint64_t{f}, h.rows_per_frame, &first) && first < h.key_count) {
          rows = std::min(h.rows_per_frame, h.key_count - first);
        }
        if (__builtin_mul_overflow(rows, row_bytes, &bytes)) bytes = budget;
        bytes = std::min(bytes, budget);
        budget -= bytes;
        frames.push_back(ValueBytes(s.values, bytes, &next_float));
      }
    }
    if (s.frames.mode == 6) Edit(s.frames, &frames);
    return frames;
  }

  static void Edit(const Frames& e, std::vector<std::string>* frames) {
    switch (e.edit) {
      case 0:
        if (!frames->empty()) frames->pop_back();
        break;
      case 1:
        frames->push_back(std::string(std::max<int>(0, e.delta), '\x01'));
        break;
      case 2:
        if (!frames->empty()) {
          std::string& f = (*frames)[e.at % frames->size()];
          f.resize(static_cast<size_t>(std::max<int64_t>(0, int64_t(f.size()) + e.delta)), '\x02');
        }
        break;
      default:
        if (frames->size() >= 2) std::swap((*frames)[0], (*frames)[1]);
        break;
    }
  }

  void SendMessage(const Step& s) {
    const Header h = BuildHeader(s);
    std::vector<zmq::message_t> frames;
    const std::string& identity = Identity(s.peer);
    frames.emplace_back(identity.data(), identity.size());
    frames.push_back(EncodeHeader(h));
    for (const std::string& p : Payload(s, h)) frames.emplace_back(p.data(), p.size());
    // What the shard will decode: a header it refuses gets an Error reply with request id 0.
    Result<Header> decoded = DecodeHeader(frames[1].data(), frames[1].size());
    if (decoded.ok()) {
      sent_[h.request_id] = Sent{*decoded, identity, generation_, false, 0, {}};
      const Op op = decoded->op;
      may_wait_ = op == Op::PullSparse || op == Op::PullDense || op == Op::Barrier;
      if (!may_wait_) awaited_ = h.request_id;
    }
    server_->HandleMessage(frames);
  }

  // A Step of the step's parts: each built as a message of its own, then (mode 0-2) given the
  // first part's worker, incarnation and clock, as a client gathers them.
  void SendStep(const Step& s) {
    std::vector<zmq::message_t> frames;
    const std::string& identity = Identity(s.parts.front().peer);
    frames.emplace_back(identity.data(), identity.size());
    frames.emplace_back();  // the Step header, below
    std::vector<Header> parts;
    bool pulls = false;
    for (const Step& part : s.parts) {
      Header h = BuildHeader(part);
      if (s.step_mode < 3 && !parts.empty()) {
        h.worker_id = parts[0].worker_id;
        h.incarnation = parts[0].incarnation;
        h.clock = parts[0].clock;
      }
      frames.push_back(EncodeHeader(h));
      // What the shard will decode (an anomaly may make it unreadable).
      Result<Header> own = DecodeHeader(frames.back().data(), frames.back().size());
      for (const std::string& p : Payload(part, h)) frames.emplace_back(p.data(), p.size());
      if (own.ok()) {
        parts.push_back(*own);
        pulls = pulls || own->op == Op::PullSparse || own->op == Op::PullDense;
      } else {
        parts.push_back(h);
      }
    }
    Header step;
    step.op = Op::Step;
    step.request_id = next_id_++;
    step.worker_id = parts[0].worker_id;
    step.incarnation = parts[0].incarnation;
    step.clock = parts[0].clock;
    step.key_count = parts.size();
    frames[1] = EncodeHeader(step);
    Sent& sent = sent_[step.request_id] = Sent{step, identity, generation_, false, 0, {}};
    for (const Header& p : parts) {
      if (p.request_id < kIdBase || sent_.count(p.request_id)) continue;
      sent_[p.request_id] = Sent{p, identity, generation_, false, step.request_id, {}};
      sent.parts.push_back(p.request_id);
    }
    may_wait_ = pulls;
    if (!pulls) awaited_ = step.request_id;
    server_->HandleMessage(frames);
  }

  void SendRaw(const Step& s) {
    std::vector<zmq::message_t> frames;
    const std::string& identity = Identity(s.peer);
    frames.emplace_back(identity.data(), identity.size());
    for (const std::string& f : s.raw_frames) frames.emplace_back(f.data(), f.size());
    if (frames.size() >= 2) {
      Result<Header> decoded = DecodeHeader(frames[1].data(), frames[1].size());
      if (decoded.ok()) {
        raw_ids_.insert(decoded->request_id);
        may_wait_ = true;  // not checked: its request id may be anything
      }
    }
    server_->HandleMessage(frames);
  }

  void Damage(const Step& s) {
    const std::string& dir = CheckpointDir();
    const std::string folder = dir + "/shard-" + std::to_string(job_.spec.rank);
    std::error_code ec;
    if (s.damage == 2) {
      // Checkpoints cannot be written: the shard's folder is a file.
      std::filesystem::remove_all(folder, ec);
      std::ofstream(folder) << "not a folder";
      return;
    }
    const std::vector<std::string> files = ListCheckpoints(dir, job_.spec.rank);
    if (files.empty()) return;
    const uint64_t size = std::filesystem::file_size(files[0], ec);
    if (ec || size == 0) return;
    if (s.damage == 1) {
      std::filesystem::resize_file(files[0], s.damage_at % size, ec);
      return;
    }
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(static_cast<std::streamoff>(s.damage_at % size));
    f.get(c);
    f.seekp(static_cast<std::streamoff>(s.damage_at % size));
    f.put(static_cast<char>(c ^ s.damage_xor));
  }

  // --- Replies -----------------------------------------------------------------------------

  void Drain() {
    // A Clock's own reply follows the pull replies it released: learn the clocks first.
    for (auto& frames : replies_) Learn(frames);
    for (auto& frames : replies_) Check(frames);
    replies_.clear();
  }

  Sent* Find(const std::vector<zmq::message_t>& frames, Header* reply) {
    if (frames.size() < 2) return nullptr;
    Result<Header> h = DecodeHeader(frames[1].data(), frames[1].size());
    if (!h.ok()) return nullptr;
    *reply = *h;
    if (raw_ids_.count(h->request_id)) return nullptr;
    auto it = sent_.find(h->request_id);
    return it == sent_.end() ? nullptr : &it->second;
  }

  // A Step reply's parts, each as a reply of its own ([identity, header, payload...]), or
  // nothing when it has none.
  static std::vector<std::vector<zmq::message_t>> PartReplies(
      const Header& r, const std::vector<zmq::message_t>& frames) {
    std::vector<std::vector<zmq::message_t>> out;
    Result<std::vector<StepPart>> parts =
        SplitStep(r, std::span<const zmq::message_t>(frames).subspan(2));
    if (!parts.ok()) return out;
    for (const StepPart& p : *parts) {
      std::vector<zmq::message_t> own;
      own.emplace_back(frames[0].data(), frames[0].size());
      for (size_t f = 0; f <= p.payload_frames; ++f) {
        const zmq::message_t& m = frames[2 + p.header_frame + f];
        own.emplace_back(m.data(), m.size());
      }
      out.push_back(std::move(own));
    }
    return out;
  }

  // Clocks and barrier ids the shard accepted.
  void Learn(const std::vector<zmq::message_t>& frames) {
    Header r;
    Sent* s = Find(frames, &r);
    if (s && r.op == Op::Step && r.status == StatusCode::kOk) {
      for (const auto& part : PartReplies(r, frames)) Learn(part);
      return;
    }
    if (!s || s->answered || r.status != StatusCode::kOk) return;
    const Header& q = s->request;
    if (q.op == Op::Clock && q.worker_id < job_.spec.workers) {
      clocks_[q.worker_id] = std::max(clocks_[q.worker_id], q.clock);
      if (q.done) done_[q.worker_id] = true;
    }
    if (q.op == Op::Barrier && q.offset < static_cast<uint64_t>(INT64_MAX)) {
      barrier_ = std::max(barrier_, static_cast<int64_t>(q.offset) + 1);
    }
  }

  void Check(std::vector<zmq::message_t>& frames) {
    FUZZ_CHECK(frames.size() >= 2);
    Result<Header> decoded = DecodeHeader(frames[1].data(), frames[1].size());
    if (!decoded.ok()) std::fprintf(stderr, "%s\n", decoded.status().ToString().c_str());
    FUZZ_CHECK(decoded.ok());
    const Header& r = *decoded;
    FUZZ_CHECK(r.is_reply);
    if (raw_ids_.count(r.request_id)) return;
    if (r.request_id < kIdBase) {
      // A message whose header the shard could not read.
      FUZZ_CHECK(r.op == Op::Error && r.status != StatusCode::kOk && frames.size() == 2);
      ++anonymous_replies_;
      return;
    }
    auto it = sent_.find(r.request_id);
    FUZZ_CHECK(it != sent_.end());
    Sent& s = it->second;
    FUZZ_CHECK(frames[0].size() == s.identity.size() &&
               std::memcmp(frames[0].data(), s.identity.data(), s.identity.size()) == 0);
    if (s.request.op == Op::Step && r.op == Op::Step) {
      // Answered in one reply, or in two when its pulls waited for the read bound; refused
      // whole (its parts are never answered), or each part answered once, as its own reply.
      s.answered = true;
      if (r.status != StatusCode::kOk) {
        FUZZ_CHECK(frames.size() == 2);
        for (uint64_t id : s.parts) sent_.at(id).answered = true;
        return;
      }
      FUZZ_CHECK(r.key_count >= 1 && r.key_count <= s.parts.size());
      std::vector<std::vector<zmq::message_t>> parts = PartReplies(r, frames);
      FUZZ_CHECK(parts.size() == r.key_count);
      for (auto& part : parts) {
        Header p;
        FUZZ_CHECK(Find(part, &p) != nullptr);
        FUZZ_CHECK(sent_.at(p.request_id).step == r.request_id);
        Check(part);
      }
      return;
    }
    FUZZ_CHECK(!s.answered);
    s.answered = true;
    FUZZ_CHECK(r.op == s.request.op);
    if (r.status != StatusCode::kOk) {
      FUZZ_CHECK(frames.size() == 2);
      return;
    }
    switch (r.op) {
      case Op::PullSparse:
      case Op::PullDense:
        CheckPull(s.request, r, frames);
        break;
      case Op::Hello:
        FUZZ_CHECK(r.shard_rank == job_.spec.rank && r.shard_count == job_.spec.shards);
        FUZZ_CHECK(frames.size() == 2);
        break;
      case Op::Stats:
        FUZZ_CHECK(JsonSyntax(r.message).Valid());
        FUZZ_CHECK(frames.size() == 2);
        break;
      case Op::Membership:
        if (s.request.shard_count > 0 && r.worker_clock >= 0) named_change_ = r.worker_clock;
        FUZZ_CHECK(frames.size() == 2);
        break;
      case Op::Migrate: {
        // Rows (an export page) or none, as the header says.
        Result<PayloadView> view = PayloadView::Parse(
            r, std::span<zmq::message_t>(frames).subspan(2), job_.manifest.server.max_request_bytes);
        FUZZ_CHECK(view.ok());
        FUZZ_CHECK(view->rows() == r.key_count);
        FUZZ_CHECK(s.request.seq == 1 || r.key_count == 0);
        break;
      }
      default:
        FUZZ_CHECK(frames.size() == 2);
        break;
    }
  }

  void CheckPull(const Header& q, const Header& r, std::vector<zmq::message_t>& frames) {
    Result<PayloadView> view = PayloadView::Parse(r, std::span<zmq::message_t>(frames).subspan(2),
                                                  job_.manifest.server.max_request_bytes);
    FUZZ_CHECK(view.ok());
    FUZZ_CHECK(view->rows() == q.key_count);
    // The values travel in the dtype the pull asked for; only f16 carries a scale.
    FUZZ_CHECK(r.dtype == q.dtype);
    FUZZ_CHECK(r.dtype == wire::DType::F16 || r.value_scale == 0);
    if (q.op == Op::PullSparse) {
      FUZZ_CHECK(r.value_dim == q.value_dim);
    } else {
      FUZZ_CHECK(r.offset == q.offset);
    }
    volatile uint8_t sink = 0;
    view->ForEachValueFrame([&](uint64_t, const std::byte* bytes, uint64_t rows) {
      for (uint64_t i = 0; i < rows * view->dim() * sizeof(float); ++i) {
        sink = sink ^ static_cast<uint8_t>(bytes[i]);
      }
    });
    // The read bound. Lost workers no longer count on the shard, so it is checked only where
    // none can be lost; the clocks here never exceed the shard's (a restore only lowers them).
    const JobSpec& spec = job_.spec;
    if (spec.loss != JobSpec::Loss::kNever || spec.mode == JobSpec::Mode::kAsp ||
        q.worker_id >= spec.workers) {
      return;
    }
    int64_t min_clock = INT64_MAX;
    for (uint32_t w = 0; w < spec.workers; ++w) {
      if (!done_[w]) min_clock = std::min(min_clock, clocks_[w]);
    }
    const int64_t staleness =
        spec.mode == JobSpec::Mode::kSsp1 ? 1 : (spec.mode == JobSpec::Mode::kSsp2 ? 2 : 0);
    FUZZ_CHECK(min_clock >= SaturatingAdd(q.clock, -staleness));
  }

  const Job& job_;
  std::unique_ptr<ShardServer> server_;
  std::vector<std::vector<zmq::message_t>> replies_;  // from the sink, checked by Drain()
  std::vector<int64_t> clocks_;  // per worker: the newest clock the shard accepted
  std::vector<bool> done_;       // per worker: a Clock with done accepted
  std::vector<uint64_t> seqs_;   // per worker, and one for every id outside the job
  int64_t barrier_ = 1;          // the barrier id workers wait at next
  int64_t named_change_ = -1;    // the clock of the shard count change shard 0 named last
  uint64_t next_id_ = kIdBase;
  std::unordered_map<uint64_t, Sent> sent_;  // by request id
  std::unordered_set<uint64_t> raw_ids_;     // request ids raw messages happened to carry
  uint32_t generation_ = 0;                  // shards started so far
  // The step's own message: its request id when it must be answered at once (0: none or not
  // readable), whether it may wait instead, and the replies to messages that were not readable.
  uint64_t awaited_ = 0;
  bool may_wait_ = false;
  int anonymous_replies_ = 0;
  int pauses_ = 0;
};

}  // namespace
}  // namespace parasol::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Logged, formatted, and dropped: the shard warns about every bad message.
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("fuzz", std::make_shared<spdlog::sinks::null_sink_st>()));
  (void)parasol::fuzz::CheckpointDir();
  std::atexit(parasol::fuzz::RemoveCheckpointDir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol::fuzz;
  if (size < 1) return 0;
  const Job& job = JobFor(data[0]);
  WipeCheckpoints();
  FuzzedDataProvider in(data + 1, size - 1);
  StepReader reader(in);
  Session session(job);
  for (int n = 0; n < kMaxSteps && in.remaining_bytes() > 0; ++n) {
    Step step;
    VisitStep(reader, step);
    session.Run(step);
  }
  return 0;
}
