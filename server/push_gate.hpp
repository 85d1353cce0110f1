// PushGate: the one place a shard decides what a push or a tick is.
//
// The invariant it keeps (docs/internals.md, "How a job survives failures"): every push a worker saw
// acknowledged is applied exactly once to the final model, whatever process dies and when. A
// push's name is (worker, clock, index); the push record (server/push_record.hpp, in every
// checkpoint) says which names were applied. From that record and what the shard knows of the
// sender, AdmitPush() answers:
//   - new: apply it, then Mark() it (CanMark() first, so that a push the record could not hold
//     is refused before it is applied);
//   - duplicate, with the reason: answer it as applied, apply nothing;
//   - conflict: the same name from the same worker process with another payload, refused.
// AdmitTick() holds a tick back while a push it names has not been applied here, so no clock
// moves past a push that was lost or refused on its way.
//
// It also counts, per worker, the payload bytes pushed since the shard's last checkpoint: what
// that worker's push log holds for this shard, which bounds how long a checkpoint may wait.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/wire.hpp"
#include "server/push_record.hpp"

namespace parasol {

class PushGate {
 public:
  // What the shard knows of a push's sender, which the gate does not hold.
  struct Sender {
    int64_t clock = 0;      // the clock the shard knows the worker at
    bool restored = false;  // that clock came from a checkpoint, and the worker's replay is due
  };
  enum class Admission { kNew, kDuplicate, kConflict };
  struct Decision {
    Admission admission = Admission::kNew;
    const char* reason = "";  // why (a duplicate's or a conflict's), for tests and logs
  };

  explicit PushGate(uint32_t workers) : pushed_since_checkpoint_(workers, 0) {}

  // `push`: a PushSparse or PushDense of a worker in the job; `checksum`: of its payload.
  // `moved_away`: this shard has committed a change of the shard count that moved the rows of
  // the push's clock to other shards (a replay to a process restarted from an older
  // checkpoint changes nothing here).
  Decision AdmitPush(const Header& push, uint64_t checksum, const Sender& sender,
                     bool moved_away) const;
  // Whether the record can hold the push (call before applying it).
  Status CanMark(const Header& push) const;
  // Records an applied push: its name, checksum and sender, and its payload bytes.
  Status Mark(const Header& push, uint64_t checksum, uint64_t payload_bytes);

  // A tick (a Clock) of a worker in the job to req.clock: refused for now (Unavailable) while
  // a push it names (indexes 0 to key_count - 1 of the clock it leaves) has not been applied.
  // A tick to a clock the worker has reached here already (a resend) passed when it first
  // came; a restored shard takes a worker's clocks from its replay first. `checked`: the
  // pushes it checked.
  Status AdmitTick(const Header& tick, const Sender& sender, uint64_t* checked) const;

  PushRecord& record() { return record_; }
  const PushRecord& record() const { return record_; }
  // Per worker rank, the payload bytes pushed since the last checkpoint.
  const std::vector<uint64_t>& pushed_since_checkpoint() const { return pushed_since_checkpoint_; }
  // A checkpoint holds what was pushed before its state was taken (`pushed_at_start`).
  void CheckpointTaken(const std::vector<uint64_t>& pushed_at_start);

 private:
  PushRecord record_;
  std::vector<uint64_t> pushed_since_checkpoint_;
};

}  // namespace parasol
