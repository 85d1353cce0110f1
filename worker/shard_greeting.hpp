// ShardGreeting: how a worker, or a tool, greets the shards of its job when it connects
// (protocols/message.fbs, Op.Hello), through its client's connections.
//
// - Greet(): shard 0 first. Its reply brings the job's membership, whose changes of the shard
//   count say which shards serve the clocks this worker goes on from; those are greeted next
//   (a tool greets those the newest placement has). A worker that restarted just after a change
//   that removed shards also asks those that served only the clock before, once each, since one
//   of them may know it a clock behind. A joining worker's Hello asks shard 0 to name its
//   clock, and its other Hellos tell the other shards.
// - Await(t): a connect-time question (Hellos, a rollback's questions) is one long attempt of
//   cluster.connect_timeout, since a shard may still be starting: it gets the queued request
//   when it binds. Every 5 s the log names the shards waited for, and whether their hosts
//   resolve; each answering shard's rank and shard count are checked against the manifest.
//
// What the replies mean for the worker (the clock it continues from, a step it lost) is
// worker/resume_point.hpp's; ShardSession::Handshake() applies it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.hpp"
#include "common/wire.hpp"
#include "worker/shard_session.hpp"

namespace parasol {

class ShardGreeting {
 public:
  explicit ShardGreeting(ShardSession& client) : c_(client) {}

  // The Hello replies' headers: shard 0's first, then the others' that answered.
  Result<std::vector<Header>> Greet();
  // Waits for ticket `t`'s requests as above; the ticket stays open for ShardSession::Wait().
  Status Await(ShardSession::Ticket t);

 private:
  // The header of each of `shards`' replies to `t` that came (in `shards`' order); none when
  // `awaited` failed. With `known_only`, only replies that know this worker's clock.
  void Collect(ShardSession::Ticket t, const std::vector<uint32_t>& shards, bool known_only,
               std::vector<Header>& out) const;

  ShardSession& c_;
};

}  // namespace parasol
