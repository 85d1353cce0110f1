#include "worker/shard_greeting.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "common/net.hpp"
#include "common/protocol.hpp"

namespace parasol {

void ShardGreeting::Collect(ShardSession::Ticket t, const std::vector<uint32_t>& shards,
                            bool known_only, std::vector<Header>& out) const {
  for (uint32_t s : shards) {
    std::optional<Header> h = c_.ReplyHeader(t, s);
    if (h && (!known_only || HelloKnownClock(*h) >= 0)) out.push_back(*h);
  }
}

Result<std::vector<Header>> ShardGreeting::Greet() {
  std::vector<Header> hellos;
  PARASOL_ASSIGN_OR_RETURN(ShardSession::Ticket first, c_.Broadcast(Op::Hello, 0, {0}));
  Status greeted = Await(first);
  if (!greeted.ok() && c_.tracker_.ticket(first).outstanding > 0) return greeted;
  if (greeted.ok()) Collect(first, {0}, /*known_only=*/false, hellos);
  const Status first_status = c_.Wait(first);
  PARASOL_RETURN_IF_ERROR(c_.joining_ ? first_status.WithContext("joining the job")
                                      : first_status);
  PARASOL_RETURN_IF_ERROR(greeted);
  const Membership& membership = c_.relay_.membership();
  if (c_.joining_) {
    if (!membership.Joined(c_.worker_id_)) {
      return FailedPrecondition("shard 0 did not admit worker " + std::to_string(c_.worker_id_));
    }
    spdlog::info("worker {}: joins the job at clock {}", c_.worker_id_,
                 membership.join(c_.worker_id_));
  }
  // The clock this worker goes on from, as shard 0 knows it (-1: a new worker, or a tool).
  const int64_t at =
      !hellos.empty() && HelloKnownClock(hellos[0]) >= 0 ? HelloKnownClock(hellos[0]) : -1;
  const uint32_t serving =
      c_.JobRank() ? c_.ShardsFrom(at) : membership.LastPlacement().count();
  std::vector<uint32_t> rest = c_.FirstShards(serving);
  if (!rest.empty()) rest.erase(rest.begin());  // shard 0 is greeted
  if (!rest.empty()) {
    PARASOL_ASSIGN_OR_RETURN(ShardSession::Ticket t, c_.Broadcast(Op::Hello, 0, rest));
    greeted = Await(t);
    if (!greeted.ok() && c_.tracker_.ticket(t).outstanding > 0) return greeted;
    if (greeted.ok()) Collect(t, rest, /*known_only=*/false, hellos);
    PARASOL_RETURN_IF_ERROR(c_.Wait(t));
    PARASOL_RETURN_IF_ERROR(greeted);
  }
  // A shard that served only the clock before (removed at this worker's clock) may know the
  // worker a clock behind, if it died between its ticks: asked once, and skipped when it does
  // not answer (a shard removed by a finished change may have been stopped).
  if (c_.JobRank() && at > 0 && c_.ShardsFrom(at - 1) > serving) {
    std::vector<uint32_t> before;
    for (uint32_t s = serving; s < std::min<size_t>(c_.ShardsFrom(at - 1), c_.num_shards_);
         ++s) {
      before.push_back(s);
    }
    PARASOL_ASSIGN_OR_RETURN(ShardSession::Ticket t, c_.Broadcast(Op::Hello, 0, before));
    for (auto& [id, r] : c_.tracker_.requests()) {
      if (r->ticket == t) r->max_attempts = 1;
    }
    while (c_.tracker_.ticket(t).outstanding > 0) {
      PARASOL_RETURN_IF_ERROR(c_.Pump(std::chrono::milliseconds(100)));
      if (c_.wait_interrupt_ && c_.tracker_.ticket(t).outstanding > 0) {
        PARASOL_RETURN_IF_ERROR(c_.wait_interrupt_());
      }
    }
    Collect(t, before, /*known_only=*/true, hellos);
    if (Status st = c_.Wait(t); !st.ok()) {
      spdlog::info("worker {}: a shard that served only the clock before did not answer ({}); "
                   "going on without it", c_.worker_id_, st.ToString());
    }
  }
  return hellos;
}

Status ShardGreeting::Await(ShardSession::Ticket t) {
  RequestTracker& tracker = c_.tracker_;
  const Manifest& manifest = c_.manifest_;
  Env& env = *c_.env_;
  const auto timeout = std::chrono::milliseconds(manifest.cluster.connect_timeout_ms);
  for (auto& [id, r] : tracker.requests()) {
    if (r->ticket != t) continue;
    r->timeout = timeout;
    r->deadline = env.Now() + timeout;
    r->max_attempts = 1;
  }
  auto next_note = env.Now() + std::chrono::seconds(2);
  // Whether each shard's host resolves, looked up once (a lookup may block for the resolver's
  // time-out), at the first note about it.
  std::map<uint32_t, Status> resolved;
  while (tracker.ticket(t).outstanding > 0) {
    PARASOL_RETURN_IF_ERROR(c_.Pump(std::chrono::milliseconds(c_.wait_interrupt_ ? 100 : 200)));
    if (c_.wait_interrupt_ && tracker.ticket(t).outstanding > 0) {
      PARASOL_RETURN_IF_ERROR(c_.wait_interrupt_());
    }
    if (env.Now() >= next_note && tracker.ticket(t).outstanding > 0) {
      for (const auto& [id, r] : tracker.requests()) {
        if (r->ticket != t) continue;
        auto [it, first] = resolved.try_emplace(r->shard);
        if (first) it->second = CheckResolves(manifest.cluster.servers[r->shard].host);
        const Status& resolves = it->second;
        spdlog::info("worker {}: waiting for shard {} at {}{}", c_.worker_id_, r->shard,
                     manifest.cluster.servers[r->shard].ToString(),
                     resolves.ok() ? "" : " (" + resolves.message() + ")");
      }
      next_note = env.Now() + std::chrono::seconds(5);
    }
  }
  TicketState& p = tracker.ticket(t);
  if (!p.status.ok()) {
    // A host that does not resolve is why its shard never answered: say so first.
    std::string unresolved;
    for (const ServerAddress& a : manifest.cluster.servers) {
      const Status resolves = CheckResolves(a.host);
      if (!resolves.ok() && unresolved.find(resolves.message()) == std::string::npos) {
        unresolved += resolves.message() + "; ";
      }
    }
    if (!unresolved.empty()) p.status = Status(p.status.code(), unresolved + p.status.message());
  }
  for (uint32_t s = 0; s < p.replies.size() && p.status.ok(); ++s) {
    std::optional<Header> h = c_.ReplyHeader(t, s);
    if (h && (h->shard_rank != s || h->shard_count != c_.num_shards_)) {
      p.status = FailedPrecondition(
          "shard at " + manifest.cluster.servers[s].ToString() + " says it is rank " +
          std::to_string(h->shard_rank) + " of " + std::to_string(h->shard_count) +
          ", but the manifest lists it as rank " + std::to_string(s) + " of " +
          std::to_string(c_.num_shards_));
    }
  }
  return p.status;
}

}  // namespace parasol
