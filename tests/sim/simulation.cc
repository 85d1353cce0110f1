#include "tests/sim/simulation.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "common/env.hpp"
#include "common/manifest.hpp"
#include "common/placement.hpp"
#include "common/protocol.hpp"
#include "common/sharding.hpp"
#include "common/wire.hpp"
#include "server/checkpoint.hpp"
#include "server/shard_server.hpp"
#include "server/shard_state.hpp"
#include "tests/sim/sim_file_system.hpp"
#include "worker/ps_client.hpp"
#include "worker/reshard.hpp"
#include "worker/trainer.hpp"

namespace parasol::sim {
namespace {

using Clock = std::chrono::steady_clock;
using Frames = std::vector<std::string>;
using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr uint32_t kDim = 4;
constexpr uint32_t kDense = 24;
constexpr uint32_t kKeysPerStep = 6;
constexpr uint64_t kKeySpace = 40;
constexpr int kScheduler = -1;
constexpr auto kVirtualLimit = std::chrono::seconds(900);
constexpr uint64_t kEventLimit = 20'000'000;

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t HashBytes(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

// The keys worker `rank` pulls and pushes at `step` (repeats allowed: the client sums them).
std::vector<uint64_t> KeysOf(uint32_t rank, uint32_t step) {
  std::vector<uint64_t> keys;
  for (uint32_t i = 0; i < kKeysPerStep; ++i) {
    keys.push_back(1 + Mix((uint64_t{rank} << 40) ^ (uint64_t{step} << 8) ^ i) % kKeySpace);
  }
  return keys;
}

std::string ManifestText(const SimJob& job, const std::string& dir) {
  std::string servers;
  for (uint32_t s = 0; s < job.shards; ++s) {
    servers += (s ? ", " : "") + std::string("127.0.0.1:") + std::to_string(20000 + s);
  }
  return "cluster:\n  servers: [" + servers + "]\n" +
         (job.scale_to ? "  initial_servers: " + std::to_string(job.serving) + "\n" : "") +
         "  workers: " + std::to_string(job.workers) +
         (job.elastic ? "\n  max_workers: " + std::to_string(job.workers + 1) : std::string()) +
         "\n  request_timeout: 300ms\n  connect_timeout: 20s\n  request_retries: 40\n"
         "server: {engine_threads: 2, apply_after_reply: always}\n" +
         (job.asp   ? std::string("training: {consistency: asp, worker_timeout: 60s}\n")
          : job.ssp ? "training: {consistency: ssp, staleness: " + std::to_string(job.staleness) +
                          ", worker_timeout: 60s}\n"
                    : std::string("training: {consistency: bsp, worker_timeout: 60s}\n")) +
         "checkpoint: {dir: " + dir + ", every_steps: " + std::to_string(job.every_steps) +
         ", keep: 3, background: " + (job.background ? "true" : "false") + "}\n" +
         "tables:\n"
         "  - {name: e, kind: sparse, dim: " + std::to_string(kDim) +
         (job.ssp ? ", init: {kind: zeros}" : "") + ", optimizer: {kind: sgd, lr: 0.5}}\n"
         "  - name: w\n    kind: dense\n    shape: [" + std::to_string(kDense) +
         "]\n" + (job.ssp ? "    init: {kind: zeros}\n" : "") +
         "    optimizer: {kind: sgd, lr: 0.25}\n";
}

class Sim;

// The environment of one simulated process: the simulation's clock, randomness, network,
// disk and fault points.
class SimEnv final : public Env {
 public:
  // A worker's (worker >= 0) or shard `shard`'s (worker < 0).
  SimEnv(Sim* sim, int worker, int shard = -1) : sim_(sim), worker_(worker), shard_(shard) {}
  Clock::time_point Now() override;
  uint64_t Random64() override;
  Result<std::unique_ptr<ShardLinks>> LinkShards(const Manifest&, uint32_t, const CurveKeyPair*,
                                                 const std::vector<std::string>&) override;
  FileSystem* Files() override;
  Fault Hit(std::string_view point) override;
  std::unique_ptr<AsideTask> RunAside(std::function<void()> work) override;

 private:
  Sim* sim_;
  int worker_;
  int shard_;
};

// A worker's connection to a shard.
struct Conn {
  uint64_t gen = 1;    // the connection's identity; a new one each time it is made again
  // A killed worker's connection: what it had sent is still delivered (the kernel sends what
  // it holds before it closes the socket); replies to it are not.
  uint64_t draining = 0;
  bool open = false;   // the worker holds it
  bool up = false;     // connected
  bool cut = false;    // the network between them is cut
  std::deque<Frames> queued;  // sent while not connected
  Clock::time_point last_to_shard{}, last_to_worker{};
  // The replay the worker is sending on it (messages marked replay, sent at one instant to one
  // process of the shard): the newest Clock it has sent so far.
  struct {
    bool active = false;
    uint64_t epoch = 0;
    Clock::time_point at{};
    int64_t clock = INT64_MIN;
  } replay;
};

struct WorkerProc {
  enum class State { kDown, kRunning, kWaiting, kDone, kFailed };
  uint32_t rank = 0;
  State state = State::kDown;
  bool killed = false;
  uint64_t wake = 0;  // the timer that may wake it (older timers are stale)
  std::thread thread;
  std::unique_ptr<SimEnv> env;
  std::vector<std::deque<Frames>> inbox;
  std::vector<bool> reconnected;
  Status result;
  uint32_t incarnations = 0;
  bool restart_due = false;
  uint32_t kill_at_send = 0;  // killed at its n-th send from now (0: not)
  uint32_t drop_at_send = 0;  // its n-th push from now is lost (0: none)
  Clock::time_point started{};  // when this process started
};

// Work a shard runs beside its requests (a background checkpoint's write): an event of the
// schedule, run when it comes unless the process died first; Wait() runs it now, unless the
// process is being killed (its destructor waits): then it never runs.
struct AsideWork {
  std::function<void()> work;
  bool done = false;
};

struct ShardProc {
  std::unique_ptr<SimEnv> env;
  std::unique_ptr<ShardServer> server;
  // Dies (its process, or its whole host) at its `die_hits`-th pass of fault point `die_at`
  // (common/fault_points.hpp) from now, if that comes before `die_by`.
  std::string die_at;
  uint32_t die_hits = 0;
  bool die_with_host = false;
  Clock::time_point die_by{};
  // Dead since a fault point: what it does until the kill takes effect reaches no one.
  bool dying = false;
  bool killing = false;  // its process is being destroyed (KillShard)
  uint64_t lost_replays = 0;  // over all its processes
  bool restart_due = false;
  Clock::time_point up_since{};
  uint32_t restarts = 0;
};

class Sim {
 public:
  Sim(const SimJob& job, uint64_t seed, const SimOptions* faults, const Reference* reference)
      : job_(job),
        rng_(seed),
        disk_rng_(Mix(seed) ^ 0xd15c),
        fs_([this] { return disk_rng_(); }),
        faults_(faults),
        reference_(reference) {
    // On the simulated disk (in memory): each shard's folder is on a host of its own.
    dir_ = "/sim/checkpoints";
    Result<Manifest> m = ParseManifest(ManifestText(job, dir_), "sim");
    if (!m.ok()) {
      Fail("the simulated job's manifest: " + m.status().ToString());
      return;
    }
    manifest_ = *m;
    now_ = Clock::time_point(std::chrono::hours(1));
    shards_.resize(job.shards);
    // The scale tool, when the job changes its shard count, is one more process after the
    // workers (not in the run without faults, which keeps its shards).
    has_tool_ = job.scale_to > 0 && reference != nullptr;
    workers_.resize(Ranks() + (has_tool_ ? 1 : 0));
    conns_.assign(workers_.size() * job.shards, Conn{});
    for (uint32_t w = 0; w < workers_.size(); ++w) workers_[w].rank = w;
  }

  ~Sim() {
    // A failed run may leave workers waiting: end them.
    for (WorkerProc& w : workers_) {
      if (w.state == WorkerProc::State::kWaiting) {
        w.killed = true;
        Resume(w);
      }
      if (w.thread.joinable()) w.thread.join();
    }
    // As at a kill: a background write still pending never runs.
    for (ShardProc& s : shards_) {
      s.killing = s.dying = true;
      s.server.reset();
    }
  }

  // Runs the job to its end (or a failed check); what it pulled and ended in.
  void Run() {
    if (!failure_.empty()) return;
    const Clock::time_point start = now_;
    for (uint32_t s = 0; s < job_.shards; ++s) StartShard(s);
    for (uint32_t r = 0; r < Ranks(); ++r) {
      At(now_ + Delay(), [this, r] { StartWorker(workers_[r]); });
    }
    At(now_ + milliseconds(20), [this] { Periodic(); });
    if (faults_) ScheduleFaults();
    if (has_tool_) {
      // The change starts at a drawn moment of the run without faults (or after its end).
      const double at = reference_->seconds * (Draw(10000) / 1e4);
      At(now_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)),
         [this] { StartWorker(workers_[Ranks()]); });
    }
    while (failure_.empty() && !AllDone()) {
      if (events_.empty()) {
        Fail("nothing left to happen, and workers " + Waiting() + " wait (a deadlock)");
        break;
      }
      Event e = events_.top();
      events_.pop();
      now_ = e.at;
      if (now_ - start > kVirtualLimit || ++event_count_ > kEventLimit) {
        Fail("the job did not end within " + std::to_string(kVirtualLimit.count()) +
             " s of virtual time (workers " + Waiting() + " wait)");
        break;
      }
      e.fn();
    }
    seconds_ = std::chrono::duration<double>(now_ - start).count();
    if (!failure_.empty()) {
      // What the shards up at the failure had counted (a loss, a rollback barred) says whether
      // it is one the job may stop on.
      for (ShardProc& p : shards_) NoteLost(p);
      return;
    }
    // The model, from every shard (each up: a shard down at the end restarts first, and one
    // that died at a fault point is killed, its host with it, and restarts from its disk).
    for (uint32_t s = 0; s < job_.shards; ++s) {
      if (shards_[s].dying) KillShard(s, shards_[s].die_with_host);
      if (!shards_[s].server) StartShard(s);
      if (!failure_.empty()) return;
      ShardProc& p = shards_[s];
      NoteLost(p);
      Status st = p.server->VisitModel([&](const CheckpointBlock& b) { Record(s, b); });
      if (!st.ok()) Fail("shard " + std::to_string(s) + "'s model: " + st.ToString());
    }
  }

