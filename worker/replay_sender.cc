#include "worker/replay_sender.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "common/protocol.hpp"
#include "worker/push_log.hpp"
#include "worker/replay_plan.hpp"
#include "worker/request_frames.hpp"
#include "worker/request_tracker.hpp"

namespace parasol {

void ReplaySender::Start(uint32_t shard) {
  const ShardSession::Ticket ticket = c_.NewTicket(Op::Clock, 0);
  ReplayInputs in;
  in.clock = c_.clock_;
  in.left = c_.left_;
  in.in_job = c_.JobRank();
  in.restored_clock = c_.recovery_.restored_clock(shard);
  in.serving_from = c_.relay_.membership().ServingFrom(shard);
  // A rank that joined later has no clocks before its join (parasol_sim --elastic --seed 265).
  const int64_t joined = c_.relay_.membership().join(c_.worker_id_);
  if (c_.JobRank() && joined > in.serving_from) in.serving_from = joined;
  if (shard >= c_.ShardsFrom(c_.clock_ - 1) && c_.relay_.membership().RemovedAt(shard) >= 0) {
    in.removed_at = c_.relay_.membership().RemovedAt(shard);
  }
  in.last_push_count = c_.last_push_count_[shard];
  in.last_barrier = c_.barrier_passed_;
  std::deque<PushLog::Entry> log = c_.recovery_.StartReplay(shard);
  // Pushes from before the shard last started serving (a change removed it, a later one gave
  // it rows again) belong to rows that moved away and back with the scale tool: not replayed.
  log.erase(std::remove_if(log.begin(), log.end(),
                           [&](const PushLog::Entry& e) { return e.clock < in.serving_from; }),
            log.end());
  // What was in flight to the old process, in the order it was first sent (the tracker's
  // requests are ordered by request id, which grows). A replay that the shard's previous process had not
  // finished: its pushes not yet acknowledged go back into this replay's log, in clock order;
  // its Clocks are sent again anyway.
  bool merged = false;
  RequestTracker::RequestMap& requests = c_.tracker_.requests();
  for (auto it = requests.begin(); it != requests.end();) {
    TrackedRequest& r = *it->second;
    if (r.shard != shard) {
      ++it;
      continue;
    }
    const bool of_replay =
        std::find(c_.replay_tickets_.begin(), c_.replay_tickets_.end(), r.ticket) !=
        c_.replay_tickets_.end();
    if (!of_replay) {
      in.in_flight.push_back({it->first, r.op, r.clock, r.done});
      ++it;
      continue;
    }
    if (r.op == Op::PushSparse || r.op == Op::PushDense) {
      PushLog::Entry e;
      e.clock = r.clock;
      e.frames = std::move(r.kept);
      log.push_back(std::move(e));
      merged = true;
    }
    ++it;  // before `r` is withdrawn
    c_.tracker_.Withdraw(r);
  }
  c_.replay_tickets_.push_back(ticket);
  if (merged) {
    std::stable_sort(log.begin(), log.end(), [](const PushLog::Entry& a, const PushLog::Entry& b) {
      return a.clock < b.clock;
    });
  }
  for (const PushLog::Entry& e : log) {
    in.log_clocks.push_back(e.clock);
    Result<Header> h = DecodeHeader(e.frames[0].data(), e.frames[0].size());
    in.log_indexes.push_back(h.ok() ? h->seq : 0);
  }
  const ReplayPlan plan = PlanReplay(in);

  auto send_push = [&](PushLog::Entry& entry) {
    Result<Header> h = DecodeHeader(entry.frames[0].data(), entry.frames[0].size());
    if (!h.ok()) return;  // written by this client: cannot happen
    h->request_id = c_.next_request_id_++;
    h->replay = true;
    h->known_epoch = c_.recovery_.epoch(shard);  // for this process of the shard only
    std::vector<zmq::message_t> payload;
    for (size_t f = 1; f < entry.frames.size(); ++f) payload.push_back(std::move(entry.frames[f]));
    c_.Send(ticket, shard, *h, std::move(payload));
  };
  auto send_clock = [&](const ReplayStep& step) {
    Header h = c_.NewRequest(Op::Clock, 0);
    h.clock = step.clock;
    h.done = step.done;
    h.caught_up = step.caught_up;
    h.replay = true;
    h.known_epoch = c_.recovery_.epoch(shard);
    if (step.caught_up) h.last_barrier = step.last_barrier;
    SetTickNamedPushes(h, step.named);
    c_.Send(ticket, shard, h, {});
  };
  // Whatever was in flight to the old process is gone: sent again under a new request id, so
  // that a late answer to a copy that reached the new process before this replay (an error
  // from its restored state) cannot complete it.
  auto resend = [&](uint64_t id) {
    TrackedRequest* found = c_.tracker_.Find(id, std::nullopt);
    if (!found) return;
    TrackedRequest& r = *found;
    Result<Header> h = DecodeHeader(r.kept[0].data(), r.kept[0].size());
    if (h.ok()) {
      h->request_id = c_.next_request_id_++;
      r.kept[0] = EncodeHeader(*h);
      c_.tracker_.Renumber(r, h->request_id);
    }
    std::vector<zmq::message_t> frames;
    for (auto& k : r.kept) frames.push_back(CopyMessage(k));
    (void)c_.links_->Send(shard, frames);
    r.deadline = c_.env_->Now() + r.timeout;
  };
  for (const ReplayStep& step : plan.steps) {
    switch (step.kind) {
      case ReplayStep::Kind::kClock:
        send_clock(step);
        break;
      case ReplayStep::Kind::kPush:
        send_push(log[step.index]);
        break;
      case ReplayStep::Kind::kResend:
        resend(step.index);
        break;
    }
  }
  spdlog::info("worker {}: replaying {} pushes and clocks {}..{} to shard {}", c_.worker_id_,
               plan.pushes, plan.first, plan.last, shard);
}

void ReplaySender::Reap() {
  for (auto it = c_.replay_tickets_.begin(); it != c_.replay_tickets_.end();) {
    TicketState* p = c_.tracker_.Find(*it);
    if (!p || p->outstanding > 0) {
      ++it;
      continue;
    }
    if (!p->status.ok() && c_.replay_failure_.ok()) {
      c_.replay_failure_ = p->status.WithContext(
          "worker " + std::to_string(c_.worker_id_) +
          ": a replay to a restarted shard was not accepted, so acknowledged updates would be "
          "lost");
      spdlog::error("{}", c_.replay_failure_.ToString());
    }
    c_.tracker_.Close(*it);
    it = c_.replay_tickets_.erase(it);
  }
}

}  // namespace parasol
