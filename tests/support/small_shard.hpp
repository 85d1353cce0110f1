// SmallShard: one shard of a small fixed job, its tables (and BSP aggregates) held the way
// ShardServer holds them, without a socket or engine threads: what checkpoints are loaded into
// and saved from in tests/server/shard_state_test.cc, the checkpoint fuzzer and its seed
// generator.
#pragma once

#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "common/manifest.hpp"
#include "common/sharding.hpp"
#include "server/consistency_controller.hpp"
#include "server/dense_table.hpp"
#include "server/push_record.hpp"
#include "server/shard_state.hpp"
#include "server/sparse_table.hpp"

namespace parasol::testing {

// Shard 0 of 2, three workers, three engines: sparse tables with and without optimizer state,
// admission and eviction; dense tables whose slices on this shard are not the whole tensor; one
// table of each kind with 16-bit values and state.
inline constexpr const char* kSmallShardManifest = R"(
cluster:
  servers: ["127.0.0.1:1", "127.0.0.1:2"]
  workers: 3
server:
  engine_threads: 3
tables:
  - name: emb
    dim: 4
    optimizer: {kind: adagrad, lr: 0.1}
    dtype: bf16
    state_dtype: f16
  - name: small
    dim: 1
    admission: {min_count: 2}
    eviction: {ttl_clocks: 5, max_rows: 100}
  - name: w
    kind: dense
    shape: [7, 3]
    optimizer: {kind: adam, lr: 0.01}
  - name: b
    kind: dense
    shape: [5]
    optimizer: {kind: ftrl}
    dtype: f16
    state_dtype: bf16
)";

// One shard, one worker, two engines, one sparse table of dim 16 (adagrad_rowwise): the shape
// of the restore and incremental checkpoint tests' larger tables.
inline constexpr const char* kOneTableManifest = R"(
cluster:
  servers: ["127.0.0.1:1"]
  workers: 1
server:
  engine_threads: 2
tables:
  - name: emb
    dim: 16
    optimizer: {kind: adagrad_rowwise, lr: 0.1}
)";

// A small push record window keeps its checkpoints small (the shard keeps 64 clocks).
inline constexpr uint32_t kSmallShardWindow = 8;

class SmallShard {
 public:
  static constexpr uint32_t kShard = 0;

  // The job of `manifest_text` (kSmallShardManifest unless given; another job's shard has the
  // push record window a server has).
  explicit SmallShard(const char* manifest_text = kSmallShardManifest)
      : window_(manifest_text == kSmallShardManifest ? kSmallShardWindow
                                                     : PushRecord::kDefaultWindowClocks) {
    Result<Manifest> m = ParseManifest(manifest_text, "small_shard");
    if (!m.ok()) std::abort();
    manifest_ = std::move(*m);
    Reset();
  }

  // Fresh tables, clocks and push record, as a shard has them before it restores.
  void Reset() {
    sparse_.clear();
    dense_.clear();
    const uint32_t shards = static_cast<uint32_t>(manifest_.cluster.servers.size());
    for (const TableOptions& t : manifest_.tables) {
      if (t.kind == TableKind::kSparse) {
        sparse_.push_back(std::make_unique<SparseTable>(t, manifest_.server.engine_threads));
        dense_.push_back(nullptr);
      } else {
        sparse_.push_back(nullptr);
        dense_.push_back(
            std::make_unique<DenseTable>(t, DenseSlice(t.NumElements(), kShard, shards)));
      }
    }
    controller_.emplace(manifest_.training, manifest_.cluster.workers,
                        ConsistencyController::SteadyClock::time_point(),
                        manifest_.cluster.max_workers);
    record_ = PushRecord(window_);
    pending_.clear();
    membership_ = JobMembership(manifest_);
    state_.emplace(manifest_, kShard, sparse_, dense_, *controller_, record_, pending_,
                   manifest_.server.engine_threads, membership_);
  }

  const Manifest& manifest() const { return manifest_; }
  ShardState& state() { return *state_; }
  SparseTable& sparse(uint32_t table) { return *sparse_[table]; }
  DenseTable& dense(uint32_t table) { return *dense_[table]; }
  ConsistencyController& controller() { return *controller_; }
  PushRecord& record() { return record_; }
  Membership& membership() { return membership_; }
  // BSP sums of clocks not yet applied (as ShardServer's aggregates), by clock.
  PendingAggregates& pending() { return pending_; }
  // Dense table `table` holding `slice` instead (as a shard's does during and after a change of
  // the job's shard count), its pending sums alike.
  void Reslice(uint32_t table, SliceRange slice) {
    const SliceRange was = dense_[table]->slice();
    dense_[table] = dense_[table]->Resliced(slice);
    for (auto& [clock, agg] : pending_) agg->ResliceDense(table, was, slice);
  }

 private:
  uint32_t window_;
  Manifest manifest_;
  std::vector<std::unique_ptr<SparseTable>> sparse_;
  std::vector<std::unique_ptr<DenseTable>> dense_;
  std::optional<ConsistencyController> controller_;
  PushRecord record_{kSmallShardWindow};
  PendingAggregates pending_;
  Membership membership_;
  std::optional<ShardState> state_;
};

}  // namespace parasol::testing