  // --- the environment ---
  Clock::time_point Now() const { return now_; }
  uint64_t Random64() { return rng_(); }
  std::unique_ptr<ShardLinks> Links(uint32_t worker);

  // --- what a worker's links do (on the worker's thread, while the scheduler waits) ---
  Conn& ConnOf(uint32_t worker, uint32_t shard) { return conns_[worker * job_.shards + shard]; }
  void OpenConn(WorkerProc& w, uint32_t s, bool again) {
    Conn& c = ConnOf(w.rank, s);
    ++c.gen;
    c.queued.clear();
    c.open = true;
    c.up = shards_[s].server && !c.cut;
    w.inbox[s].clear();
    if (again && c.up) w.reconnected[s] = true;
  }
  void CloseConns(WorkerProc& w) {
    for (uint32_t s = 0; s < job_.shards; ++s) {
      Conn& c = ConnOf(w.rank, s);
      if (c.up) c.draining = c.gen;
      ++c.gen;
      c.open = c.up = false;
      c.queued.clear();
    }
  }
  // As AnyFaultUnderWay(), leaving out w's own armed drop.
  bool OtherFaultUnderWay(WorkerProc& w) {
    const uint32_t armed = w.drop_at_send;
    w.drop_at_send = 0;
    const bool other = AnyFaultUnderWay();
    w.drop_at_send = armed;
    return other;
  }
  static bool IsPush(const Frames& frames) {
    if (frames.empty()) return false;
    Result<Header> h = DecodeHeader(frames[0].data(), frames[0].size());
    return h.ok() && (h->op == Op::PushSparse || h->op == Op::PushDense);
  }
  // A replay goes in clock order (worker/replay_plan.hpp): its Clocks one after another, each
  // followed by its clock's pushes. The shard refuses a tick whose pushes are missing and takes
  // them late, so a replay sent out of order would still end in the same model: this checks
  // the order as it is sent.
  void CheckReplayOrder(WorkerProc& w, uint32_t s, const Frames& frames) {
    if (frames.empty()) return;
    Result<Header> h = DecodeHeader(frames[0].data(), frames[0].size());
    if (!h.ok()) return;
    auto& r = ConnOf(w.rank, s).replay;
    if (!h->replay) {
      r.active = false;
      return;
    }
    if (!r.active || r.epoch != h->known_epoch || r.at != now_) {
      r.active = true;
      r.epoch = h->known_epoch;
      r.at = now_;
      r.clock = INT64_MIN;
    }
    if (h->op != Op::Clock) return;
    if (r.clock != INT64_MIN && h->clock != r.clock + 1) {
      Fail(Name(w) + "'s replay to shard " + std::to_string(s) + " sent its Clock to " +
           std::to_string(h->clock) + " right after its Clock to " + std::to_string(r.clock) +
           " (a replay's Clocks go up one at a time)");
    }
    r.clock = h->clock;
  }
  void Send(WorkerProc& w, uint32_t s, Frames frames) {
    if (w.killed) return;
    CheckReplayOrder(w, s, frames);
    if (w.kill_at_send > 0 && --w.kill_at_send == 0) {
      // Killed as it sends: this message and the rest of the step are never sent.
      Log(Name(w) + " killed as it sends to shard " +
          std::to_string(s));
      w.killed = true;
      w.restart_due = true;
      At(now_ + milliseconds(1 + Draw(400)), [this, &w] { StartWorker(w); });
      return;
    }
    // Without overlaps, a message is lost only while no other fault is under way.
    const bool may_drop = faults_ && (faults_->overlap || !OtherFaultUnderWay(w));
    if (w.drop_at_send > 0 && may_drop && IsPush(frames) && --w.drop_at_send == 0) {
      last_drop_ = now_;
      // Lost on its way, the connection kept (what client.send=drop does to a real worker).
      // Only pushes: a lost pull is sent again only after training.worker_timeout (docs/internals.md).
      Log("worker " + std::to_string(w.rank) + "'s push to shard " + std::to_string(s) +
          " is lost");
      ++counts_.drops;
      return;
    }
    Conn& c = ConnOf(w.rank, s);
    if (!c.open) return;
    if (!c.up) {
      c.queued.push_back(std::move(frames));
      return;
    }
    Transmit(w.rank, s, std::move(frames));
  }
  Status Wait(WorkerProc& w, milliseconds wait) {
    if (w.killed) return Unavailable("killed by the simulation");
    for (uint32_t s = 0; s < job_.shards; ++s) {
      if (!w.inbox[s].empty() || w.reconnected[s]) return Status::Ok();
    }
    const uint64_t wake = ++w.wake;
    if (faults_ && faults_->verbose && ++wait_logs_ < 1000000) {
      Log(Name(w) + " waits " + std::to_string(wait.count()) + " ms");
    }
    // A poll takes a little time: a wait rounded down to 0 ms still lets time pass.
    At(now_ + std::max(wait, milliseconds(0)) + microseconds(100), [this, &w, wake] {
      if (w.wake == wake && w.state == WorkerProc::State::kWaiting) {
        Resume(w);
      } else if (faults_ && faults_->verbose) {
        Log(Name(w) + "'s timer is stale (" + std::to_string(w.wake) +
            " vs " + std::to_string(wake) + ", state " + std::to_string(static_cast<int>(w.state)) + ")");
      }
    });
    w.state = WorkerProc::State::kWaiting;
    Yield(w);
    w.state = WorkerProc::State::kRunning;
    if (w.killed) return Unavailable("killed by the simulation");
    return Status::Ok();
  }

