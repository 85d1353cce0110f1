// Membership: which worker ranks train at which clock, as the job's size changes while it runs.
//
// Ranks 0 .. cluster.workers - 1 are present from clock 0. A rank up to cluster.max_workers - 1
// joins at a clock shard 0 names (`parasol worker --join`); a rank leaves at a clock shard 0
// names (`parasol scale`, or SIGTERM to the worker). A rank joins at most once and leaves at most
// once; its clocks never change once named. Rank w is present at clock c when
// join(w) <= c < leave(w).
//
// It also records the clocks at which the job's shard count changes (`parasol scale --servers`):
// from such a clock on, keys and dense elements are placed as common/placement.hpp grows or
// shrinks the placement, through each count named.
//
// Shard 0 alone names the clocks. Every worker and shard keeps a copy and merges the copies it
// is sent (Clock requests and their replies carry the entries the other side lacks), so a copy
// is never wrong, only behind; `version()` counts what has been named and orders copies.
//
// The data split follows it (DataPlan): the rows of every epoch, taken as one stream, are cut at
// each clock into one chunk of n x batch_size lines for the n ranks present, and the i-th of
// them (by rank) takes the chunk's lines i, i + n, ...; so every line is trained once whatever
// the changes, and with no change worker r of W takes the lines r modulo W, as before.
// Thread-safety: none.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/placement.hpp"
#include "common/status.hpp"

namespace parasol {

// The largest clock a membership may name: far past any job, low enough that clock arithmetic
// on it cannot overflow.
inline constexpr int64_t kMaxMemberClock = int64_t{1} << 40;
// The most shard count changes a job may name (each is one entry of the membership).
inline constexpr size_t kMaxServerChanges = 64;

// One rank's named clocks (-1: not named). An entry whose `worker` has kServerEntry set names a
// change of the shard count instead: from clock `join` on, the job has `worker & ~kServerEntry`
// shards (`leave` is -1).
inline constexpr uint32_t kServerEntry = 0x80000000u;
struct MemberEntry {
  uint32_t worker = 0;
  int64_t join = -1;
  int64_t leave = -1;
  bool operator==(const MemberEntry&) const = default;
};

class Membership {
 public:
  Membership() = default;
  // `initial` ranks present from clock 0, of at most `max_ranks`.
  // `servers` shards hold keys at the start, of `listed` (manifest cluster.initial_servers and
  // cluster.servers).
  Membership(uint32_t initial, uint32_t max_ranks, uint32_t servers = 1, uint32_t listed = 1);

  uint32_t initial() const { return initial_; }
  uint32_t max_ranks() const { return static_cast<uint32_t>(join_.size()); }
  // How many clocks have been named beyond the initial ranks' joins.
  uint64_t version() const { return version_; }

  int64_t join(uint32_t w) const { return w < join_.size() ? join_[w] : -1; }
  int64_t leave(uint32_t w) const { return w < leave_.size() ? leave_[w] : -1; }
  bool AnyLeave() const {
    return std::any_of(leave_.begin(), leave_.end(), [](int64_t c) { return c >= 0; });
  }
  bool Joined(uint32_t w) const { return join(w) >= 0; }
  bool Present(uint32_t w, int64_t clock) const {
    return Joined(w) && join_[w] <= clock && (leave_[w] < 0 || clock < leave_[w]);
  }
  // Ranks present at `clock`, and `w`'s position among them (-1: not present).
  uint32_t CountAt(int64_t clock) const;
  int32_t IndexAt(uint32_t w, int64_t clock) const;
  // The clocks at which the present ranks change, ascending (0 excluded).
  std::vector<int64_t> ChangeClocks() const;

  // Names a clock (shard 0). FailedPrecondition when it is named already, or the rank is out of
  // range, or a leave is not after the join.
  Status SetJoin(uint32_t w, int64_t clock);
  Status SetLeave(uint32_t w, int64_t clock);

  // Shard count changes: (clock, count), clocks ascending.
  struct ServerChange {
    int64_t clock = 0;
    uint32_t count = 0;
    bool operator==(const ServerChange&) const = default;
  };
  const std::vector<ServerChange>& server_changes() const { return server_changes_; }
  uint32_t listed_servers() const { return listed_; }
  // The placement of keys at `clock` (the initial one before every change).
  const Placement& PlacementAt(int64_t clock) const;
  // The newest placement named.
  const Placement& LastPlacement() const { return placements_.back(); }
  // The clock from which shard `shard` serves: 0, or the newest change that gave it keys while
  // it held none. RemovedAt(): the newest change that took every key from it (-1: none).
  int64_t ServingFrom(uint32_t shard) const;
  int64_t RemovedAt(uint32_t shard) const;
  // Names a change of the shard count to `count` from `clock` on (shard 0). FailedPrecondition
  // when `clock` is not after the last change named, `count` is not a change or is outside
  // 1 .. listed shards.
  Status SetServers(int64_t clock, uint32_t count);

  // The entries beyond the initial state: every rank with a join or leave named after the start.
  std::vector<MemberEntry> Entries() const;
  // Takes in what `entries` name that this copy lacks. An entry that contradicts this copy, or
  // names a rank out of range or a clock below 0, is refused (and nothing is taken). `changed`:
  // the smallest clock newly named (INT64_MAX: none).
  Status Merge(std::span<const MemberEntry> entries, int64_t* changed = nullptr);

  bool operator==(const Membership&) const = default;

 private:
  uint32_t initial_ = 0;
  std::vector<int64_t> join_;
  std::vector<int64_t> leave_;
  uint64_t version_ = 0;
  uint32_t listed_ = 1;
  std::vector<ServerChange> server_changes_;
  std::vector<Placement> placements_{Placement(1)};  // the first, then one after each change
};

// The membership a job starts with (cluster.workers of max_workers ranks, initial_servers of
// the listed shards).
struct Manifest;
Membership JobMembership(const Manifest& manifest);

// Where each step's rows are in the stream of every epoch's lines (see Membership).
struct StepChunk {
  uint64_t first = 0;  // stream position of the chunk's first line
  uint32_t ranks = 0;  // ranks present (the chunk has ranks x batch_size lines)
  int32_t index = -1;  // this rank's place among them (-1: not present)
};
// The smallest clock `after` names that `before` did not (INT64_MAX: none).
int64_t FirstNewClock(const Membership& before, const Membership& after);
StepChunk ChunkOf(const Membership& m, uint32_t rank, int64_t step, uint32_t batch_size);

}  // namespace parasol
