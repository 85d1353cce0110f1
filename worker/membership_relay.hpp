// A worker's copy of the job's membership (who trains from which clock, and the changes of the
// shard count), and what it carries between shards. Shard 0 decides the membership; a worker
// merges what every reply brings, and hands it on to a shard that knows less (on its ticks,
// Hellos and pulls), with shard 0's MACs of each entry when shard 0 signs them
// (common/membership_macs.hpp), so that a shard takes only entries shard 0 made. Sends nothing:
// ShardSession calls Note() on each reply and Stamp() on each request.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "common/membership.hpp"
#include "common/status.hpp"
#include "common/wire.hpp"

namespace parasol {

class MembershipRelay {
 public:
  MembershipRelay() = default;
  MembershipRelay(Membership initial, uint32_t shards, uint32_t worker);

  const Membership& membership() const { return membership_; }
  // Sticky: a shard sent a membership that contradicts this worker's (two copies disagree on a
  // named clock; going on would train lines twice or not at all). Ok until then.
  const Status& failure() const { return failure_; }

  // Takes in the membership a reply of `shard` brings, and what that shard knows (the latest
  // reply's: a shard restarted from an older checkpoint knows less again).
  void Note(uint32_t shard, const Header& reply);
  // Sets the membership fields of a request to `shard`. `carries`: a request of the kind that
  // hands the membership on (a rank's tick, Hello or pull; a tool's Migrate). `job_rank`: from a
  // rank of the job (not a tool).
  void Stamp(uint32_t shard, bool carries, bool job_rank, Header& header) const;

  // Shard 0's MACs of `entries`, entry by entry (zeros where one is not held); empty when none is.
  std::vector<uint8_t> MacsOf(const std::vector<MemberEntry>& entries) const;
  // Whether shard 0's MACs of each of `entries` are held.
  bool AllSigned(const std::vector<MemberEntry>& entries) const;

 private:
  Membership membership_;
  uint32_t worker_ = 0;
  // By entry (worker, join, leave): shard 0's MACs of it.
  std::map<std::tuple<uint32_t, int64_t, int64_t>, std::vector<uint8_t>> macs_;
  bool shard_zero_signs_ = false;         // a reply of shard 0 carried MACs
  std::vector<uint64_t> shard_version_;  // per shard: the version its last reply knew
  Status failure_;
};

}  // namespace parasol