  const SimJob& job() const { return job_; }
  const std::string& failure() const { return failure_; }
  double seconds() const { return seconds_; }
  FileSystem* files() { return &fs_; }
  // Shard `s` passes fault point `point`: it dies there when its armed death says so.
  Fault Hit(uint32_t s, std::string_view point) {
    ShardProc& p = shards_[s];
    if (p.dying || p.die_hits == 0 || point != p.die_at) return Fault::kNone;
    if (now_ > p.die_by) {
      p.die_hits = 0;  // its moment passed (no more checkpoints, say)
      return Fault::kNone;
    }
    if (--p.die_hits > 0) return Fault::kNone;
    // Dead from this instant: nothing it does from here reaches the disk or a worker.
    p.dying = true;
    ++counts_.point_deaths;
    fs_.Freeze(ShardPrefix(s));
    const bool host = p.die_with_host;
    Log("shard " + std::to_string(s) + (host ? "'s host crashes" : " dies") + " at " +
        std::string(point));
    At(now_, [this, s, host] { KillShard(s, host); });
    return Fault::kNone;
  }
  // Shard s's work beside its requests (SimEnv::RunAside): an event 1 to 100 ms from now, for
  // the process that asked only.
  std::unique_ptr<AsideTask> RunAside(uint32_t s, std::function<void()> work);
  void RunAsideNow(uint32_t s, AsideWork& w) {
    if (w.done || shards_[s].killing) return;  // a killed process's never runs
    w.work();
    w.done = true;
    ++counts_.aside_writes;
  }
  Reference& result() { return result_; }
  bool reported_loss() const { return reported_loss_; }
  bool rollback_barred() const { return rollback_barred_; }
  // Whether a restarted worker found its step's tick on some shards only (it died between its
  // ticks, or failures overlapped): the one loss a single failure may cause.
  bool loss_of_a_step() const { return loss_of_a_step_; }
  SimOutcome& counts() { return counts_; }

 private:
  struct Event {
    Clock::time_point at;
    uint64_t seq;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return std::tie(a.at, a.seq) > std::tie(b.at, b.seq);
    }
  };

