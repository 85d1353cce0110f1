// StepBatch: a step's requests, gathered per shard between ShardSession::BeginStep() and
// SendStep(), cut into Step messages by the Step rule (common/protocol.hpp), and the Steps on
// their way with the requests they carry.
//
// Each gathered request keeps its own request id, push name, ticket and time-out in the
// request tracker (worker/request_tracker.hpp), and is resent on its own; a Step is only how
// the first copies travel. A Step's reply carries its parts' replies, each handled as a reply
// to its own request; a Step refused as a whole fails the parts still outstanding.
//
// Entries and their frame buffers are kept from step to step, so a steady stream of steps
// allocates none.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include <zmq.hpp>

#include "common/wire.hpp"

namespace parasol {

class StepBatch {
 public:
  // A request gathered for a Step.
  struct Entry {
    uint64_t request_id = 0;
    Op op = Op::Hello;
    bool done = false;  // a tick that leaves the job
    int64_t clock = 0;
    uint64_t payload_bytes = 0;  // of the request, and of a pull's reply
    std::vector<zmq::message_t> frames;
  };

  // From now on requests are gathered, for `shards` shards.
  void Begin(uint32_t shards);
  bool gathering() const { return gathering_; }
  // The next entry of `shard`'s queue, its buffers reused (the caller fills it in).
  Entry& Add(uint32_t shard);
  // Ends gathering. Returns each shard's queue in turn through `send(shard, queue)`; the queues
  // are empty for the next step afterwards.
  void End(const std::function<void(uint32_t shard, std::span<Entry> queue)>& send);

  // Where `queue` is cut into Steps: the first entry of each run that travels as one Step (a
  // run of one travels alone). By the Step rule: pushes of one clock, or pulls of one clock
  // after at most one tick, within kMaxStepParts parts and `max_bytes` payload bytes.
  static void Cut(std::span<const Entry> queue, uint64_t max_bytes, std::vector<size_t>* starts);

  // Steps on their way: the request ids of the parts of Step `step_id` (filled in by the
  // caller), or null for a Step not recorded (all its parts answered on their own).
  std::vector<uint64_t>& Record(uint64_t step_id);
  const std::vector<uint64_t>* Parts(uint64_t step_id) const;
  void Forget(uint64_t step_id);
  // Forgets the Steps none of whose parts is `outstanding`.
  void ForgetAnswered(const std::function<bool(uint64_t request_id)>& outstanding);
  size_t steps_in_flight() const { return steps_.size(); }

 private:
  using StepMap = std::map<uint64_t, std::vector<uint64_t>>;
  static constexpr size_t kSpareNodes = 256;
  static constexpr size_t kReservedFrames = 4;  // a header and a few payload frames

  bool gathering_ = false;
  // Per shard: the entries gathered so far are the first counts_[shard] (the others, kept for
  // their buffers, are reused by the next step).
  std::vector<std::vector<Entry>> queues_;
  std::vector<size_t> counts_;
  StepMap steps_;
  std::vector<StepMap::node_type> spare_steps_;
};

}  // namespace parasol
