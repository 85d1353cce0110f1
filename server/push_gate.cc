#include "server/push_gate.hpp"

#include <algorithm>

#include "common/protocol.hpp"

namespace parasol {

PushGate::Decision PushGate::AdmitPush(const Header& push, uint64_t checksum,
                                       const Sender& sender, bool moved_away) const {
  if (moved_away) {
    return {Admission::kDuplicate, "its clock's rows moved to other shards at a committed change"};
  }
  switch (record_.Check(push.worker_id, push.clock, push.seq, checksum, push.incarnation)) {
    case PushRecord::Verdict::kConflict:
      return {Admission::kConflict, "applied before with another payload"};
    case PushRecord::Verdict::kApplied:
      return {Admission::kDuplicate, "in the push record"};
    case PushRecord::Verdict::kTooOld:
      // Older than the record: a resend whose reply was lost, once the shard knows the worker
      // (from the worker itself) at a later clock, as every push before that clock is
      // applied. Otherwise it is new to the gate, and the record refuses it (CanMark()).
      if (!sender.restored && push.clock < sender.clock) {
        return {Admission::kDuplicate, "older than the record, and its worker is past its clock"};
      }
      return {Admission::kNew, ""};
    case PushRecord::Verdict::kNew:
      return {Admission::kNew, ""};
  }
  return {Admission::kNew, ""};
}

Status PushGate::CanMark(const Header& push) const {
  return record_.CanMark(push.worker_id, push.clock, push.seq);
}

Status PushGate::Mark(const Header& push, uint64_t checksum, uint64_t payload_bytes) {
  PARASOL_RETURN_IF_ERROR(
      record_.Mark(push.worker_id, push.clock, push.seq, checksum, push.incarnation));
  if (push.worker_id < pushed_since_checkpoint_.size()) {
    pushed_since_checkpoint_[push.worker_id] += payload_bytes;
  }
  return Status::Ok();
}

Status PushGate::AdmitTick(const Header& tick, const Sender& sender, uint64_t* checked) const {
  *checked = 0;
  if (TickNamedPushes(tick) == 0 || tick.clock <= sender.clock || (sender.restored && !tick.replay)) {
    return Status::Ok();
  }
  const uint32_t w = tick.worker_id;
  const int64_t left = tick.clock - 1;
  for (uint64_t i = 0; i < TickNamedPushes(tick); ++i) {
    if (record_.Check(w, left, i) != PushRecord::Verdict::kApplied) {
      // Unavailable: the worker sends it again (a push lost on its way is resent first).
      return Unavailable("Clock: worker " + std::to_string(w) + " ticks to clock " +
                         std::to_string(tick.clock) + " after " + std::to_string(TickNamedPushes(tick)) +
                         " pushes of clock " + std::to_string(left) + ", but its push " +
                         std::to_string(i) + " has not been applied here (refused, or not " +
                         "arrived)");
    }
  }
  *checked = TickNamedPushes(tick);
  return Status::Ok();
}

void PushGate::CheckpointTaken(const std::vector<uint64_t>& pushed_at_start) {
  for (size_t w = 0; w < pushed_since_checkpoint_.size() && w < pushed_at_start.size(); ++w) {
    pushed_since_checkpoint_[w] -= std::min(pushed_since_checkpoint_[w], pushed_at_start[w]);
  }
}

}  // namespace parasol
