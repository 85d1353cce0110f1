// JobRollback: how a worker makes or follows a rollback of its job
// (training.on_overlapping_failure: rollback; protocols/message.fbs, Op.Rollback), through its
// client's connections. The invariant is the one of server/push_gate.hpp: every acknowledged
// push applied exactly once. When two failures overlap so that updates no log holds are lost,
// it holds again by undoing everything after the newest checkpoint every shard holds, and
// redoing it.
//
// - Follow(), before a worker's handshake: a rollback shard 0 has made (its generation and
//   clock) reaches every other shard (its maker may have died part way), and the client works
//   in that generation from then on.
// - Make(why), once the handshake showed a loss: asks every shard for the newest checkpoint it
//   can restore at or before a clock, lowering the clock until all name the same one (clock 0,
//   the start, always), then sends the rollback to shard 0 first (it decides a generation's
//   clock) and then to the others. The generation is the one after the one the client connected
//   in, so two workers that find one loss make one rollback.
//
// ShardSession::Connect() calls both; the client is then discarded and a new one connects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/wire.hpp"
#include "worker/shard_session.hpp"

namespace parasol {

class JobRollback {
 public:
  explicit JobRollback(ShardSession& client) : c_(client) {}

  Status Follow();
  Status Make(const std::string& why);

 private:
  // A question to every shard (Op.Rollback, read_only) with a connect's patience: their
  // replies' headers, in shard order. `stop`: this worker is about to roll back, and the shards
  // keep their checkpoints until it has.
  Result<std::vector<Header>> Ask(int64_t clock, bool stop);
  Status FollowOnce();
  Status MakeOnce(const std::string& why);

  ShardSession& c_;
};

}  // namespace parasol
