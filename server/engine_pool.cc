#include "server/engine_pool.hpp"

namespace parasol {

EnginePool::EnginePool(uint32_t engines) : engines_(engines == 0 ? 1 : engines) {
  if (engines_ == 1) return;  // a single engine runs on the request thread
  threads_.reserve(engines_);
  for (uint32_t e = 0; e < engines_; ++e) threads_.emplace_back([this, e] { Loop(e); });
}

EnginePool::~EnginePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void EnginePool::RunOnAll(const std::function<void(uint32_t)>& fn, bool run_inline) {
  if (run_inline || threads_.empty()) {
    for (uint32_t e = 0; e < engines_; ++e) fn(e);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  task_ = &fn;
  pending_ = engines_;
  ++generation_;
  work_cv_.notify_all();
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
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
    (*task)(engine);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace parasol
