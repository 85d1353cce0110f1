#include "worker/request_tracker.hpp"

#include <algorithm>

#include "worker/node_reuse.hpp"

namespace parasol {

RequestTracker::Ticket RequestTracker::Open(Op op, uint32_t table) {
  const Ticket t = next_ticket_++;
  TicketMap::node_type node =
      TakeNode<TicketMap>(spare_tickets_, t, [] { return std::make_unique<TicketState>(); });
  TicketState& p = *node.mapped();
  p.op = op;
  p.table = table;
  p.replies.resize(shards_);
  p.views.resize(shards_);
  p.messages.resize(shards_);
  tickets_.insert(std::move(node));
  return t;
}

TicketState* RequestTracker::Find(Ticket t) {
  auto it = tickets_.find(t);
  return it == tickets_.end() ? nullptr : it->second.get();
}

const TicketState* RequestTracker::Find(Ticket t) const {
  auto it = tickets_.find(t);
  return it == tickets_.end() ? nullptr : it->second.get();
}

void RequestTracker::Close(Ticket t) {
  auto it = tickets_.find(t);
  if (it == tickets_.end()) return;
  TicketMap::node_type node = tickets_.extract(it);
  if (spare_tickets_.size() >= kSpareNodes) return;
  TicketState& p = *node.mapped();
  // Back to a new ticket's state, the buffers' capacity kept (the received frames released).
  auto replies = std::move(p.replies);
  for (auto& r : replies) r.clear();
  auto views = std::move(p.views);
  for (auto& v : views) {
    if (v && spare_views_.size() < kSpareNodes) spare_views_.push_back(std::move(*v));
    v.reset();
  }
  auto messages = std::move(p.messages);
  for (auto& m : messages) m.clear();
  if (p.inverse.capacity() > 0 && spare_splits_.size() < kSpareNodes) {
    KeySplit& spare = spare_splits_.emplace_back();
    spare.inverse = std::move(p.inverse);
    spare.unique_shard = std::move(p.unique_shard);
    spare.unique_local = std::move(p.unique_local);
  }
  auto hit_rows = std::move(p.hit_rows);
  auto borrows = std::move(p.borrows);  // released: the ticket's caller waited for it
  hit_rows.clear();
  p = TicketState();
  p.replies = std::move(replies);
  p.views = std::move(views);
  p.messages = std::move(messages);
  p.hit_rows = std::move(hit_rows);
  p.borrows = std::move(borrows);
  spare_tickets_.push_back(std::move(node));
}

TrackedRequest& RequestTracker::Track(Ticket ticket, const Header& header, uint32_t shard,
                                      std::chrono::milliseconds timeout, uint32_t max_attempts,
                                      TimePoint now) {
  RequestMap::node_type node = TakeNode<RequestMap>(spare_requests_, header.request_id, [] {
    auto r = std::make_unique<TrackedRequest>();
    // Room for a header and a few payload frames, so that a node reused for a request of more
    // frames than its last rarely grows.
    r->kept.reserve(kReservedFrames);
    return r;
  });
  TrackedRequest& r = *node.mapped();
  r.ticket = ticket;
  r.clock = header.clock;
  r.request_id = header.request_id;
  r.shard = shard;
  r.op = header.op;
  r.done = header.done;
  r.refused = Status::Ok();
  r.timeout = timeout;
  r.deadline = now + timeout;
  r.max_attempts = max_attempts;
  ++tickets_.at(ticket)->outstanding;
  return *requests_.insert(std::move(node)).position->second;
}

TrackedRequest* RequestTracker::Find(uint64_t id, std::optional<uint32_t> shard) {
  auto it = requests_.find(id);
  if (it == requests_.end() || (shard && it->second->shard != *shard)) return nullptr;
  return it->second.get();
}

void RequestTracker::Complete(TrackedRequest& r) {
  --tickets_.at(r.ticket)->outstanding;
  RequestMap::node_type node = requests_.extract(r.request_id);
  if (node.empty() || spare_requests_.size() >= kSpareNodes) return;
  TrackedRequest& spare = *node.mapped();
  auto kept = std::move(spare.kept);
  kept.clear();
  spare = TrackedRequest();
  spare.kept = std::move(kept);
  spare_requests_.push_back(std::move(node));
}

TicketState& RequestTracker::Fail(TrackedRequest& r, Status status) {
  TicketState& p = *tickets_.at(r.ticket);
  if (p.status.ok()) p.status = std::move(status);
  Complete(r);
  return p;
}

void RequestTracker::Renumber(TrackedRequest& r, uint64_t id) {
  RequestMap::node_type node = requests_.extract(r.request_id);
  node.key() = id;
  node.mapped()->request_id = id;
  requests_.insert(std::move(node));
}

std::chrono::milliseconds RequestTracker::UntilDue(TimePoint now,
                                                   std::chrono::milliseconds cap) const {
  auto wait = cap;
  for (const auto& [id, r] : requests_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(r->deadline - now);
    wait = std::max(std::chrono::milliseconds(0), std::min(wait, left));
  }
  return wait;
}

const std::vector<uint64_t>& RequestTracker::Due(TimePoint now) {
  due_.clear();
  for (const auto& [id, r] : requests_) {
    if (r->deadline <= now) due_.push_back(id);
  }
  return due_;
}

PayloadView RequestTracker::TakeView() {
  if (spare_views_.empty()) return PayloadView();
  PayloadView v = std::move(spare_views_.back());
  spare_views_.pop_back();
  return v;
}

void RequestTracker::KeepView(PayloadView view) {
  if (spare_views_.size() < kSpareNodes) spare_views_.push_back(std::move(view));
}

void RequestTracker::TakeSplit(KeySplit& split) {
  if (spare_splits_.empty()) return;
  split.inverse = std::move(spare_splits_.back().inverse);
  split.unique_shard = std::move(spare_splits_.back().unique_shard);
  split.unique_local = std::move(spare_splits_.back().unique_local);
  spare_splits_.pop_back();
}

}  // namespace parasol
