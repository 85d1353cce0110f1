#include "worker/request_frames.hpp"

#include <cstring>

#include "common/transport.hpp"

namespace parasol {

wire::DType WireDTypeOf(const WireOptions& wire) {
  switch (wire.compression) {
    case WireOptions::Compression::kBf16:
      return wire::DType::BF16;
    case WireOptions::Compression::kF16:
      return wire::DType::F16;
    case WireOptions::Compression::kNone:
      break;
  }
  return wire::DType::F32;
}

void CompressValueFrames(wire::DType dtype, Header* h, std::vector<zmq::message_t>* payload,
                         size_t first_value_frame) {
  if (dtype == wire::DType::F32) return;
  const int scale =
      NarrowValueFrames(std::span<zmq::message_t>(*payload).subspan(first_value_frame), dtype);
  h->dtype = dtype;
  h->value_scale = static_cast<int16_t>(scale);
}

void PullKeyFrames(std::span<const uint64_t> keys, const KeySplit& split, uint32_t shards,
                   std::vector<zmq::message_t>& key_bufs) {
  key_bufs.resize(shards);
  for (uint32_t s = 0; s < shards; ++s) key_bufs[s].rebuild(split.counts[s] * sizeof(uint64_t));
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t u = split.inverse[i];
    if (split.unique_shard[u] == kNoShard) continue;
    std::memcpy(key_bufs[split.unique_shard[u]].data<std::byte>() +
                    split.unique_local[u] * sizeof(uint64_t),
                &keys[i], sizeof(uint64_t));
  }
}

void BuildPushFrames(std::span<const uint64_t> keys, std::span<const float> grads, uint32_t dim,
                     const KeySplit& split, uint32_t shards, uint64_t frame_bytes,
                     PushFrames& out) {
  const size_t row_bytes = size_t{dim} * sizeof(float);
  out.keys.resize(shards);
  out.plans.resize(shards);
  out.values.resize(shards);
  for (uint32_t s = 0; s < shards; ++s) {
    out.values[s].clear();
    out.keys[s].rebuild(split.counts[s] * sizeof(uint64_t));
    out.plans[s] = PlanValueFrames(split.counts[s], dim, frame_bytes);
    for (uint32_t f = 0; f < out.plans[s].frames; ++f) {
      out.values[s].emplace_back(out.plans[s].RowsInFrame(f, split.counts[s]) * row_bytes);
    }
  }
  out.written.assign(split.unique_shard.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t u = split.inverse[i];
    const uint32_t s = split.unique_shard[u];
    const uint64_t local = split.unique_local[u];
    const FramePlan& plan = out.plans[s];
    const uint64_t f = local / plan.rows_per_frame;
    float* dst = reinterpret_cast<float*>(out.values[s][f].data<std::byte>() +
                                          (local - f * plan.rows_per_frame) * row_bytes);
    const float* src = grads.data() + i * dim;
    if (!out.written[u]) {
      out.written[u] = 1;
      std::memcpy(out.keys[s].data<std::byte>() + local * sizeof(uint64_t), &keys[i],
                  sizeof(uint64_t));
      std::memcpy(dst, src, row_bytes);
    } else {
      for (uint32_t d = 0; d < dim; ++d) dst[d] += src[d];
    }
  }
}

}  // namespace parasol
