// LogLimiter: a rate limit for warnings that peers can trigger (one per bad message, failed
// request, undeliverable reply), so that a flood cannot fill the disk. The first `burst`
// occurrences are logged; after that, at most one line per `period`, saying how many were
// left out since the last line. Counts of all and of those left out are kept for /metrics.
// Thread-safety: none; one thread owns it.
#pragma once

#include <chrono>
#include <cstdint>

namespace parasol {

class LogLimiter {
 public:
  using SteadyClock = std::chrono::steady_clock;

  explicit LogLimiter(uint32_t burst = 10, SteadyClock::duration period = std::chrono::seconds(10))
      : burst_(burst), period_(period) {}

  // Counts one occurrence; true when it should be logged. Then `*left_out` is how many
  // occurrences were not logged since the last one that was.
  bool Allow(SteadyClock::time_point now, uint64_t* left_out) {
    ++total_;
    if (total_ <= burst_ || now - last_logged_ >= period_) {
      *left_out = pending_;
      pending_ = 0;
      last_logged_ = now;
      return true;
    }
    ++pending_;
    ++left_out_total_;
    return false;
  }

  uint64_t total() const { return total_; }
  uint64_t left_out_total() const { return left_out_total_; }

 private:
  uint32_t burst_;
  SteadyClock::duration period_;
  SteadyClock::time_point last_logged_{};
  uint64_t total_ = 0;
  uint64_t pending_ = 0;
  uint64_t left_out_total_ = 0;
};

}  // namespace parasol
