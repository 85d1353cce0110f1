// PushDedup: which pushes this shard has already applied, so a resent push is applied once.
//
// A push is identified by (worker, incarnation, seq): the incarnation is a random number a
// client picks when it starts, so a restarted worker whose sequence starts again is not taken
// for a resend. Per worker the shard keeps a sliding window of the last `window` sequence
// numbers; a push older than the window is reported as seen (it cannot be told apart, and
// applying an update twice is worse than refusing a very late resend).
// Thread-safety: none; the shard's request thread owns it.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace parasol {

class PushDedup {
 public:
  explicit PushDedup(uint64_t window = 1 << 16);

  bool Seen(uint32_t worker, uint64_t incarnation, uint64_t seq) const;
  void Mark(uint32_t worker, uint64_t incarnation, uint64_t seq);

  // The whole state as bytes (for checkpoints), and back; Load refuses malformed bytes.
  std::vector<char> Save() const;
  bool Load(const std::vector<char>& bytes);

 private:
  struct Window {
    uint64_t incarnation = 0;
    uint64_t base = 0;           // every seq < base counts as seen
    std::vector<uint64_t> bits;  // seq in [base, base + window) -> bit seq % window
  };

  bool Test(const Window& w, uint64_t seq) const;

  uint64_t window_;
  std::unordered_map<uint32_t, Window> workers_;
};

}  // namespace parasol
