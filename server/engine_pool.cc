#include "server/engine_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <exception>
#include <new>

#include "common/fatal.hpp"

namespace parasol {

EnginePool::EnginePool(uint32_t engines) : engines_(engines == 0 ? 1 : engines) {
  background_ = std::thread([this] { BackgroundLoop(); });
  // Engine 0 runs on the calling (request) thread, the others on threads of their own.
  threads_.reserve(engines_ - 1);
  for (uint32_t e = 1; e < engines_; ++e) threads_.emplace_back([this, e] { Loop(e); });
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    pending_ = engines_ - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  // Engine 0 here, while the others run; they borrow fn, so they finish before this returns
  // or throws.
  std::exception_ptr failed;
  try {
    fn(0);
  } catch (...) {
    failed = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  if (failed) std::rethrow_exception(failed);
}

void EnginePool::Loop(uint32_t engine) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(uint32_t)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    try {
      (*task)(engine);
    } catch (const std::bad_alloc&) {
      ExitOutOfMemory("a shard's engine thread");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
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
