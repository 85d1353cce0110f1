// RequestTracker: a worker's requests on their way, and the tickets that wait on them.
//
// A ticket is what a caller of ShardSession waits on: one pull, push, tick or tool request, which
// goes to one or more shards as one request each. A request is tracked from the moment it is
// sent until its reply: its ticket, its shard, copies of its frames (a resend sends them
// again, with the same request id and push name), its deadline and its attempts. A ticket is
// complete when none of its requests is outstanding; its status is the first failure.
//
// What a reply means for its request is one table (worker/reply_outcome.hpp): done, retry
// later, wait for the restore or the replay, or fail. Which requests are due is asked here
// (Due); resending them, or failing those out of attempts, is the caller's, which owns the
// sockets (ShardSession::Pump). The tracker sends nothing and reads no clock: times are passed in.
//
// Map nodes, with their objects and buffers, are kept when a ticket or a request ends and
// taken by new ones, so a steady stream of steps allocates none.
//
// Thread-safety: none (one per ShardSession).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/status.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "worker/key_split.hpp"

namespace parasol {

// One request to one shard, from its send to its reply.
struct TrackedRequest {
  using TimePoint = std::chrono::steady_clock::time_point;
  int64_t clock = 0;
  uint64_t ticket = 0;
  uint64_t request_id = 0;
  uint32_t shard = 0;
  Op op = Op::Hello;
  bool done = false;                 // a Clock that leaves the job (else a tick)
  std::vector<zmq::message_t> kept;  // copies of the sent frames, for a resend
  std::chrono::milliseconds timeout{0};
  TimePoint deadline;
  uint32_t attempts = 1;
  uint32_t max_attempts = 1;
  // A pull's reply must have these (else it is refused as malformed).
  uint64_t expect_rows = 0;
  uint32_t expect_dim = 0;
  uint64_t expect_offset = 0;
  Status refused;  // the shard's last "not now" (Unavailable) to it, if any
};

// What a ticket's caller gets back, gathered as its requests are answered.
struct TicketState {
  Op op = Op::Hello;
  uint32_t table = 0;
  uint32_t dim = 0;
  uint32_t outstanding = 0;  // requests not yet answered or failed
  Status status;             // the first failure
  // Replies, by shard: frames and a checked view of them (the view points into the frames).
  std::vector<std::vector<zmq::message_t>> replies;
  std::vector<std::optional<PayloadView>> views;
  std::vector<std::string> messages;
  // Sparse pulls: out[i] is row unique_local[u] of shard unique_shard[u], u = inverse[i].
  float* out = nullptr;
  std::vector<uint32_t> inverse;
  std::vector<uint32_t> unique_shard;
  std::vector<uint32_t> unique_local;
  // Dense pushes: the caller's memory travels in frames counted here.
  std::unique_ptr<BorrowTracker> borrows;  // kept when the ticket is reused
  bool borrowing = false;                  // frames of this ticket borrow the caller's memory
  // Sparse pulls with the row cache: rows answered from it, the keys pulled from each shard
  // (for the cache), and each shard's read clock.
  std::vector<float> hit_rows;
  std::vector<std::vector<uint64_t>> cache_keys;
  std::vector<int64_t> read_clocks;
  uint32_t cache_table = 0;
};

class RequestTracker {
 public:
  using Ticket = uint64_t;
  using TimePoint = std::chrono::steady_clock::time_point;
  using RequestMap = std::map<uint64_t, std::unique_ptr<TrackedRequest>>;

  explicit RequestTracker(uint32_t shards = 0) : shards_(shards) {}

  // --- Tickets ---
  // A new ticket for `op` on `table`, with a reply slot per shard and nothing outstanding.
  Ticket Open(Op op, uint32_t table);
  // REQUIRES: `t` is open.
  TicketState& ticket(Ticket t) { return *tickets_.at(t); }
  // The ticket, or null when it is not open.
  TicketState* Find(Ticket t);
  const TicketState* Find(Ticket t) const;
  // Forgets `t` (REQUIRES: none of its requests outstanding); its buffers are kept for a new
  // ticket, the received frames released.
  void Close(Ticket t);

  // --- Requests ---
  // Tracks request `header.request_id` to `shard` under `ticket`, which has one more request
  // outstanding: due at `now + timeout`, sent at most `max_attempts` times. The caller fills
  // in `kept` (the frames a resend sends).
  TrackedRequest& Track(Ticket ticket, const Header& header, uint32_t shard,
                        std::chrono::milliseconds timeout, uint32_t max_attempts, TimePoint now);
  // Request `id`, or null when it is not outstanding (answered, failed, never sent), or when
  // `shard` is given and it went to another shard (a reply of that shard is not for it).
  TrackedRequest* Find(uint64_t id, std::optional<uint32_t> shard);
  bool Outstanding(uint64_t id) const { return requests_.count(id) > 0; }
  // Answered: its ticket has one request fewer outstanding, and it is forgotten.
  void Complete(TrackedRequest& r);
  // Failed: its ticket keeps the first failure and has one request fewer outstanding, and the
  // request is forgotten. Returns the ticket.
  TicketState& Fail(TrackedRequest& r, Status status);
  // Taken out of its ticket without an answer (ShardSession's replay sends it under another).
  void Withdraw(TrackedRequest& r) { Complete(r); }
  // Gives request `r` the id `id` (a resend the shard must not match with earlier copies).
  void Renumber(TrackedRequest& r, uint64_t id);
  // Every outstanding request, by request id (ids grow, so in the order they were first sent).
  RequestMap& requests() { return requests_; }
  const RequestMap& requests() const { return requests_; }

  // --- Deadlines ---
  // How long a wait may last from `now` before a request is due: at most `cap`, at least 0.
  std::chrono::milliseconds UntilDue(TimePoint now, std::chrono::milliseconds cap) const;
  // The ids of the requests due at `now`, in id order (valid until the next call).
  const std::vector<uint64_t>& Due(TimePoint now);

  // --- Buffers reused from ticket to ticket ---
  // A parsed reply's view, its buffers kept (empty when none is spare); and its return.
  PayloadView TakeView();
  void KeepView(PayloadView view);
  // A finished pull's split vectors into `split` (left as they are when none are spare).
  void TakeSplit(KeySplit& split);

  size_t open_tickets() const { return tickets_.size(); }

 private:
  using TicketMap = std::map<Ticket, std::unique_ptr<TicketState>>;
  static constexpr size_t kSpareNodes = 256;
  static constexpr size_t kReservedFrames = 4;  // frames a new request's vectors have room for

  uint32_t shards_;
  Ticket next_ticket_ = 1;
  TicketMap tickets_;
  RequestMap requests_;
  std::vector<TicketMap::node_type> spare_tickets_;
  std::vector<RequestMap::node_type> spare_requests_;
  std::vector<PayloadView> spare_views_;
  std::vector<KeySplit> spare_splits_;
  std::vector<uint64_t> due_;
};

}  // namespace parasol
