#include "worker/step_batch.hpp"

#include <algorithm>

#include "common/protocol.hpp"
#include "worker/node_reuse.hpp"

namespace parasol {

void StepBatch::Begin(uint32_t shards) {
  gathering_ = true;
  queues_.resize(shards);
  counts_.resize(shards, 0);
}

StepBatch::Entry& StepBatch::Add(uint32_t shard) {
  std::vector<Entry>& queue = queues_[shard];
  if (counts_[shard] == queue.size()) queue.emplace_back().frames.reserve(kReservedFrames);
  return queue[counts_[shard]++];
}

void StepBatch::End(const std::function<void(uint32_t, std::span<Entry>)>& send) {
  gathering_ = false;
  for (uint32_t s = 0; s < queues_.size(); ++s) {
    const size_t n = counts_[s];
    counts_[s] = 0;
    if (n > 0) send(s, std::span<Entry>(queues_[s].data(), n));
  }
}

void StepBatch::Cut(std::span<const Entry> queue, uint64_t max_bytes,
                    std::vector<size_t>* starts) {
  starts->clear();
  size_t begin = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < queue.size(); ++i) {
    const Entry& e = queue[i];
    const size_t size = i - begin;
    const Entry& first = queue[begin];
    const bool fits = size > 0 && e.clock == first.clock &&
                      StepMayHold(first.op, first.op, first.done, 0) &&
                      StepMayHold(first.op, e.op, e.done, size) &&
                      StepHasRoom(size, bytes, e.payload_bytes, max_bytes);
    if (!fits) {
      starts->push_back(i);
      begin = i;
      bytes = 0;
    }
    bytes += e.payload_bytes;
  }
}

std::vector<uint64_t>& StepBatch::Record(uint64_t step_id) {
  StepMap::node_type node =
      TakeNode<StepMap>(spare_steps_, step_id, [] { return std::vector<uint64_t>(); });
  node.mapped().clear();
  return steps_.insert(std::move(node)).position->second;
}

const std::vector<uint64_t>* StepBatch::Parts(uint64_t step_id) const {
  auto it = steps_.find(step_id);
  return it == steps_.end() ? nullptr : &it->second;
}

void StepBatch::Forget(uint64_t step_id) {
  StepMap::node_type node = steps_.extract(step_id);
  if (!node.empty() && spare_steps_.size() < kSpareNodes) spare_steps_.push_back(std::move(node));
}

void StepBatch::ForgetAnswered(const std::function<bool(uint64_t)>& outstanding) {
  for (auto it = steps_.begin(); it != steps_.end();) {
    const uint64_t id = it->first;
    const bool live = std::any_of(it->second.begin(), it->second.end(), outstanding);
    ++it;
    if (!live) Forget(id);
  }
}

}  // namespace parasol
