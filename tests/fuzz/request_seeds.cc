// Writes well-formed sessions, in the request fuzzer's input format (request_input.hpp), as the
// seed corpus of request_fuzzer: hellos, pulls and pushes of every table, the clocks of each
// worker in order, barriers, checkpoints and restarts, for every consistency mode and shard
// layout; then a few sessions aimed at one feature each (admission and eviction, held pulls,
// many frames, duplicates, damaged checkpoints, lost workers, hostile headers, a change of the
// shard count).
// Each file is read back as the fuzzer reads it, and must encode to the same bytes.
//   fuzz_request_seeds DIR
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/request_input.hpp"

namespace parasol::fuzz {
namespace {

// Op choices (Step::op): see Step::OpByte().
enum OpChoice : uint8_t {
  kHello = 0,
  kPullSparse = 1,
  kPushSparse = 2,
  kPullDense = 3,
  kPushDense = 4,
  kClock = 5,
  kBarrier = 6,
  kStats = 7,
  kShutdown = 8,
  kError = 9,
  kCheckpoint = 10,
  kMembership = 12,
  kMigrate = 13,
};

// Step::kind values of the steps that are not messages.
constexpr uint8_t kPeriodic = 21, kStatsCall = 24, kRestart = 26, kDamage = 27, kPause = 28,
                  kRaw = 29, kStepKind = 30;

bool IsSparse(uint32_t table) { return table < kDenseSgd; }

Step Message(uint8_t op, uint32_t worker) {
  Step s;
  s.op = op;
  s.peer = static_cast<uint8_t>(worker);
  s.worker = static_cast<uint8_t>(worker);
  return s;
}

// Rows from a small key space, so rows collide and admission counts.
Step Pull(uint32_t worker, uint32_t table, uint8_t rows, const std::string& keys = "\x01\x02\x03") {
  Step s = Message(IsSparse(table) ? kPullSparse : kPullDense, worker);
  s.table = static_cast<uint8_t>(table);
  s.shape.rows = rows;
  s.keys.bytes = keys;
  return s;
}

Step Push(uint32_t worker, uint32_t table, uint8_t rows, const std::string& keys = "\x01\x02\x03") {
  Step s = Message(IsSparse(table) ? kPushSparse : kPushDense, worker);
  s.table = static_cast<uint8_t>(table);
  s.shape.rows = rows;
  s.keys.bytes = keys;
  s.values.special = 4;  // 0.01
  return s;
}

Step Tick(uint32_t worker) { return Message(kClock, worker); }

Step Done(uint32_t worker) {
  Step s = Message(kClock, worker);
  s.clock = 4;  // its current clock
  s.done = 7;
  return s;
}

Step JoinBarrier(uint32_t worker) { return Message(kBarrier, worker); }

Step Kind(uint8_t kind) {
  Step s;
  s.kind = kind;
  return s;
}

Step Damage(uint8_t how, uint32_t at, uint8_t x = 0x40) {
  Step s = Kind(kDamage);
  s.damage = how;
  s.damage_at = at;
  s.damage_xor = x;
  return s;
}

// A Step message of `parts` (mode 0: as a client gathers them).
Step StepOf(std::vector<Step> parts, uint8_t mode = 0) {
  Step s = Kind(kStepKind);
  s.step_mode = mode;
  s.parts = std::move(parts);
  return s;
}

struct Session {
  std::string name;
  uint8_t config = 0;
  std::vector<Step> steps;
  void Add(const Step& s) { steps.push_back(s); }
};

std::string Encode(const Session& session) {
  StepWriter w;
  for (Step s : session.steps) VisitStep(w, s);
  return std::string(1, static_cast<char>(session.config)) + w.Finish();
}

// Reads `bytes` as the fuzzer does and encodes what it read again.
bool RoundTrips(const std::string& bytes, size_t steps) {
  FuzzedDataProvider in(reinterpret_cast<const uint8_t*>(bytes.data()) + 1, bytes.size() - 1);
  StepReader reader(in);
  StepWriter again;
  size_t n = 0;
  while (in.remaining_bytes() > 0) {
    Step s;
    VisitStep(reader, s);
    VisitStep(again, s);
    ++n;
  }
  return n == steps && bytes.substr(1) == again.Finish();
}

// Every worker: hello, a pull and a push of every table, its clock; then barriers, a
// checkpoint, a restart from it, and the workers finishing.
Session FullSession(JobSpec::Mode mode, uint32_t layout, uint32_t workers) {
  static const char* const kModes[] = {"bsp", "ssp1", "ssp2", "asp"};
  Session s;
  s.name = std::string("session-") + kModes[static_cast<int>(mode)] + "-layout" +
           std::to_string(layout) + "-w" + std::to_string(workers);
  s.config = ConfigByte(mode, layout, workers);
  for (uint32_t w = 0; w < workers; ++w) s.Add(Message(kHello, w));
  for (int clock = 0; clock < 3; ++clock) {
    for (uint32_t w = 0; w < workers; ++w) {
      for (uint32_t t = 0; t < kTableCount; ++t) {
        s.Add(Pull(w, t, static_cast<uint8_t>(2 + t)));
        s.Add(Push(w, t, static_cast<uint8_t>(2 + t)));
      }
      s.Add(Tick(w));
    }
    s.Add(Kind(kPeriodic));
  }
  for (uint32_t w = 0; w < workers; ++w) s.Add(JoinBarrier(w));
  s.Add(Message(kCheckpoint, 0));
  s.Add(Message(kStats, 0));
  s.Add(Kind(kRestart));
  for (uint32_t w = 0; w < workers; ++w) s.Add(Pull(w, kSparseAdam, 4));
  for (uint32_t w = 0; w < workers; ++w) s.Add(Done(w));
  s.Add(Kind(kStatsCall));
  return s;
}

std::vector<Session> FocusedSessions() {
  std::vector<Session> out;
  const uint8_t bsp2 = ConfigByte(JobSpec::Mode::kBsp, 1, 2);
  const uint8_t ssp2 = ConfigByte(JobSpec::Mode::kSsp1, 0, 2);
  const uint8_t asp2 = ConfigByte(JobSpec::Mode::kAsp, 0, 2);
  {
    // Admission at the second push, eviction by ttl and max_rows.
    Session s{"admission-eviction", asp2, {}};
    for (int round = 0; round < 4; ++round) {
      s.Add(Push(0, kSparseFtrl, 12, "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c"));
      s.Add(Push(1, kSparseSgd, 20, std::string("\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19", 10)));
      s.Add(Pull(1, kSparseFtrl, 6));
      s.Add(Tick(0));
      s.Add(Tick(1));
      s.Add(Kind(kPeriodic));
    }
    s.Add(Kind(kStatsCall));
    out.push_back(s);
  }
  {
    // A pull ahead of the other worker is held, then released by its clock.
    Session s{"held-pull", bsp2, {}};
    s.Add(Tick(0));
    s.Add(Push(0, kDenseSgd, 10));
    s.Add(Pull(0, kSparseAdagrad, 3));
    s.Add(Pull(0, kDenseAdagrad, 24));
    s.Add(Push(1, kDenseSgd, 10));
    s.Add(Tick(1));
    s.Add(Kind(kStatsCall));
    out.push_back(s);
  }
  {
    // Values over many frames (frames of 256 bytes), with optimizer state.
    Session s{"many-frames", ssp2, {}};
    Step big = Push(0, kSparseAdam, 200);
    big.keys.mode = 1;
    big.keys.base = 3;
    big.keys.stride = 1;
    big.values.mode = 3;
    s.Add(big);
    Step pull = Pull(0, kSparseAdam, 200);
    pull.keys = big.keys;
    pull.with_state = 3;
    s.Add(pull);
    s.Add(Push(1, kDenseAdam, 254));
    Step dense = Pull(1, kDenseAdam, 255);
    dense.shape.rows_raw = 1600;
    dense.with_state = 3;
    s.Add(dense);
    s.Add(Pull(0, kSparseRowwise, 40));
    out.push_back(s);
  }
  {
    // A resent push is acknowledged, not applied again; a new incarnation starts over.
    Session s{"duplicates", asp2, {}};
    Step p = Push(0, kSparseAdagrad, 3);
    s.Add(p);
    p.seq = 2;
    s.Add(p);
    p.incarnation = 6;
    p.seq = 3;
    p.seq_raw = 1;
    s.Add(p);
    s.Add(p);
    s.Add(Message(kCheckpoint, 0));
    s.Add(Kind(kRestart));
    s.Add(p);
    out.push_back(s);
  }
  for (const uint8_t config : {static_cast<uint8_t>(asp2 | 0x80), static_cast<uint8_t>(bsp2 | 0x80)}) {
    // One engine thread: s_ftrl is tiered with room for a few rows, so pushes and pulls of
    // more keys move rows to disk and back; its admission, eviction, checkpoint and restart
    // then act on both tiers.
    Session s{config == static_cast<uint8_t>(asp2 | 0x80) ? "tiered-asp" : "tiered-bsp", config,
              {}};
    const std::string keys("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
                           "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x20",
                           32);
    for (int round = 0; round < 3; ++round) {
      s.Add(Push(0, kSparseFtrl, 32, keys));
      s.Add(Push(1, kSparseFtrl, 32, keys));
      s.Add(Pull(0, kSparseFtrl, 32, keys));
      s.Add(Tick(0));
      s.Add(Tick(1));
      s.Add(Kind(kPeriodic));
    }
    s.Add(Message(kCheckpoint, 0));
    s.Add(Kind(kRestart));
    s.Add(Pull(1, kSparseFtrl, 32, keys));
    s.Add(Kind(kStatsCall));
    out.push_back(s);
  }
  {
    // Checkpoints damaged, refused, and the folder made unwritable.
    Session s{"damaged-checkpoints", bsp2, {}};
    s.Add(Push(0, kSparseSgd, 4));
    s.Add(Message(kCheckpoint, 0));
    s.Add(Tick(0));
    s.Add(Tick(1));
    s.Add(Message(kCheckpoint, 1));
    s.Add(Damage(0, 100));
    s.Add(Kind(kRestart));
    s.Add(Damage(1, 50));
    s.Add(Kind(kRestart));
    s.Add(Damage(2, 0));
    s.Add(Message(kCheckpoint, 0));
    s.Add(Kind(kRestart));
    out.push_back(s);
  }
  {
    // Workers lost after worker_timeout (1 ms), the job failing or going on without them.
    for (uint8_t loss : {2, 3}) {
      Session s{loss == 2 ? "lost-worker-fails" : "lost-worker-continues",
                static_cast<uint8_t>(ConfigByte(JobSpec::Mode::kBsp, 0, 3) | (loss << 5)),
                {}};
      s.Add(Tick(0));
      s.Add(Pull(0, kSparseSgd, 2));
      s.Add(JoinBarrier(0));
      s.Add(Kind(kPause));
      s.Add(Kind(kPeriodic));
      s.Add(Pull(1, kSparseSgd, 2));
      s.Add(Tick(1));
      s.Add(Kind(kStatsCall));
      out.push_back(s);
    }
  }
  {
    // The known attack: a two-frame PushSparse whose header says key_count 2, value_dim 16,
    // value_frames 0 and rows_per_frame 2^64-1.
    Session s{"hostile-rows-per-frame", asp2, {}};
    Step p = Push(0, kSparseSgd, 2);
    p.shape.mode = 7;
    p.shape.fields.resize(6);
    p.shape.fields[0].kind = 2;  // key_count 2
    p.shape.fields[1].kind = 3;  // value_dim 16
    p.shape.fields[1].raw = 16;
    p.shape.fields[4].kind = 9;  // rows_per_frame 2^64-1
    p.frames.mode = 7;
    p.frames.sizes = {16};
    s.Add(p);
    s.Add(Pull(0, kSparseSgd, 2));
    out.push_back(s);
  }
  {
    // Steps as workers send them under BSP: each worker's pushes in one Step, then its tick
    // with the next clock's pulls (held until the other worker ticks); a Step resent (its
    // pushes answered as duplicates); Steps a client never sends (mixed kinds and workers).
    for (const uint8_t config : {ConfigByte(JobSpec::Mode::kBsp, 1, 2),
                                 ConfigByte(JobSpec::Mode::kSsp1, 0, 2)}) {
      Session s{config == ConfigByte(JobSpec::Mode::kBsp, 1, 2) ? "steps-bsp" : "steps-ssp",
                config, {}};
      for (uint32_t w = 0; w < 2; ++w) s.Add(Message(kHello, w));
      for (int clock = 0; clock < 3; ++clock) {
        for (uint32_t w = 0; w < 2; ++w) {
          s.Add(StepOf({Push(w, kSparseAdagrad, 3), Push(w, kSparseAdam, 2),
                        Push(w, kDenseSgd, 10), Push(w, kDenseAdam, 255)}));
          s.Add(StepOf({Tick(w), Pull(w, kSparseAdagrad, 3), Pull(w, kDenseSgd, 10),
                        Pull(w, kDenseAdam, 255)}));
        }
        s.Add(Kind(kStatsCall));
      }
      Step again = Push(0, kSparseAdagrad, 3);
      again.seq = 2;
      s.Add(StepOf({again, again}));
      s.Add(StepOf({Push(0, kSparseSgd, 2), Pull(0, kSparseSgd, 2)}));
      s.Add(StepOf({Push(0, kSparseSgd, 2), Push(1, kSparseSgd, 2)}, 3));
      s.Add(StepOf({Pull(0, kSparseSgd, 2), Tick(0)}));
      s.Add(Kind(kRestart));
      s.Add(StepOf({Tick(1), Pull(1, kSparseFtrl, 4)}));
      s.Add(Kind(kStatsCall));
      out.push_back(s);
    }
  }
  {
    // Values in f16 (scaled) and bf16, as a client with wire.compression sends them: pushes to
    // every table and pulls asking for 16-bit replies, under BSP and ASP; then an f16 scale out
    // of range. (Anomaly 15: value 0 is f16, 1 bf16; the text's first byte the f16 scale.)
    for (const uint8_t config : {bsp2, asp2}) {
      Session s{config == bsp2 ? "compressed-bsp" : "compressed-asp", config, {}};
      for (uint32_t w = 0; w < 2; ++w) s.Add(Message(kHello, w));
      for (int clock = 0; clock < 2; ++clock) {
        for (uint32_t w = 0; w < 2; ++w) {
          for (uint32_t t = 0; t < kTableCount; ++t) {
            for (uint8_t dtype : {0, 1}) {
              Step push = Push(w, t, 3);
              push.anomaly = 15;
              push.anomaly_value = dtype;
              push.text = dtype == 0 ? "\x0c" : "";
              Step pull = Pull(w, t, 3);
              pull.anomaly = 15;
              pull.anomaly_value = dtype;
              s.Add(push);
              s.Add(pull);
            }
          }
          s.Add(Tick(w));
        }
      }
      Step bad = Push(0, kSparseAdagrad, 2);
      bad.anomaly = 15;
      bad.anomaly_value = 0;
      bad.text = "\x7f";
      s.Add(bad);
      s.Add(Kind(kStatsCall));
      out.push_back(s);
    }
  }
  {
    // A change of the shard count, as `parasol scale --servers` makes it, on the job with 3
    // shards listed and 2 holding keys (this shard is rank 0): rows copied ahead (an export,
    // and an install of a shrink's), the change named by a tool, the workers' clocks past it,
    // then the change's export, commit and drop; a checkpoint and a restart after it.
    Session s{"reshard", ConfigByte(JobSpec::Mode::kBsp, 3, 2), {}};
    const std::string keys = "\x01\x02\x03\x04\x05\x06";
    for (uint32_t w = 0; w < 2; ++w) s.Add(Message(kHello, w));
    for (int round = 0; round < 2; ++round) {
      for (uint32_t w = 0; w < 2; ++w) {
        s.Add(Pull(w, kSparseAdagrad, 6, keys));
        s.Add(Push(w, kSparseAdagrad, 6, keys));
        s.Add(Tick(w));
      }
    }
    auto migrate = [](uint8_t step, uint8_t count, uint8_t clock, uint8_t rows) {
      Step m = Message(kMigrate, 0);
      m.worker = 6;  // a tool: outside the job
      m.seq = step;  // 0 export, 1 install, 2 commit, 3 drop
      m.done = count;  // shard count 1 + done % 4
      m.clock = clock;  // 0-1: a copy ahead; 2-3: the change shard 0 named
      m.table = kSparseAdagrad;
      m.shape.rows = rows;
      m.keys.bytes = "\x01\x02\x03\x04\x05\x06";
      return m;
    };
    s.Add(migrate(0, 2, 0, 0));  // a copy ahead of 3 shards: export
    s.Add(migrate(1, 0, 0, 2));  // a copy ahead of 1 shard: install
    Step name = Message(kMembership, 0);
    name.worker = 6;
    name.seq = 3;  // 3 shards
    s.Add(name);
    for (int round = 0; round < 4; ++round) {
      for (uint32_t w = 0; w < 2; ++w) {
        s.Add(Pull(w, kSparseAdagrad, 6, keys));
        s.Add(Push(w, kSparseAdagrad, 6, keys));
        s.Add(Push(w, kDenseSgd, 10));  // past the change's clock: the new slice's elements only
        s.Add(Tick(w));
      }
    }
    s.Add(migrate(0, 2, 2, 0));  // the change's export
    // A dense tensor's export (this shard's elements past its new slice), and an install of
    // consecutive elements it does not gain (refused).
    Step dense_export = migrate(0, 2, 2, 0);
    dense_export.table = kDenseAdam;
    s.Add(dense_export);
    Step dense_install = migrate(1, 2, 2, 4);
    dense_install.table = kDenseAdam;
    dense_install.keys.mode = 1;  // base + i
    dense_install.keys.base = 30;
    s.Add(dense_install);
    s.Add(migrate(2, 2, 2, 0));  // commit
    s.Add(migrate(3, 2, 2, 0));  // drop (the dense slices cut to the new placement's)
    s.Add(Kind(kStatsCall));
    s.Add(Message(kCheckpoint, 0));
    s.Add(Kind(kRestart));
    s.Add(Pull(0, kSparseAdagrad, 6, keys));
    s.Add(Pull(0, kDenseAdam, 255));
    out.push_back(s);
  }
  {
    // Each header anomaly once, then a message of raw frames.
    Session s{"anomalies", ssp2, {}};
    for (uint8_t a = 11; a <= 15; ++a) {
      Step p = Push(0, kSparseRowwise, 2);
      p.anomaly = a;
      p.anomaly_value = a == 13 ? 2 : 9;
      p.text = "hi";
      s.Add(p);
    }
    Step wrong_hash = Message(kHello, 1);
    wrong_hash.hello = 7;
    s.Add(wrong_hash);
    Step outsider = Pull(0, kSparseAdagrad, 2);
    outsider.worker = 5;
    s.Add(outsider);
    Step raw = Kind(kRaw);
    raw.raw_frames = {"PSOL", std::string(8, '\0')};
    s.Add(raw);
    s.Add(Message(kError, 0));
    s.Add(Message(kShutdown, 0));
    out.push_back(s);
  }
  return out;
}

}  // namespace
}  // namespace parasol::fuzz

int main(int argc, char** argv) {
  using namespace parasol::fuzz;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_request_seeds DIR\n");
    return 2;
  }
  std::vector<Session> sessions;
  for (auto mode :
       {JobSpec::Mode::kBsp, JobSpec::Mode::kSsp1, JobSpec::Mode::kSsp2, JobSpec::Mode::kAsp}) {
    for (uint32_t layout = 0; layout < 3; ++layout)
      sessions.push_back(FullSession(mode, layout, 2));
    sessions.push_back(FullSession(mode, 1, 3));
  }
  for (Session& s : FocusedSessions()) sessions.push_back(std::move(s));
  for (const Session& s : sessions) {
    const std::string bytes = Encode(s);
    if (!RoundTrips(bytes, s.steps.size())) {
      std::fprintf(stderr, "fuzz_request_seeds: %s does not read back as written\n",
                   s.name.c_str());
      return 1;
    }
    std::ofstream out(std::string(argv[1]) + "/" + s.name, std::ios::binary);
    out << bytes;
    if (!out) {
      std::fprintf(stderr, "fuzz_request_seeds: cannot write %s\n", s.name.c_str());
      return 1;
    }
  }
  return 0;
}