  void At(Clock::time_point t, std::function<void()> fn) {
    events_.push(Event{t, ++seq_, std::move(fn)});
  }
  uint64_t Draw(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  // A message's time on the wire: mostly short, now and then long.
  Clock::duration Delay() {
    const uint64_t r = Draw(100);
    if (r < 90) return microseconds(20 + Draw(480));
    if (r < 99) return microseconds(1000 + Draw(9000));
    return milliseconds(20 + Draw(60));
  }
  bool IsTool(const WorkerProc& w) const { return has_tool_ && w.rank == Ranks(); }
  // The workers' ranks: the first ones, and a joiner (SimOptions::elastic).
  uint32_t Ranks() const { return job_.workers + (job_.elastic ? 1 : 0); }
  bool IsJoiner(const WorkerProc& w) const { return job_.elastic && w.rank == job_.workers; }
  bool IsLeaver(const WorkerProc& w) const { return job_.elastic && w.rank + 1 == job_.workers; }

  std::string Name(const WorkerProc& w) const {
    return IsTool(w) ? "the scale tool" : "worker " + std::to_string(w.rank);
  }
  void Fail(const std::string& what) {
    if (failure_.empty()) failure_ = what;
  }
  void Log(const std::string& line) {
    if (faults_ && faults_->verbose) {
      std::printf("[%9.3f ms] %s\n",
                  std::chrono::duration<double, std::milli>(now_.time_since_epoch()).count() -
                      3600e3,
                  line.c_str());
    }
  }

  // --- the network ---
  void Transmit(uint32_t worker, uint32_t s, Frames frames) {
    Conn& c = ConnOf(worker, s);
    const Clock::time_point t = std::max(c.last_to_shard, now_ + Delay());
    c.last_to_shard = t;
    const uint64_t gen = c.gen;
    At(t, [this, worker, s, gen, f = std::move(frames)]() mutable {
      Conn& c = ConnOf(worker, s);
      const bool delivered = (c.gen == gen && c.up) || c.draining == gen;
      if (!delivered || !shards_[s].server) return;  // lost with its connection
      std::vector<zmq::message_t> msg;
      const std::string id = std::to_string(worker) + ":" + std::to_string(gen);
      msg.emplace_back(id.data(), id.size());
      for (const std::string& p : f) msg.emplace_back(p.data(), p.size());
      shards_[s].server->HandleMessage(msg);
      // As a shard's serving loop does once it has drained what arrived.
      if (shards_[s].server) shards_[s].server->RunPeriodic();
    });
  }
  void Reply(uint32_t s, std::vector<zmq::message_t>& frames) {
    if (frames.empty() || shards_[s].dying) return;
    const std::string id(static_cast<const char*>(frames[0].data()), frames[0].size());
    const size_t colon = id.find(':');
    if (colon == std::string::npos) return;
    const uint32_t worker = static_cast<uint32_t>(std::stoul(id.substr(0, colon)));
    const uint64_t gen = std::stoull(id.substr(colon + 1));
    if (worker >= workers_.size()) return;
    Conn& c = ConnOf(worker, s);
    if (c.gen != gen || !c.up) return;
    Frames f;
    for (size_t i = 1; i < frames.size(); ++i) {
      f.emplace_back(static_cast<const char*>(frames[i].data()), frames[i].size());
    }
    const Clock::time_point t = std::max(c.last_to_worker, now_ + Delay());
    c.last_to_worker = t;
    At(t, [this, worker, s, gen, f = std::move(f)]() mutable {
      Conn& c = ConnOf(worker, s);
      WorkerProc& w = workers_[worker];
      if (c.gen != gen || !c.up) return;
      w.inbox[s].push_back(std::move(f));
      if (w.state == WorkerProc::State::kWaiting) Resume(w);
    });
  }
  // The connection is made again: what was queued goes, and the worker hears of it.
  void Reconnect(uint32_t worker, uint32_t s) {
    Conn& c = ConnOf(worker, s);
    WorkerProc& w = workers_[worker];
    if (faults_ && faults_->verbose) {
      Log("reconnect " + std::to_string(worker) + "-" + std::to_string(s) + ": open " +
          std::to_string(c.open) + " up " + std::to_string(c.up) + " cut " + std::to_string(c.cut));
    }
    if (!c.open || c.up || c.cut || !shards_[s].server) return;
    ++c.gen;
    c.up = true;
    std::deque<Frames> queued = std::move(c.queued);
    c.queued.clear();
    for (Frames& f : queued) Transmit(worker, s, std::move(f));
    w.reconnected[s] = true;
    Log(Name(w) + " connected to shard " + std::to_string(s) + " again");
    if (w.state == WorkerProc::State::kWaiting) Resume(w);
  }
  void Break(uint32_t worker, uint32_t s) {
    Conn& c = ConnOf(worker, s);
    ++c.gen;  // what was on its way is lost
    c.draining = 0;
    c.up = false;
  }

  // --- processes ---
  std::string ShardPrefix(uint32_t s) const { return dir_ + "/shard-" + std::to_string(s) + "/"; }
  void StartShard(uint32_t s) {
    ShardProc& p = shards_[s];
    p.restart_due = false;
    p.up_since = now_;
    p.env = std::make_unique<SimEnv>(this, -1, static_cast<int>(s));
    p.server = std::make_unique<ShardServer>(manifest_, s, p.env.get());
    p.server->set_reply_sink([this, s](std::vector<zmq::message_t>& f) { Reply(s, f); });
    Status st = p.server->Restore();
    if (!st.ok()) {
      Fail("shard " + std::to_string(s) + " could not restart: " + st.ToString());
      return;
    }
    Log("shard " + std::to_string(s) + " up (" + p.server->restored_from() + ")");
    for (uint32_t w = 0; w < workers_.size(); ++w) {
      At(now_ + microseconds(100 + Draw(2000)), [this, w, s] { Reconnect(w, s); });
    }
  }
  // Kills shard s's process; with `host`, its host crashes too (its disk keeps what was synced).
  void KillShard(uint32_t s, bool host = false) {
    ShardProc& p = shards_[s];
    if (!p.server) return;
    NoteLost(p);
    // As kill -9: what its destructor would still do (a background write it waits for, replies
    // to what it held) reaches neither its disk nor anyone.
    p.killing = true;
    p.dying = true;
    fs_.Freeze(ShardPrefix(s));
    p.server.reset();
    p.killing = false;
    p.restart_due = true;
    p.dying = false;
    p.die_hits = 0;
    ++p.restarts;
    if (host) {
      const uint64_t bytes = fs_.lost_bytes(), names = fs_.lost_names();
      fs_.Crash(ShardPrefix(s));
      ++counts_.host_crashes;
      Log("shard " + std::to_string(s) + "'s host crashed: " +
          std::to_string(fs_.lost_bytes() - bytes) + " bytes and " +
          std::to_string(fs_.lost_names() - names) + " names not synced are lost");
    } else {
      fs_.Thaw(ShardPrefix(s));
    }
    for (uint32_t w = 0; w < workers_.size(); ++w) Break(w, s);
    Log("shard " + std::to_string(s) + " killed");
    At(now_ + milliseconds(1 + Draw(400)), [this, s] { StartShard(s); });
  }
  void NoteLost(ShardProc& p) {
    if (!p.server) return;
    const std::string stats = p.server->StatsJson();
    const size_t at = stats.find("\"lost_replays\":");
    if (at == std::string::npos) return;
    const uint64_t lost = std::stoull(stats.substr(at + 15));
    if (lost > 0) reported_loss_ = true;
    p.lost_replays += lost;
    // A worker's rollback the shard that decides refused, as it would go back past a change
    // no rollback crosses (ShardServer::RollbackBarrier()).
    const size_t refused = stats.find("\"rollbacks_refused\":");
    if (refused != std::string::npos && std::stoull(stats.substr(refused + 20)) > 0) {
      rollback_barred_ = true;
    }
  }

  void StartWorker(WorkerProc& w) {
    w.restart_due = false;
    w.killed = false;
    w.kill_at_send = 0;
    w.drop_at_send = 0;
    w.started = now_;
    ++w.incarnations;
    w.inbox.assign(job_.shards, {});
    w.reconnected.assign(job_.shards, false);
    w.env = std::make_unique<SimEnv>(this, static_cast<int>(w.rank));
    w.state = WorkerProc::State::kRunning;
    Log(Name(w) + " starts (incarnation " +
        std::to_string(w.incarnations) + ")");
    w.thread = std::thread([this, &w] {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return running_ == static_cast<int>(w.rank); });
      }
      w.result = Body(w);
      CloseConns(w);
      w.state = w.killed ? WorkerProc::State::kDown
                         : (w.result.ok() ? WorkerProc::State::kDone : WorkerProc::State::kFailed);
      std::lock_guard<std::mutex> lk(mu_);
      running_ = kScheduler;
      cv_.notify_all();
    });
    Resume(w);
  }
  void KillWorker(WorkerProc& w) {
    w.killed = true;
    Resume(w);  // it unwinds: every wait fails from here on
    Log(Name(w) + " killed");
    w.restart_due = true;
    At(now_ + milliseconds(1 + Draw(400)), [this, &w] { StartWorker(w); });
  }

  // Lets worker w run until it waits again or ends (the only place a worker runs).
  void Resume(WorkerProc& w) {
    ++w.wake;
    {
      std::unique_lock<std::mutex> lk(mu_);
      running_ = static_cast<int>(w.rank);
      cv_.notify_all();
      cv_.wait(lk, [&] { return running_ == kScheduler; });
    }
    if (w.state == WorkerProc::State::kDone || w.state == WorkerProc::State::kFailed ||
        w.state == WorkerProc::State::kDown) {
      if (w.thread.joinable()) w.thread.join();
      w.inbox.assign(job_.shards, {});
      if (w.state == WorkerProc::State::kFailed) {
        const std::string what = w.result.ToString();
        Log(Name(w) + " failed: " + what);
        // A worker that stops on a replay that could not be made says so: a reported loss.
        if (what.find("are lost") != std::string::npos ||
            what.find("would be lost") != std::string::npos) {
          reported_loss_ = true;
        }
        Fail(Name(w) + " failed: " + what);
      }
    }
  }
  // On worker w's thread: hands the turn back to the scheduler until w is resumed.
  void Yield(WorkerProc& w) {
    std::unique_lock<std::mutex> lk(mu_);
    running_ = kScheduler;
    cv_.notify_all();
    cv_.wait(lk, [&] { return running_ == static_cast<int>(w.rank); });
  }

  // The worker's training: per step, pull the rows and the dense weights, push gradients made
  // from them, tick (with the pulls and the pushes each in one message per shard when fused).
  Status Body(WorkerProc& w) {
    if (IsTool(w)) return ToolBody(w);
    // A rollback of the job (Aborted): the worker connects again, as the trainer does
    // (TrainerHooks::reconnect), and redoes its steps from where the shards went back to.
    for (uint32_t round = 0;; ++round) {
      Status st = BodyOnce(w);
      if (st.code() != StatusCode::kAborted || w.killed || round >= Trainer::kMaxRollbacks) {
        return st;
      }
      ++counts_.worker_rollbacks;
      Log(Name(w) + ": " + st.message());
    }
  }
  // The scale tool: `parasol scale --servers N` (worker/reshard.hpp) as an operator runs it,
  // from a tool's key; run again after a kill, it finishes the change it left.
  Status ToolBody(WorkerProc& w) {
    auto killed = [&] { return w.killed ? Unavailable("killed") : Status::Ok(); };
    Result<std::unique_ptr<PsClient>> connected =
        PsClient::Connect(manifest_, PsClient::kObserver, "", {}, false, w.env.get());
    PARASOL_RETURN_IF_ERROR(killed());
    PARASOL_RETURN_IF_ERROR(connected.status());
    Result<ReshardReport> report = Reshard(**connected, job_.scale_to, std::chrono::seconds(60));
    PARASOL_RETURN_IF_ERROR(killed());
    PARASOL_RETURN_IF_ERROR(report.status());
    ++counts_.reshards;
    Log("the scale tool: " + report->ToString());
    return Status::Ok();
  }
  Status BodyOnce(WorkerProc& w) {
    auto killed = [&] { return w.killed ? Unavailable("killed") : Status::Ok(); };
    Result<std::unique_ptr<PsClient>> connected =
        PsClient::Connect(manifest_, w.rank, "", {}, IsJoiner(w), w.env.get());
    PARASOL_RETURN_IF_ERROR(killed());
    // A worker that died between its ticks, and whose step cannot be redone (across a change
    // of the shard count), stops with that loss (PsClient::Connect).
    if (!connected.ok() && connected.status().message().find(
                               "restarted after its tick out of step") != std::string::npos) {
      reported_loss_ = true;
      loss_of_a_step_ = true;
    }
    PARASOL_RETURN_IF_ERROR(connected.status());
    PsClient& client = **connected;
    if (IsJoiner(w)) {
      if (client.membership().join(w.rank) != 2) {
        return Internal("the joiner joins at clock " +
                        std::to_string(client.membership().join(w.rank)) + ", not 2");
      }
      joiner_in_ = true;
    }
    if (IsLeaver(w) && client.membership().leave(w.rank) < 0) {
      // Before the first barrier, so that no worker is past the clock asked for.
      Result<int64_t> at = client.RequestLeave(job_.leave_at);
      PARASOL_RETURN_IF_ERROR(killed());
      PARASOL_RETURN_IF_ERROR(at.status());
    }
    // Nor does any pass the first barrier (the leaver's) before the joiner's clock is named:
    // shard 0 names the next clock it can, 2 while every worker is at 0. (Bounded by the
    // simulation's limit of virtual time.)
    while (IsLeaver(w) && !joiner_in_ && client.resumed_clock() < 0 &&
           client.last_barrier_seen() < 0) {
      if (workers_[job_.workers].state == WorkerProc::State::kFailed) {
        return Internal("the joiner failed before it joined");
      }
      Status idle = client.Idle(milliseconds(5));
      PARASOL_RETURN_IF_ERROR(killed());
      PARASOL_RETURN_IF_ERROR(idle);
    }
    if (IsLeaver(w) && client.membership().leave(w.rank) != job_.leave_at) {
      return Internal("the leaver leaves at clock " +
                      std::to_string(client.membership().leave(w.rank)) + ", not " +
                      std::to_string(job_.leave_at));
    }
    if (!client.lost_step().empty()) {
      Log(client.lost_step());
      reported_loss_ = true;
      loss_of_a_step_ = true;
    }
    // A worker that had finished goes on to the end as the trainer does (no step left): it
    // leaves and meets the others at the last barrier, so that a rollback before the job ends
    // finds it there and it redoes its steps.
    // As the trainer: all meet before the first step, unless this is a restart after the
    // others passed that barrier.
    if (MeetsAtStart(client, w.rank)) {
      Status met = client.Barrier(0);
      PARASOL_RETURN_IF_ERROR(killed());
      PARASOL_RETURN_IF_ERROR(met);
    }
    const uint32_t start = static_cast<uint32_t>(std::max<int64_t>(0, client.resumed_clock()));
    Log("worker " + std::to_string(w.rank) + " at step " + std::to_string(start));
    std::vector<float> rows(kKeysPerStep * kDim), dense(kDense), grows(rows.size()),
        gdense(kDense);
    // A rank that leaves trains the steps before its leave clock.
    const int64_t leave = client.membership().leave(w.rank);
    const uint32_t end =
        leave >= 0 ? std::min<uint32_t>(job_.steps, static_cast<uint32_t>(leave)) : job_.steps;
    for (uint32_t step = start; step < end; ++step) {
      if (client.clock() != step) {
        return Internal("worker at step " + std::to_string(step) + " has clock " +
                        std::to_string(client.clock()));
      }
      const std::vector<uint64_t> keys = KeysOf(w.rank, step);
      if (job_.fused) client.BeginStep();
      Result<PsClient::Ticket> pull_rows = client.PullSparseAsync(0, keys, rows.data());
      Result<PsClient::Ticket> pull_dense = client.PullDenseAsync(1, dense.data());
      if (job_.fused) client.SendStep();
      PARASOL_RETURN_IF_ERROR(pull_rows.status());
      PARASOL_RETURN_IF_ERROR(pull_dense.status());
      Status a = client.Wait(*pull_rows), b = client.Wait(*pull_dense);
      PARASOL_RETURN_IF_ERROR(killed());
      PARASOL_RETURN_IF_ERROR(a);
      PARASOL_RETURN_IF_ERROR(b);
      if (job_.ssp) {
        PARASOL_RETURN_IF_ERROR(CheckStaleness(w.rank, step, dense));
        SspGradients(w.rank, step, keys, &grows, &gdense);
      } else {
      uint64_t h = HashBytes(rows.data(), rows.size() * sizeof(float), 0xcbf29ce484222325ull);
      h = HashBytes(dense.data(), dense.size() * sizeof(float), h);
      NotePull(w.rank, step, h);
      // As in a real model, every gradient depends on everything pulled (here through the sum
      // of the dense weights and the mean of the rows).
      float dense_sum = 0, row_mean = 0;
      for (float v : dense) dense_sum += v;
      for (float v : rows) row_mean += v / static_cast<float>(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        grows[i] = 0.05f * rows[i] + 0.01f * static_cast<float>((keys[i / kDim] + i) % 7) -
                   0.02f * static_cast<float>(w.rank) + 0.01f * dense_sum;
      }
      for (uint32_t i = 0; i < kDense; ++i) {
        gdense[i] = 0.03f * dense[i] + 0.001f * static_cast<float>(i % 5 + w.rank + step) +
                    0.02f * row_mean;
      }
      }
      if (job_.fused) client.BeginStep();
      Result<PsClient::Ticket> push_rows = client.PushSparseAsync(0, keys, grows);
      Result<PsClient::Ticket> push_dense = client.PushDenseAsync(1, gdense);
      if (job_.fused) client.SendStep();
      Result<PsClient::Ticket> tick = client.TickAsync();
      PARASOL_RETURN_IF_ERROR(push_rows.status());
      PARASOL_RETURN_IF_ERROR(push_dense.status());
      PARASOL_RETURN_IF_ERROR(tick.status());
      Status c = client.Wait(*push_rows), d = client.Wait(*push_dense), e = client.Wait(*tick);
      PARASOL_RETURN_IF_ERROR(killed());
      PARASOL_RETURN_IF_ERROR(c);
      PARASOL_RETURN_IF_ERROR(d);
      PARASOL_RETURN_IF_ERROR(e);
      if (client.push_log_bytes() > manifest_.checkpoint.max_log_bytes) {
        return Internal("the push log holds " + std::to_string(client.push_log_bytes()) +
                        " bytes, over its bound");
      }
    }
    // And after the last: a worker exits (its push log with it) only once every shard's
    // checkpoint holds what it pushed.
    Status left = client.Leave();
    PARASOL_RETURN_IF_ERROR(killed());
    PARASOL_RETURN_IF_ERROR(left);
    // One that left the running job goes without meeting the others (as the trainer).
    if (leave >= 0 && client.clock() >= leave) return Status::Ok();
    Status met = client.Barrier(1);
    PARASOL_RETURN_IF_ERROR(killed());
    return met;
  }

  // SSP: in each shard's slice of the dense table, element r counts worker r's steps applied
  // there (each of its pushes adds 1, and the optimizer steps by -0.25). A pull at step s must
  // see at least s - staleness of every worker's steps on every shard (each clock's pushes
  // come before its tick), and none beyond the job's.
  bool IsCounter(uint32_t element, uint32_t* worker) const {
    for (uint32_t s = 0; s < job_.shards; ++s) {
      const SliceRange slice = DenseSlice(kDense, s, job_.shards);
      if (element >= slice.begin && element < slice.begin + job_.workers) {
        *worker = static_cast<uint32_t>(element - slice.begin);
        return true;
      }
    }
    return false;
  }
  Status CheckStaleness(uint32_t rank, uint32_t step, const std::vector<float>& dense) {
    for (uint32_t i = 0; i < kDense; ++i) {
      uint32_t r = 0;
      if (!IsCounter(i, &r)) continue;
      const float count = -dense[i] / 0.25f;
      // Under ASP a pull may see none of another worker's steps.
      const int64_t least = job_.asp ? 0 : int64_t{step} - job_.staleness;
      if (!(count >= static_cast<float>(least)) || !(count <= static_cast<float>(job_.steps)) ||
          count != std::floor(count)) {
        const std::string what = "worker " + std::to_string(rank) + " pulled at step " +
                                 std::to_string(step) + " a model holding " +
                                 std::to_string(count) + " steps of worker " + std::to_string(r) +
                                 " on the shard of dense element " + std::to_string(i) +
                                 " (the staleness bound " + std::to_string(job_.staleness) +
                                 " asks for at least " + std::to_string(least) + ", at most " +
                                 std::to_string(job_.steps) + ")";
        Fail(what);
        return Internal(what);
      }
    }
    return Status::Ok();
  }
  // SSP's gradients: of the worker, the step and the key only, small multiples of 1/16.
  void SspGradients(uint32_t rank, uint32_t step, const std::vector<uint64_t>& keys,
                    std::vector<float>* grows, std::vector<float>* gdense) const {
    for (size_t i = 0; i < grows->size(); ++i) {
      (*grows)[i] =
          static_cast<float>(static_cast<int>((keys[i / kDim] * 7 + i + rank + step) % 9) - 4) *
          0.0625f;
    }
    for (uint32_t i = 0; i < kDense; ++i) {
      uint32_t r = 0;
      (*gdense)[i] = IsCounter(i, &r)
                         ? (r == rank ? 1.0f : 0.0f)
                         : static_cast<float>(static_cast<int>((i * 3 + rank + step) % 7) - 3) *
                               0.125f;
    }
  }

  void NotePull(uint32_t worker, uint32_t step, uint64_t h) {
    const auto key = std::make_pair(worker, step);
    if (!reference_) {
      auto [it, fresh] = result_.pulls.emplace(key, h);
      if (!fresh && it->second != h) {
        Fail("worker " + std::to_string(worker) + " pulled other values at step " +
             std::to_string(step) + " the second time (a run without faults)");
      }
      return;
    }
    auto it = reference_->pulls.find(key);
    if ((it == reference_->pulls.end() || it->second != h) && pull_mismatch_.empty()) {
      pull_mismatch_ = "worker " + std::to_string(worker) + " pulled at step " +
                       std::to_string(step) + " other values than the run without faults";
      Log(pull_mismatch_);
    }
  }

 public:
  const std::string& pull_mismatch() const { return pull_mismatch_; }

 private:
  // The placement the job ends in: the serving shards it started with, changed to the scale
  // tool's count once the tool has finished.
  Placement FinalPlacement() const {
    Placement p(job_.scale_to ? job_.serving : job_.shards);
    if (has_tool_ && counts_.reshards > 0) p = p.Resized(job_.scale_to);
    return p;
  }
  void Record(uint32_t shard, const CheckpointBlock& b) {
    const Placement final_placement = FinalPlacement();
    const auto kind = static_cast<CheckpointBlockKind>(b.kind);
    if (kind == CheckpointBlockKind::kSparseRows && b.count > 0) {
      const size_t row = b.bytes.size() / b.count;
      for (uint64_t i = 0; i < b.count; ++i) {
        const char* p = b.bytes.data() + i * row;
        uint64_t key;
        std::memcpy(&key, p, sizeof(key));
        // Held where the job's last placement puts it: a row left behind on a shard that no
        // longer serves its key would never be read or updated again.
        if (const uint32_t placed = final_placement.ShardOf(key); placed != shard) {
          Fail("key " + std::to_string(key) + " of table " + std::to_string(b.table) +
               " is held by shard " + std::to_string(shard) + " at the end, but placed on " +
               std::to_string(placed));
        }
        // The values and the optimizer's state; the clock word after the key is left out.
        if (!result_.model.emplace(std::make_pair(b.table, key), std::string(p + 12, row - 12))
                 .second) {
          Fail("key " + std::to_string(key) + " of table " + std::to_string(b.table) +
               " is held by two shards at the end (shard " + std::to_string(shard) + " too)");
        }
      }
      return;
    }
    if (kind != CheckpointBlockKind::kDenseSlice && kind != CheckpointBlockKind::kDenseRange) {
      return;
    }
    // A dense table's elements by their index, wherever the shard count put them: the block's
    // arrays (values, then each optimizer state array) for the elements it holds, of which
    // those in its live range serve (the others are held for a change of the shard count).
    const uint64_t total = manifest_.tables[b.table].NumElements();
    SliceRange held = DenseSlice(total, shard, job_.shards), live = held;
    size_t header = 0;
    if (kind == CheckpointBlockKind::kDenseRange) {
      int64_t bounds[3];
      header = sizeof(bounds);
      if (b.bytes.size() < header) return Fail("a dense range block without its bounds");
      std::memcpy(bounds, b.bytes.data(), sizeof(bounds));
      held = {static_cast<uint64_t>(bounds[0]), static_cast<uint64_t>(bounds[0]) + b.count};
      live = {static_cast<uint64_t>(bounds[1]), static_cast<uint64_t>(bounds[2])};
    }
    if (b.count == 0 || live.begin >= live.end) return;
    const size_t arrays = (b.bytes.size() - header) / sizeof(float) / b.count;
    for (uint64_t e = live.begin; e < live.end; ++e) {
      if (const uint32_t placed = final_placement.DenseShardOf(total, e); placed != shard) {
        Fail("element " + std::to_string(e) + " of dense table " + std::to_string(b.table) +
             " serves on shard " + std::to_string(shard) + " at the end, but is placed on " +
             std::to_string(placed));
      }
      std::string v;
      for (size_t a = 0; a < arrays; ++a) {
        const char* at = b.bytes.data() + header + (a * b.count + (e - held.begin)) * sizeof(float);
        v.append(at, sizeof(float));
      }
      if (!result_.model.emplace(std::make_pair(b.table, (uint64_t{1} << 62) | e), v).second) {
        Fail("element " + std::to_string(e) + " of dense table " + std::to_string(b.table) +
             " serves on two shards at the end (shard " + std::to_string(shard) + " too)");
      }
    }
  }

  void Periodic() {
    for (ShardProc& p : shards_) {
      if (p.server) p.server->RunPeriodic();
    }
    At(now_ + milliseconds(20), [this] { Periodic(); });
  }

  // The seed's faults, at moments drawn over the length of the run without faults.
  void ScheduleFaults() {
    const uint32_t n = static_cast<uint32_t>(Draw(faults_->max_faults + 1));
    const double span = std::max(0.05, reference_->seconds * 1.1);
    for (uint32_t i = 0; i < n; ++i) {
      const auto at = now_ + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(span * (Draw(10000) / 1e4)));
      const uint64_t kind = Draw(faults_->overlap ? 100 : 90);
      At(at, [this, kind] { Inject(kind); });
    }
  }
  void Inject(uint64_t kind) {
    if (AllDone()) return;
    // A kill may take the scale tool too; a lost push or a kill at a send only a worker.
    auto live_worker = [&](bool or_tool = false) -> WorkerProc* {
      std::vector<WorkerProc*> live;
      for (WorkerProc& w : workers_) {
        if (w.state == WorkerProc::State::kWaiting && (or_tool || !IsTool(w))) live.push_back(&w);
      }
      return live.empty() ? nullptr : live[Draw(live.size())];
    };
    auto live_shard = [&]() -> int {
      std::vector<uint32_t> live;
      for (uint32_t s = 0; s < job_.shards; ++s) {
        if (shards_[s].server) live.push_back(s);
      }
      return live.empty() ? -1 : static_cast<int>(live[Draw(live.size())]);
    };
    auto any_down = [&] { return AnyFaultUnderWay(); };
    // Without overlaps, a fault waits for the last one to be over (it is drawn again later).
    if (!faults_->overlap && any_down()) {
      At(now_ + milliseconds(20 + Draw(100)), [this, kind] { Inject(kind); });
      return;
    }
    if (kind < 30) {
      const int s = live_shard();
      if (s < 0) return;
      if (faults_->disk_faults) {
        // Now or at a point where durability is decided; the process, or its whole host.
        ShardProc& p = shards_[s];
        const uint64_t how = Draw(4);
        if (p.dying) return;  // its death is under way
        if (how >= 2) {
          if (p.die_hits > 0) return;
          static const char* const kPoints[] = {"checkpoint.write", "checkpoint.rename",
                                                "shard.applied", "shard.reply"};
          p.die_at = kPoints[Draw(4)];
          p.die_hits = 1 + static_cast<uint32_t>(Draw(3));
          p.die_with_host = how == 3;
          p.die_by = now_ + milliseconds(2000);
          counts_.overlaps += any_down();
          ++counts_.shard_kills;
          Log("shard " + std::to_string(s) + (p.die_with_host ? "'s host" : "") +
              " is to die at its pass " + std::to_string(p.die_hits) + " of " + p.die_at);
          return;
        }
        counts_.overlaps += any_down();
        ++counts_.shard_kills;
        KillShard(static_cast<uint32_t>(s), /*host=*/how == 1);
        return;
      }
      counts_.overlaps += any_down();
      ++counts_.shard_kills;
      KillShard(static_cast<uint32_t>(s));
    } else if (kind < 50) {
      WorkerProc* w = live_worker(/*or_tool=*/true);
      if (!w) return;
      counts_.overlaps += any_down();
      ++counts_.worker_kills;
      counts_.tool_kills += IsTool(*w);
      KillWorker(*w);
    } else if (kind < 60) {
      // One of its next pushes is lost on its way.
      WorkerProc* w = live_worker();
      if (!w || w->drop_at_send > 0) return;
      w->drop_at_send = 1 + static_cast<uint32_t>(Draw(job_.shards * 4));
    } else if (kind < 70) {
      // Killed in the middle of its next sends (between its messages to two shards).
      WorkerProc* w = live_worker();
      if (!w || w->kill_at_send > 0) return;
      counts_.overlaps += any_down();
      ++counts_.worker_kills;
      w->kill_at_send = 1 + static_cast<uint32_t>(Draw(job_.shards * 2));
    } else if (kind < 90) {
      const uint32_t w = static_cast<uint32_t>(Draw(Ranks()));
      const uint32_t s = static_cast<uint32_t>(Draw(job_.shards));
      Conn& c = ConnOf(w, s);
      if (c.cut) return;
      ++counts_.cuts;
      c.cut = true;
      Break(w, s);
      Log("connection of worker " + std::to_string(w) + " to shard " + std::to_string(s) +
          " cut");
      At(now_ + milliseconds(1 + Draw(500)), [this, w, s] {
        ConnOf(w, s).cut = false;
        Reconnect(w, s);
      });
    } else {
      // A worker (or the scale tool) and a shard at once.
      WorkerProc* w = live_worker(/*or_tool=*/true);
      const int s = live_shard();
      if (!w || s < 0) return;
      ++counts_.overlaps;
      ++counts_.shard_kills;
      ++counts_.worker_kills;
      counts_.tool_kills += IsTool(*w);
      KillShard(static_cast<uint32_t>(s));
      KillWorker(*w);
    }
  }

  // Whether a fault is not over yet: a process down or recovering (a shard answers its
  // workers' replays in the first 100 ms after it is back; a restarted worker its Hellos), a
  // connection cut, a lost push not yet sent again (400 ms), a drop or a kill waiting for its
  // moment.
  bool AnyFaultUnderWay() const {
    const auto recovering = milliseconds(100);
    for (const ShardProc& p : shards_) {
      if (!p.server || (p.restarts > 0 && now_ - p.up_since < recovering)) return true;
      if (p.die_hits > 0 && now_ <= p.die_by) return true;  // a death waiting for its point
    }
    for (const WorkerProc& w : workers_) {
      if (w.restart_due || w.drop_at_send > 0 || w.kill_at_send > 0) return true;
      if (w.incarnations > 1 && now_ - w.started < recovering) return true;
    }
    for (const Conn& c : conns_) {
      if (c.cut) return true;
    }
    // A lost push is sent again after cluster.request_timeout.
    return last_drop_ != Clock::time_point{} && now_ - last_drop_ < milliseconds(400);
  }

  bool AllDone() const {
    for (const WorkerProc& w : workers_) {
      if (w.state != WorkerProc::State::kDone) return false;
    }
    return true;
  }
  std::string Waiting() const {
    std::string s;
    for (const WorkerProc& w : workers_) {
      if (w.state != WorkerProc::State::kDone) {
        if (!s.empty()) s += ',';
        s += IsTool(w) ? std::string("the scale tool") : std::to_string(w.rank);
      }
    }
    return s;
  }

  const SimJob job_;
  std::mt19937_64 rng_;
  std::mt19937_64 disk_rng_;  // torn writes (apart, so that the schedule is rng_'s alone)
  SimFileSystem fs_;
  const SimOptions* faults_;
  const Reference* reference_;
  std::string dir_;
  Manifest manifest_;
  Clock::time_point now_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t seq_ = 0, event_count_ = 0, wait_logs_ = 0;
  std::vector<ShardProc> shards_;
  std::vector<WorkerProc> workers_;
  std::vector<Conn> conns_;
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = kScheduler;
  std::string failure_, pull_mismatch_;
  Clock::time_point last_drop_{};
  double seconds_ = 0;
  Reference result_;
  bool reported_loss_ = false;
  bool rollback_barred_ = false;
  bool loss_of_a_step_ = false;
  bool has_tool_ = false;  // workers_.back() is the scale tool
  bool joiner_in_ = false;  // shard 0 has named the joiner's clock
  SimOutcome counts_;
};

