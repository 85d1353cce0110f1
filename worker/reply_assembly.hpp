// What a worker's request gets from its shard's reply, and what a ticket's caller gets once
// every reply is in. A pull's reply is checked against its request (the rows, dim and offset
// asked for) before anything of it is used; a sparse pull's rows then go back to the caller in
// the caller's key order, each distinct key having travelled once (worker/key_split.hpp).
// Pure: no sockets; the tickets and requests are worker/request_tracker.hpp's.
#pragma once

#include <cstdint>
#include <vector>

#include <zmq.hpp>

#include "common/status.hpp"
#include "common/wire.hpp"
#include "worker/request_tracker.hpp"

namespace parasol {

// Keeps `shard`'s reply `h` (with `frames`, header first) to request `r` in its ticket `p`,
// once its payload parses (within `max_bytes`) and a pull's has the rows, dim and offset `r`
// expects; else an error naming the shard and the op, and the request should fail.
// - A dense pull's chunk is copied to its place in p.out at once (so that the copies overlap
//   the other shards' replies) and its frames released.
// - Any other reply keeps its frames and a view into them (p.views) for AssembleSparsePull,
//   and a sparse pull with the row cache its read clock.
// `frames` is swapped with the ticket's slot: the caller gets an empty vector back, whose
// capacity it may reuse. The tracker lends and takes back the views' buffers.
Status AcceptReply(const Header& h, const TrackedRequest& r, TicketState& p, uint32_t shard,
                   std::vector<zmq::message_t>& frames, uint64_t max_bytes,
                   RequestTracker& tracker);

// A finished sparse pull's rows into p.out, in the caller's order: out[i] is row
// p.unique_local[u] of shard p.unique_shard[u]'s reply, u = p.inverse[i], or of p.hit_rows
// when that shard is kNoShard (worker/request_frames.hpp; the row cache answered it).
// REQUIRES: every shard that was sent keys has a view in p.views.
void AssembleSparsePull(const TicketState& p);

}  // namespace parasol
