// What the worker and the shard agree on beyond the message format (protocols/message.fbs):
// the Step rule, and named accessors for the header fields whose meaning depends on the op.
//
// The Step rule. A worker gathers a step's requests to one shard into Step messages
// (ShardSession::BeginStep); the shard checks every Step it receives (ShardServer::CheckStep). Both
// ask the same functions, so what one sends the other accepts:
//   - a Step holds the pushes of one clock, or the pulls of one clock after at most one tick
//     to that clock (the tick first, and not a tick that leaves the job);
//   - every part has the Step's clock;
//   - at most kMaxStepParts parts and server.max_request_bytes bytes of payload (the worker
//     also counts a pull's reply, which the shard bounds by the same limit).
//
// The named accessors. Several header fields mean one thing for one op and another for
// another (key_count is a sparse request's keys, a Step's parts and a tick's pushes). Code
// that reads or writes such a field for an op other than the plain one does it through these
// functions, which say which op they are for.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/wire.hpp"

namespace parasol {

// --- The Step rule ---

// Whether a request of op `op` may be part `index` of a Step whose first part is of op
// `first` (`done`: a tick that leaves the job).
inline bool StepMayHold(Op first, Op op, bool done, size_t index) {
  const bool pull = op == Op::PullSparse || op == Op::PullDense;
  const bool push = op == Op::PushSparse || op == Op::PushDense;
  if (index == 0) return pull || push || (op == Op::Clock && !done);
  const bool first_push = first == Op::PushSparse || first == Op::PushDense;
  return first_push ? push : pull;
}

// Whether a Step of `parts` parts and `bytes` payload bytes has room for one more of `more`
// bytes.
inline bool StepHasRoom(size_t parts, uint64_t bytes, uint64_t more, uint64_t max_bytes) {
  return parts < kMaxStepParts && bytes + more <= max_bytes;
}

// Whether a Step of `parts` parts (a lone request travels alone) may begin with a tick.
inline bool StepMayLeadWithTick(size_t parts) { return parts > 1; }

// --- Header fields by op ---

// Step: how many parts follow its header (key_count).
inline uint64_t StepParts(const Header& h) { return h.key_count; }
inline void SetStepParts(Header& h, uint64_t parts) { h.key_count = parts; }

// Clock (a tick): how many pushes the worker sent this shard at the clock it leaves; the shard
// passes the tick only once it has applied indexes 0 to n - 1 (key_count).
inline uint64_t TickNamedPushes(const Header& h) { return h.key_count; }
inline void SetTickNamedPushes(Header& h, uint64_t n) { h.key_count = n; }
// Clock: this worker has finished its steps and leaves the job (done).
inline bool TickLeaves(const Header& h) { return h.done; }

// Barrier: the barrier's id (offset).
inline int64_t BarrierId(const Header& h) { return static_cast<int64_t>(h.offset); }

// Hello reply to a worker of the job: the clock the shard knows it at (-1: none), and whether
// it has left (worker_clock, done).
inline int64_t HelloKnownClock(const Header& h) { return h.worker_clock; }
inline bool HelloWorkerLeft(const Header& h) { return h.done; }
inline void SetHelloWorker(Header& h, int64_t clock, bool left) {
  h.worker_clock = clock;
  h.done = left;
}

// Membership request: a worker asks to leave (done); a tool asks for this many workers
// (key_count, 0: no change) or shards (shard_count, 0: no change); either may name the earliest
// clock it wants the leave or change at (worker_clock; -1: the next one shard 0 can name). Its
// reply: the workers that stay (key_count), and the clock at which the asking worker joins or
// leaves, or at which the shard count changes (worker_clock).
inline bool MembershipAsksToLeave(const Header& h) { return h.done; }
inline uint64_t MembershipWorkers(const Header& h) { return h.key_count; }
inline void SetMembershipWorkers(Header& h, uint64_t n) { h.key_count = n; }
inline uint32_t MembershipShards(const Header& h) { return h.shard_count; }
inline int64_t MembershipClock(const Header& h) { return h.worker_clock; }
inline int64_t MembershipNotBefore(const Header& h) { return h.worker_clock; }
inline void SetMembershipNotBefore(Header& h, int64_t clock) { h.worker_clock = clock; }
inline void SetMembershipClock(Header& h, int64_t clock) { h.worker_clock = clock; }

// Migrate install (a tool's): the rollback generation of the shard the rows were read from
// (rollback_gen); a shard at another one refuses them with Aborted (rows read before a
// rollback are of the history undone).
inline uint64_t MigrateReadAtRollback(const Header& h) { return h.rollback_gen; }
inline void SetMigrateReadAtRollback(Header& h, uint64_t gen) { h.rollback_gen = gen; }

// Rollback request: only a question (read_only), which clock the shard could go back to;
// asked by a worker about to roll the job back (done), the shard also keeps that checkpoint
// until the rollback is made. The question's reply: the newest clock at or before the
// request's clock with a checkpoint the shard can restore (worker_clock; 0, the start, always).
inline bool RollbackIsQuestion(const Header& h) { return h.read_only; }
inline bool RollbackAboutToMake(const Header& h) { return h.done; }
inline void SetRollbackQuestion(Header& h, bool about_to_make) {
  h.read_only = true;
  h.done = about_to_make;
}
inline int64_t RollbackRestorableClock(const Header& h) { return h.worker_clock; }
// Begins a shard's refusal of a rollback that would undo a change it cannot undo (the shard
// count changed, or a worker that left has gone): the loss stays reported, and the job goes on.
inline constexpr const char* kRollbackCannotCross = "Rollback: the job cannot go back past ";
inline void SetRollbackRestorableClock(Header& h, int64_t clock) { h.worker_clock = clock; }
// The question's reply from shard 0: whether it would refuse a rollback now (a leaver's end or
// a change of the shard count it knows of: ShardServer::RollbackBarrier()).
inline bool RollbackBarred(const Header& reply) { return reply.done; }
inline void SetRollbackBarred(Header& reply, bool barred) { reply.done = barred; }

// Migrate (the scale tool's export of rows): only the rows updated at this shard clock or
// later (worker_clock). Its reply: whether the export is complete (done), and where the next
// page begins (offset).
inline int64_t MigrateUpdatedSince(const Header& h) { return h.worker_clock; }
inline void SetMigrateUpdatedSince(Header& h, int64_t clock) { h.worker_clock = clock; }

}  // namespace parasol