// A worker's links: its half of the simulated network.
class SimLinks final : public ShardLinks {
 public:
  SimLinks(Sim* sim, WorkerProc* worker) : sim_(sim), w_(worker) {}
  ~SimLinks() override { sim_->CloseConns(*w_); }
  Status Open(uint32_t shard) override {
    sim_->OpenConn(*w_, shard, opened_.count(shard) != 0);
    opened_.insert(shard);
    return Status::Ok();
  }
  Status Send(uint32_t shard, std::vector<zmq::message_t>& frames, bool) override {
    Frames f;
    for (zmq::message_t& m : frames) f.emplace_back(static_cast<const char*>(m.data()), m.size());
    frames.clear();  // the bytes are copied: borrowed memory is let go at once
    sim_->Send(*w_, shard, std::move(f));
    return Status::Ok();
  }
  Status Wait(std::chrono::milliseconds wait) override { return sim_->Wait(*w_, wait); }
  Result<bool> Receive(uint32_t shard, std::vector<zmq::message_t>* frames) override {
    frames->clear();
    if (w_->killed) return Unavailable("killed by the simulation");
    std::deque<Frames>& in = w_->inbox[shard];
    if (in.empty()) return false;
    for (const std::string& p : in.front()) frames->emplace_back(p.data(), p.size());
    in.pop_front();
    return true;
  }
  bool TakeReconnect(uint32_t shard) override {
    const bool r = w_->reconnected[shard];
    w_->reconnected[shard] = false;
    return r;
  }
  int Mechanism(uint32_t) const override { return ZMQ_NULL; }

