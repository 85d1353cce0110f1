// EnginePool: the engine threads of one shard.
//
// Each engine owns a disjoint part of every table (sparse keys by EngineOfKey(), dense ranges
// by position), so the row update path needs no per-row lock: a request is split so that each
// engine touches only what it owns. The request thread runs engine 0's part itself, then
// takes every engine's part that no engine thread has taken yet, while the engine threads
// take the others, and waits for those under way (fork-join). So one engine's part is never
// run by two threads at once, and an engine thread that wakes late, or that another process
// keeps from its core, holds the request up only by the part it has begun.
// Thread-safety: RunOnAll(), StartBackground() and FinishBackground() are called from one
// thread at a time (the shard's request thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace parasol {

class EnginePool {
 public:
  // `threads`: how many threads run the engines' parts, the calling one included (at least 1,
  // at most `engines`; 0: one per engine, as a shard has).
  explicit EnginePool(uint32_t engines, uint32_t threads = 0);
  ~EnginePool();
  EnginePool(const EnginePool&) = delete;
  EnginePool& operator=(const EnginePool&) = delete;

  uint32_t size() const { return engines_; }

  // Calls fn(e) once for every engine e and returns when all calls are done: engine 0 on the
  // calling thread, each other on the engine thread that takes it first, or on the calling
  // thread when it is free before any engine thread has taken it. An exception from any call,
  // on whichever thread, reaches the caller once the other calls are done (the first thrown,
  // when several are). With
  // `run_inline`, the caller makes the calls itself, one after another: cheaper for small
  // requests, and still no two calls touch the same engine's data at once.
  void RunOnAll(const std::function<void(uint32_t)>& fn, bool run_inline = false);

  // Background work the request thread need not wait for: fn(e, stop) for every engine e in
  // turn, on a thread of the lowest scheduling priority (SCHED_IDLE: it runs only on a core
  // nothing else wants) while the request thread goes on, touching no engine's data until
  // FinishBackground(). fn must return soon after `stop` becomes true, keeping where it got
  // to: it is called again for every engine, and then must finish.
  // REQUIRES: no background work started and not finished.
  using BackgroundFn = std::function<void(uint32_t engine, const std::atomic<bool>& stop)>;
  void StartBackground(BackgroundFn fn);
  // Stops the background work (waiting only until fn notices), then calls fn(e, never) for
  // every engine as RunOnAll does (engine 0 on the caller, the others on whichever thread
  // takes them), in parallel at the normal priority, to finish what the background left.
  // Returns at once when nothing was started.
  void FinishBackground();

 private:
  void Loop();
  // Runs fn(engine), keeping the first exception of the call in failed_.
  void RunPart(const std::function<void(uint32_t)>& fn, uint32_t engine);
  // Counts a part of RunOnAll's call `generation` as done, then takes the next engine of that
  // call no thread has taken; nothing when all are taken or the call is over.
  std::optional<uint32_t> FinishAndClaim(uint64_t generation);
  void BackgroundLoop();

  const uint32_t engines_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(uint32_t)>* task_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                              // guarded by mu_
  uint32_t next_ = 0;      // guarded by mu_: the next engine of task_ not taken
  uint32_t finished_ = 0;  // guarded by mu_: task_'s calls done
  std::exception_ptr failed_;  // guarded by mu_: the first exception of task_'s calls
  bool stopping_ = false;                                // guarded by mu_
  std::thread background_;
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  BackgroundFn background_fn_;        // set while background work is started, not finished
  bool background_pending_ = false;    // guarded by background_mu_: the thread has work to run
  bool background_running_ = false;   // guarded by background_mu_: it is inside background_fn_
  bool background_exit_ = false;      // guarded by background_mu_
  std::atomic<bool> background_stop_{false};
};

}  // namespace parasol
