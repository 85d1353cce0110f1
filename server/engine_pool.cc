#include "server/engine_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <exception>
#include <new>
#include <optional>
#include <utility>

#include "common/fatal.hpp"

namespace parasol {

EnginePool::EnginePool(uint32_t engines, uint32_t threads)
    : engines_(engines == 0 ? 1 : engines) {
  const uint32_t helpers = (threads == 0 ? engines_ : std::clamp(threads, 1u, engines_)) - 1;
  background_ = std::thread([this] { BackgroundLoop(); });
  // Engine 0 runs on the calling (request) thread; these take the others' parts.
  threads_.reserve(helpers);
  for (uint32_t t = 0; t < helpers; ++t) threads_.emplace_back([this] { Loop(); });
}

EnginePool::~EnginePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  // Work not finished (its owner did not call FinishBackground): what has not begun is
  // dropped, what has stops at its next chance.
  background_stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(background_mu_);
    background_exit_ = true;
  }
  background_cv_.notify_all();
  for (auto& t : threads_) t.join();
  background_.join();
}

void EnginePool::RunOnAll(const std::function<void(uint32_t)>& fn, bool run_inline) {
  if (run_inline || threads_.empty()) {
    for (uint32_t e = 0; e < engines_; ++e) fn(e);
    return;
  }
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    next_ = 1;  // engine 0 is this thread's
    finished_ = 0;
    failed_ = nullptr;
    generation = ++generation_;
  }
  work_cv_.notify_all();
  // Engine 0 here, then every engine no thread has taken yet: a thread that is slow to wake,
  // or that another task keeps from a core, leaves its engine to this one. The threads borrow
  // fn, so every engine they took is done before this returns or throws.
  for (std::optional<uint32_t> e = 0; e; e = FinishAndClaim(generation)) RunPart(fn, *e);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return finished_ == engines_; });
  task_ = nullptr;
  if (failed_) std::rethrow_exception(std::exchange(failed_, nullptr));
}

void EnginePool::RunPart(const std::function<void(uint32_t)>& fn, uint32_t engine) {
  try {
    fn(engine);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) failed_ = std::current_exception();
  }
}

std::optional<uint32_t> EnginePool::FinishAndClaim(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (++finished_ == engines_) done_cv_.notify_one();
  if (generation_ != generation || task_ == nullptr || next_ >= engines_) return std::nullopt;
  return next_++;
}

void EnginePool::Loop() {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(uint32_t)>* task = nullptr;
    std::optional<uint32_t> e;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
      // The first engine not taken yet (none when the call is over, or all are taken).
      if (task_ != nullptr && next_ < engines_) e = next_++;
    }
    // Then the next, until none is left; the task stays valid while one taken here runs.
    for (; e; e = FinishAndClaim(seen)) RunPart(*task, *e);
  }
}

void EnginePool::StartBackground(BackgroundFn fn) {
  background_fn_ = std::move(fn);  // read by the thread only once it sees background_pending_
  background_stop_.store(false);
  {
    std::lock_guard<std::mutex> lock(background_mu_);
    background_pending_ = true;
  }
  background_cv_.notify_all();
}

void EnginePool::FinishBackground() {
  if (!background_fn_) return;
  background_stop_.store(true);
  {
    std::unique_lock<std::mutex> lock(background_mu_);
    background_pending_ = false;  // not begun: nothing to stop
    background_cv_.wait(lock, [&] { return !background_running_; });
  }
  // What the background left (all of it, when it never ran), on the engines (engine 0 here).
  static const std::atomic<bool> kNever{false};
  RunOnAll([&](uint32_t e) { background_fn_(e, kNever); });
  background_fn_ = nullptr;
}

void EnginePool::BackgroundLoop() {
  // Only on a core nothing else wants; refused (kept at the normal priority) where the
  // system does not allow it.
  sched_param param{};
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
  std::unique_lock<std::mutex> lock(background_mu_);
  while (true) {
    background_cv_.wait(lock, [&] { return background_exit_ || background_pending_; });
    if (background_exit_) return;
    background_pending_ = false;
    background_running_ = true;
    lock.unlock();
    try {
      for (uint32_t e = 0; e < engines_ && !background_stop_.load(); ++e) {
        background_fn_(e, background_stop_);
      }
    } catch (const std::bad_alloc&) {
      ExitOutOfMemory("a shard's background apply");
    }
    lock.lock();
    background_running_ = false;
    background_cv_.notify_all();
  }
}

}  // namespace parasol
