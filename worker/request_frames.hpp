// How a worker's requests are cut into frames, before PsClient sends them: the keys of a
// sparse pull, the keys and gradient rows of a sparse push (a key given twice travels once,
// its rows summed), the chunks a dense tensor travels in, and the dtype values travel in
// (wire.compression). Pure: no sockets, no tickets, no clock; each function fills buffers the
// caller reuses from call to call, so a steady stream of steps allocates only its messages.
//
// The split of the keys by shard is worker/key_split.hpp's; these lay out each shard's part.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <zmq.hpp>

#include "common/manifest.hpp"
#include "common/placement.hpp"
#include "common/wire.hpp"
#include "worker/key_split.hpp"

namespace parasol {

// Another reference to a frame's bytes (zmq_msg_copy: a large frame's buffer is shared, not
// copied), to send while the tracker keeps the frame for a later resend.
inline zmq::message_t CopyMessage(zmq::message_t& m) {
  zmq::message_t c;
  c.copy(m);
  return c;
}

// The dtype values travel in for the manifest's wire.compression.
wire::DType WireDTypeOf(const WireOptions& wire);

// A push's f32 value frames, payload[first_value_frame ..], narrowed to `dtype` in place (F16:
// scaled by one power of two for the whole message), and `h`'s dtype and value_scale set to
// match. With F32, nothing changes. A narrowed frame is a copy: one that borrowed the caller's
// memory no longer does.
void CompressValueFrames(wire::DType dtype, Header* h, std::vector<zmq::message_t>* payload,
                         size_t first_value_frame);

// A unique key that travels to no shard (the row cache answered it): split.unique_shard says
// so.
inline constexpr uint32_t kNoShard = 0xffffffffu;

// A sparse pull's key frames: key_bufs[s] (resized to `shards`, each rebuilt) holds the
// split.counts[s] keys that go to shard s, each at its split.unique_local position, 8-byte
// aligned. Keys whose unique id has shard kNoShard are left out.
void PullKeyFrames(std::span<const uint64_t> keys, const KeySplit& split, uint32_t shards,
                   std::vector<zmq::message_t>& key_bufs);

// A sparse push's frames, by shard: one frame of keys, and the gradient rows in value frames of
// at most frame_bytes each (common/wire.hpp, PlanValueFrames). A key that the caller gives
// more than once travels once, with the sum of its rows added in the caller's order.
struct PushFrames {
  std::vector<zmq::message_t> keys;                 // by shard
  std::vector<FramePlan> plans;                     // by shard
  std::vector<std::vector<zmq::message_t>> values;  // by shard, its value frames
  std::vector<uint8_t> written;                     // scratch: unique ids written so far
};
// REQUIRES: grads.size() == keys.size() * dim, and `split` is keys' split among `shards`.
void BuildPushFrames(std::span<const uint64_t> keys, std::span<const float> grads, uint32_t dim,
                     const KeySplit& split, uint32_t shards, uint64_t frame_bytes,
                     PushFrames& out);

// fn(shard, chunk) for each chunk of each shard's slice of a `total`-element dense tensor in
// `placement`, shard by shard, in element order. A chunk has at most frame_bytes of floats (at
// least one element): each travels as a request of one frame, so that the transfer of one
// overlaps the update (push) or the copy-out (pull) of the one before.
template <typename Fn>
void ForEachDenseChunk(uint64_t total, const Placement& placement, uint64_t frame_bytes,
                       Fn&& fn) {
  const uint64_t chunk = std::max<uint64_t>(1, frame_bytes / sizeof(float));
  for (uint32_t shard = 0; shard < placement.count(); ++shard) {
    const SliceRange slice = placement.DenseSliceOf(total, shard);
    for (uint64_t b = slice.begin; b < slice.end; b += chunk) {
      fn(shard, SliceRange{b, std::min(slice.end, b + chunk)});
    }
  }
}

}  // namespace parasol
