#include "common/membership.hpp"

#include <algorithm>
#include <limits>

#include "common/manifest.hpp"

namespace parasol {

Membership::Membership(uint32_t initial, uint32_t max_ranks, uint32_t servers, uint32_t listed)
    : initial_(std::min(initial, max_ranks)),
      join_(max_ranks, -1),
      leave_(max_ranks, -1),
      listed_(std::max(listed, 1u)),
      placements_{Placement(std::clamp(servers, 1u, std::max(listed, 1u)))} {
  for (uint32_t w = 0; w < initial_; ++w) join_[w] = 0;
}

const Placement& Membership::PlacementAt(int64_t clock) const {
  size_t i = 0;
  while (i < server_changes_.size() && server_changes_[i].clock <= clock) ++i;
  return placements_[i];
}

int64_t Membership::ServingFrom(uint32_t shard) const {
  int64_t from = 0;
  for (size_t i = 0; i < server_changes_.size(); ++i) {
    if (shard >= placements_[i].count() && shard < server_changes_[i].count) {
      from = server_changes_[i].clock;
    }
  }
  return from;
}

int64_t Membership::RemovedAt(uint32_t shard) const {
  int64_t at = -1;
  for (size_t i = 0; i < server_changes_.size(); ++i) {
    if (shard < placements_[i].count() && shard >= server_changes_[i].count) {
      at = server_changes_[i].clock;
    }
  }
  return at;
}

Status Membership::SetServers(int64_t clock, uint32_t count) {
  for (const ServerChange& c : server_changes_) {
    if (c.clock == clock) {
      if (c.count == count) return Status::Ok();
      return FailedPrecondition("the shard count changes to " + std::to_string(c.count) +
                                " at clock " + std::to_string(clock) + ", not to " +
                                std::to_string(count));
    }
  }
  if (clock < 1 || clock > kMaxMemberClock) {
    return FailedPrecondition("shard count clock " + std::to_string(clock) + " is out of range");
  }
  if (!server_changes_.empty() && clock <= server_changes_.back().clock) {
    return FailedPrecondition("a shard count change at clock " + std::to_string(clock) +
                              " is not after the last one, at clock " +
                              std::to_string(server_changes_.back().clock));
  }
  if (listed_ > kMaxReshardServers) {
    return FailedPrecondition("the job lists " + std::to_string(listed_) + " shards; one whose "
                              "shard count changes lists at most " +
                              std::to_string(kMaxReshardServers));
  }
  if (count < 1 || count > listed_) {
    return FailedPrecondition("shard count " + std::to_string(count) + " is outside 1 .. " +
                              std::to_string(listed_) + " (the shards cluster.servers lists)");
  }
  if (server_changes_.size() >= kMaxServerChanges) {
    return FailedPrecondition("the job's shard count has changed " +
                              std::to_string(kMaxServerChanges) + " times, the most it may");
  }
  if (count == placements_.back().count()) {
    return FailedPrecondition("the job has " + std::to_string(count) + " shards already");
  }
  server_changes_.push_back(ServerChange{clock, count});
  placements_.push_back(placements_.back().Resized(count));
  ++version_;
  return Status::Ok();
}

uint32_t Membership::CountAt(int64_t clock) const {
  uint32_t n = 0;
  for (uint32_t w = 0; w < join_.size(); ++w) n += Present(w, clock) ? 1 : 0;
  return n;
}

int32_t Membership::IndexAt(uint32_t w, int64_t clock) const {
  if (!Present(w, clock)) return -1;
  int32_t i = 0;
  for (uint32_t v = 0; v < w; ++v) i += Present(v, clock) ? 1 : 0;
  return i;
}

std::vector<int64_t> Membership::ChangeClocks() const {
  std::vector<int64_t> c;
  for (uint32_t w = 0; w < join_.size(); ++w) {
    if (join_[w] > 0) c.push_back(join_[w]);
    if (leave_[w] > 0) c.push_back(leave_[w]);
  }
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

Status Membership::SetJoin(uint32_t w, int64_t clock) {
  if (w >= join_.size()) {
    return FailedPrecondition("worker " + std::to_string(w) + " is beyond cluster.max_workers (" +
                              std::to_string(join_.size()) + ")");
  }
  if (clock < 0 || clock > kMaxMemberClock) {
    return FailedPrecondition("join clock " + std::to_string(clock) + " is out of range");
  }
  if (join_[w] >= 0) {
    if (join_[w] == clock) return Status::Ok();
    return FailedPrecondition("worker " + std::to_string(w) + " joined at clock " +
                              std::to_string(join_[w]) + ", not " + std::to_string(clock));
  }
  if (leave_[w] >= 0 && leave_[w] <= clock) {
    return FailedPrecondition("worker " + std::to_string(w) + " would join at clock " +
                              std::to_string(clock) + ", not before it leaves at " +
                              std::to_string(leave_[w]));
  }
  join_[w] = clock;
  ++version_;
  return Status::Ok();
}

Status Membership::SetLeave(uint32_t w, int64_t clock) {
  if (w >= leave_.size()) {
    return FailedPrecondition("worker " + std::to_string(w) + " is beyond cluster.max_workers (" +
                              std::to_string(leave_.size()) + ")");
  }
  if (clock < 0 || clock > kMaxMemberClock) {
    return FailedPrecondition("leave clock " + std::to_string(clock) + " is out of range");
  }
  if (leave_[w] >= 0) {
    if (leave_[w] == clock) return Status::Ok();
    return FailedPrecondition("worker " + std::to_string(w) + " leaves at clock " +
                              std::to_string(leave_[w]) + ", not " + std::to_string(clock));
  }
  if (join_[w] >= 0 && clock <= join_[w]) {
    return FailedPrecondition("worker " + std::to_string(w) + " would leave at clock " +
                              std::to_string(clock) + ", not after it joins at " +
                              std::to_string(join_[w]));
  }
  leave_[w] = clock;
  ++version_;
  return Status::Ok();
}

std::vector<MemberEntry> Membership::Entries() const {
  std::vector<MemberEntry> e;
  for (uint32_t w = 0; w < join_.size(); ++w) {
    const bool joined_later = w >= initial_ && join_[w] >= 0;
    if (joined_later || leave_[w] >= 0) {
      e.push_back(MemberEntry{w, w < initial_ ? -1 : join_[w], leave_[w]});
    }
  }
  for (const ServerChange& c : server_changes_) {
    e.push_back(MemberEntry{kServerEntry | c.count, c.clock, -1});
  }
  return e;
}

Status Membership::Merge(std::span<const MemberEntry> entries, int64_t* changed) {
  if (changed) *changed = std::numeric_limits<int64_t>::max();
  // Checked on a copy first: a refused list changes nothing.
  Membership next = *this;
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const MemberEntry& e : entries) {
    if (e.worker & kServerEntry) {
      if (e.leave != -1) {
        return FailedPrecondition("membership names a shard count change with a leave clock");
      }
      const bool known = std::any_of(next.server_changes_.begin(), next.server_changes_.end(),
                                     [&](const ServerChange& c) { return c.clock == e.join; });
      PARASOL_RETURN_IF_ERROR(next.SetServers(e.join, e.worker & ~kServerEntry)
                                  .WithContext("membership"));
      if (!known) first = std::min(first, e.join);
      continue;
    }
    if (e.worker >= join_.size()) {
      return FailedPrecondition("membership names worker " + std::to_string(e.worker) +
                                ", beyond cluster.max_workers (" + std::to_string(join_.size()) +
                                ")");
    }
    if (e.join < -1 || e.leave < -1) {
      return FailedPrecondition("membership names a clock below 0 for worker " +
                                std::to_string(e.worker));
    }
    if (e.join >= 0 && e.worker < initial_ && e.join != 0) {
      return FailedPrecondition("membership says worker " + std::to_string(e.worker) +
                                " joined at clock " + std::to_string(e.join) +
                                "; it is one of the job's first cluster.workers");
    }
    if (e.join >= 0 && next.join_[e.worker] < 0) {
      PARASOL_RETURN_IF_ERROR(next.SetJoin(e.worker, e.join).WithContext("membership"));
      first = std::min(first, e.join);
    } else if (e.join >= 0 && next.join_[e.worker] != e.join) {
      return FailedPrecondition("membership says worker " + std::to_string(e.worker) +
                                " joined at clock " + std::to_string(e.join) + ", not " +
                                std::to_string(next.join_[e.worker]));
    }
    if (e.leave >= 0 && next.leave_[e.worker] < 0) {
      PARASOL_RETURN_IF_ERROR(next.SetLeave(e.worker, e.leave).WithContext("membership"));
      first = std::min(first, e.leave);
    } else if (e.leave >= 0 && next.leave_[e.worker] != e.leave) {
      return FailedPrecondition("membership says worker " + std::to_string(e.worker) +
                                " leaves at clock " + std::to_string(e.leave) + ", not " +
                                std::to_string(next.leave_[e.worker]));
    }
  }
  *this = std::move(next);
  if (changed) *changed = first;
  return Status::Ok();
}

Membership JobMembership(const Manifest& manifest) {
  const ClusterOptions& c = manifest.cluster;
  return Membership(c.workers, std::max(c.workers, c.max_workers), c.InitialServers(),
                    static_cast<uint32_t>(c.servers.size()));
}

int64_t FirstNewClock(const Membership& before, const Membership& after) {
  int64_t first = std::numeric_limits<int64_t>::max();
  for (uint32_t w = 0; w < after.max_ranks(); ++w) {
    if (after.join(w) != before.join(w) && after.join(w) >= 0) first = std::min(first, after.join(w));
    if (after.leave(w) != before.leave(w) && after.leave(w) >= 0) {
      first = std::min(first, after.leave(w));
    }
  }
  return first;
}

StepChunk ChunkOf(const Membership& m, uint32_t rank, int64_t step, uint32_t batch_size) {
  StepChunk c;
  if (step < 0) return c;
  // The stream position of `step`: every earlier clock's chunk, segment by segment between the
  // clocks at which the present ranks change.
  int64_t from = 0;
  uint64_t first = 0;
  for (int64_t change : m.ChangeClocks()) {
    if (change > step) break;
    first += static_cast<uint64_t>(change - from) * m.CountAt(from) * batch_size;
    from = change;
  }
  first += static_cast<uint64_t>(step - from) * m.CountAt(from) * batch_size;
  c.first = first;
  c.ranks = m.CountAt(step);
  c.index = m.IndexAt(rank, step);
  return c;
}

}  // namespace parasol