 private:
  Sim* sim_;
  WorkerProc* w_;
  std::set<uint32_t> opened_;
};

class SimAsideTask final : public AsideTask {
 public:
  SimAsideTask(Sim* sim, uint32_t shard, std::shared_ptr<AsideWork> work)
      : sim_(sim), shard_(shard), work_(std::move(work)) {}
  bool Done() override { return work_->done; }
  void Wait() override { sim_->RunAsideNow(shard_, *work_); }

 private:
  Sim* sim_;
  uint32_t shard_;
  std::shared_ptr<AsideWork> work_;
};

std::unique_ptr<AsideTask> Sim::RunAside(uint32_t s, std::function<void()> work) {
  auto w = std::make_shared<AsideWork>();
  w->work = std::move(work);
  const uint32_t restarts = shards_[s].restarts;
  std::weak_ptr<AsideWork> weak = w;
  At(now_ + milliseconds(1 + Draw(100)), [this, s, restarts, weak] {
    std::shared_ptr<AsideWork> w = weak.lock();
    const ShardProc& p = shards_[s];
    if (!w || p.restarts != restarts || !p.server || p.dying) return;
    RunAsideNow(s, *w);
  });
  return std::make_unique<SimAsideTask>(this, s, std::move(w));
}

std::unique_ptr<ShardLinks> Sim::Links(uint32_t worker) {
  return std::make_unique<SimLinks>(this, &workers_[worker]);
}

