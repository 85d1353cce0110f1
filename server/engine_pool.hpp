// EnginePool: the engine threads of one shard.
//
// Each engine owns a disjoint part of every table (sparse keys by EngineOfKey(), dense ranges
// by position), so the row update path needs no per-row lock: a request is split so that each
// engine touches only what it owns, and the request thread waits for all of them (fork-join).
// Thread-safety: RunOnAll() is called from one thread at a time (the shard's request thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace parasol {

class EnginePool {
 public:
  explicit EnginePool(uint32_t engines);
  ~EnginePool();
  EnginePool(const EnginePool&) = delete;
  EnginePool& operator=(const EnginePool&) = delete;

  uint32_t size() const { return engines_; }

  // Calls fn(e) once for every engine e and returns when all calls are done. With
  // `run_inline`, the caller makes the calls itself, one after another: cheaper for small
  // requests, and still no two calls touch the same engine's data at once.
  void RunOnAll(const std::function<void(uint32_t)>& fn, bool run_inline = false);

 private:
  void Loop(uint32_t engine);

  const uint32_t engines_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(uint32_t)>* task_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                              // guarded by mu_
  uint32_t pending_ = 0;                                 // guarded by mu_
  bool stopping_ = false;                                // guarded by mu_
};

}  // namespace parasol