Clock::time_point SimEnv::Now() { return sim_->Now(); }
FileSystem* SimEnv::Files() { return sim_->files(); }
Fault SimEnv::Hit(std::string_view point) {
  return shard_ >= 0 ? sim_->Hit(static_cast<uint32_t>(shard_), point) : Fault::kNone;
}
uint64_t SimEnv::Random64() { return sim_->Random64(); }
std::unique_ptr<AsideTask> SimEnv::RunAside(std::function<void()> work) {
  if (shard_ >= 0) return sim_->RunAside(static_cast<uint32_t>(shard_), std::move(work));
  // No worker runs work aside; were one to, it runs now, as one event.
  work();
  struct Ran final : AsideTask {
    bool Done() override { return true; }
    void Wait() override {}
  };
  return std::make_unique<Ran>();
}
Result<std::unique_ptr<ShardLinks>> SimEnv::LinkShards(const Manifest&, uint32_t,
                                                       const CurveKeyPair*,
                                                       const std::vector<std::string>&) {
  if (worker_ < 0) return FailedPrecondition("a shard has no links to shards");
  return sim_->Links(static_cast<uint32_t>(worker_));
}

}  // namespace

std::string SimJob::ToString() const {
  return std::to_string(workers) + " workers, " + std::to_string(shards) + " shards, " +
         std::to_string(steps) + " steps, a checkpoint every " + std::to_string(every_steps) +
         (fused ? ", fused steps" : "") + (background ? ", checkpoints in the background" : "") +
         (asp ? ", ASP" : ssp ? ", SSP with staleness " + std::to_string(staleness) : "") +
         (scale_to ? ", " + std::to_string(serving) + " serving then " + std::to_string(scale_to) +
                         " (the scale tool)"
                   : "") +
         (elastic ? ", worker " + std::to_string(workers) + " joins at clock 2 and worker " +
                        std::to_string(workers - 1) + " leaves at clock " +
                        std::to_string(leave_at)
                  : "");
}

SimJob JobOf(uint64_t seed, bool ssp, bool asp, bool reshard, bool background, bool elastic) {
  std::mt19937_64 rng(Mix(seed) ^ 0x5eed);
  SimJob job;
  job.workers = 2 + static_cast<uint32_t>(rng() % 3);
  job.shards = 1 + static_cast<uint32_t>(rng() % 3);
  job.steps = 6 + static_cast<uint32_t>(rng() % 9);
  job.every_steps = 1 + static_cast<uint32_t>(rng() % 3);
  job.fused = rng() % 2 == 0;
  if (ssp) {
    // From a stream of its own: a seed's BSP job stays what it was.
    std::mt19937_64 more(Mix(seed) ^ 0x55b);
    job.ssp = true;
    job.staleness = 1 + static_cast<uint32_t>(more() % 3);
  }
  if (asp) {
    job.ssp = job.asp = true;
    job.staleness = 0;
  }
  if (background) {
    // From a stream of its own: the rest of a seed's job stays what it was.
    std::mt19937_64 more(Mix(seed) ^ 0xbac6);
    job.background = more() % 4 != 0;
  }
  if (reshard) {
    // From a stream of its own too: 1 to 3 shards serve at first, and the tool grows or
    // shrinks them by one; every shard of either count is listed and runs from the start.
    std::mt19937_64 more(Mix(seed) ^ 0x5ca1e);
    job.serving = job.shards;
    job.scale_to = job.serving == 1 || more() % 2 == 0 ? job.serving + 1 : job.serving - 1;
    job.shards = std::max(job.serving, job.scale_to);
  }
  if (elastic && !job.ssp) {
    // From a stream of its own as well; the leave before the last step, after the clock shard 0
    // can name once the joiner is at 2 (its clock counts), and within the reach of the clocks it
    // names while every worker is at 0 (ShardServer::MembershipReach()).
    std::mt19937_64 more(Mix(seed) ^ 0xe1a5);
    job.elastic = true;
    job.leave_at = 4 + static_cast<uint32_t>(more() % (std::min(job.steps, 7u) - 4));
  }
  return job;
}

Reference RunReference(const SimJob& job, uint64_t seed, std::string* failure) {
  Sim sim(job, Mix(seed) ^ 0xfeed, nullptr, nullptr);
  sim.Run();
  if (!sim.failure().empty()) *failure = "the run without faults: " + sim.failure();
  Reference r = std::move(sim.result());
  r.seconds = sim.seconds();
  return r;
}

SimOutcome RunSeed(const SimOptions& options, const Reference& reference) {
  const SimJob job = JobOf(options.seed, options.ssp, options.asp, options.reshard,
                           options.background, options.elastic);
  Sim sim(job, options.seed, &options, &reference);
  sim.Run();
  SimOutcome out = sim.counts();
  out.job = job;
  out.seconds = sim.seconds();
  const bool overlapped = out.overlaps > 0;
  // The simulated jobs roll back (BSP with every_steps): a loss is acceptable only where no
  // rollback can be made, and only when the job stops saying so.
  // Nor across a change of the shard count (docs/internals.md: no rollback across a change of
  // membership): there the job goes on, reporting the loss, or stops saying why.
  auto cannot_roll_back = [](const std::string& what) {
    return what.find("the job cannot roll back") != std::string::npos ||
           what.find(kRollbackCannotCross) != std::string::npos;
  };
  // Under SSP nothing rolls back: a loss is acceptable when it was reported, and the job may
  // then stop on a worker's error (not on a hang, a deadlock or a failed check of the
  // simulation's own).
  // Nor across a change of the shard count, nor past the end of a worker that left the
  // running job (a shard said so: ShardServer::RollbackBarrier()). A join, or a loss before
  // the leaver finished, rolls back like any.
  const bool changes = job.scale_to > 0 || (job.elastic && sim.rollback_barred());
  const bool reported_without_rollback = (job.ssp || changes) && sim.reported_loss();
  if (!sim.failure().empty()) {
    // (Not on one of the simulation's own checks, which fail as Internal.)
    // Its error names the loss (the updates lost, or the slowest worker behind where the
    // others had seen it), not some other reason to stop.
    const bool names_loss = sim.failure().find(" lost") != std::string::npos ||
                            sim.failure().find("loss") != std::string::npos;
    const bool worker_stopped = sim.failure().rfind("worker ", 0) == 0 &&
                                sim.failure().find(" failed: ") != std::string::npos &&
                                sim.failure().find(" failed: Internal: ") == std::string::npos &&
                                names_loss;
    // Across a change of the shard count, the scale tool too, when it waited for the pushes
    // a shard lost until its time was up. (Its error names the loss when the shard it waited
    // on is the one that lost them; another shard, waiting for the ticks of the worker whose
    // pushes were lost, cannot.)
    const bool tool_stopped =
        job.scale_to > 0 && sim.failure().rfind("the scale tool failed: ", 0) == 0 &&
        sim.failure().find("has not applied every push before clock") != std::string::npos;
    // A job that stops is a failure, unless what stopped it is a loss it could not undo.
    out.kind = cannot_roll_back(sim.failure()) ||
                       (reported_without_rollback && (worker_stopped || tool_stopped))
                   ? SimOutcome::Kind::kReported
                   : SimOutcome::Kind::kFailed;
    out.failure = sim.failure();
    // After one failure at a time, across a change of the shard count, only a worker's death
    // between its ticks may lose updates (below).
    if (out.kind == SimOutcome::Kind::kReported && !overlapped && !job.ssp && changes &&
        !sim.loss_of_a_step()) {
      out.kind = SimOutcome::Kind::kFailed;
      out.failure = "after one failure at a time, a loss other than a worker's death between "
                    "its ticks: " + out.failure;
    }
    out.single_failure = out.kind == SimOutcome::Kind::kReported && !overlapped;
    return out;
  }
  std::string differs = sim.pull_mismatch();
  if (differs.empty() && sim.result().model != reference.model) {
    size_t n = 0;
    for (const auto& [k, v] : reference.model) {
      auto it = sim.result().model.find(k);
      if (it == sim.result().model.end() || it->second != v) ++n;
    }
    differs = std::to_string(n) + " rows or slices of the model differ from the run without faults";
  }
  if (differs.empty()) {
    out.kind = SimOutcome::Kind::kEqual;
  } else if (reported_without_rollback) {
    out.kind = SimOutcome::Kind::kReported;
    out.failure = differs + (job.ssp ? " (a loss was reported; under SSP the job does not roll back)"
                                     : " (a loss was reported; the job does not roll back past a "
                                       "change of the shard count or a leaver's end)");
  } else {
    // Under rollback a reported loss that the job went on with is a failure too.
    out.kind = SimOutcome::Kind::kFailed;
    out.failure = differs + (sim.reported_loss() ? " (a loss was reported, but the job did not "
                                                   "roll back)"
                                                 : " (and nothing reported a loss)");
  }
  out.single_failure = out.kind == SimOutcome::Kind::kReported && !overlapped;
  // After one failure at a time the only loss a BSP job may report across a change of the
  // shard count is a worker's death between its ticks (a step on some shards only): a loss of
  // replays, or a worker that failed on one, is a failure of the protocol.
  if (out.single_failure && !job.ssp && changes && !sim.loss_of_a_step()) {
    out.kind = SimOutcome::Kind::kFailed;
    out.single_failure = false;
    out.failure = "after one failure at a time, a loss other than a worker's death between its "
                  "ticks: " + out.failure;
  }
  return out;
}

}  // namespace parasol::sim
