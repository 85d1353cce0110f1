// Writes valid checkpoints of the small shard (tests/support/small_shard.hpp), as the seed
// corpus of checkpoint_fuzzer. Usage: fuzz_checkpoint_seeds FOLDER
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/sharding.hpp"
#include "server/checkpoint.hpp"
#include "server/clock_aggregate.hpp"
#include "tests/support/small_shard.hpp"

namespace {

using parasol::testing::SmallShard;

bool Write(SmallShard& shard, const std::string& path, int64_t clock) {
  parasol::CheckpointHeader h;
  h.shard = SmallShard::kShard;
  h.shards = static_cast<uint32_t>(shard.manifest().cluster.servers.size());
  h.fingerprint = shard.manifest().Fingerprint();
  h.clock = clock;
  h.sequence = 1;
  const parasol::Status st = parasol::WriteCheckpointFile(path, h, *shard.state().Save());
  if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
  return st.ok();
}

// Rows in the sparse tables, changed values in the dense ones, clocks and pushes recorded
// (the slowest worker at clock 4).
void Train(SmallShard& shard, uint64_t rows) {
  for (uint32_t table : {0u, 1u}) {
    parasol::SparseTable& t = shard.sparse(table);
    for (uint64_t key = 1; key <= rows; ++key) {
      const uint64_t k = key * 0x9e3779b97f4a7c15ULL >> table;
      parasol::SparseTable::Partition& part = t.partition(parasol::EngineOfKey(k, t.engines()));
      float* values = part.FindOrCreate(k, 3);
      values[0] += 0.25f * static_cast<float>(key);
      part.Store(values);  // a 16-bit row keeps its change
    }
  }
  // One SGD-like step of +0.5 on every dense element, through the table's own arrays (16-bit
  // values are rounded as the table stores them).
  for (uint32_t table : {2u, 3u}) {
    parasol::DenseTable& d = shard.dense(table);
    std::vector<char> bytes;
    d.AppendArrays(&bytes);
    for (uint64_t i = 0; i < d.slice().size(); ++i) {
      float v;
      std::memcpy(&v, bytes.data() + i * sizeof(float), sizeof(v));
      v += 0.5f;
      std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof(v));
    }
    d.RestoreArrays(bytes.data());
  }
  for (uint32_t w = 0; w < 3; ++w) shard.controller().SetClock(w, 4 + w);
  // Every other push with its payload's checksum (the record's "PSRECRD3" entries).
  for (uint64_t seq = 0; seq < 70; seq += 3) {
    (void)shard.record().Mark(seq % 2, int64_t(seq / 4), seq, seq % 2 ? 0 : 0x5eed0000 + seq,
                              /*incarnation=*/7);
  }
}

// BSP sums pending for the slowest worker's clock and the one after it: rows of both sparse
// tables, the slice of one dense table at the first clock and of both at the second.
void SumPending(SmallShard& shard) {
  const uint32_t engines = shard.manifest().server.engine_threads;
  const uint32_t tables = static_cast<uint32_t>(shard.manifest().tables.size());
  for (int64_t clock : {4, 5}) {
    auto& agg = shard.pending()[clock];
    agg = std::make_unique<parasol::ClockAggregate>(tables, engines);
    for (int64_t worker : {0, 2}) {  // two workers' sums, kept apart
      parasol::ClockAggregate::Part& part = agg->PartOf(worker);
      for (uint32_t table : {0u, 1u}) {
        const uint32_t dim = shard.sparse(table).dim();
        for (uint64_t key = 1; key <= 5; ++key) {
          const uint64_t k = key * 0x9e3779b97f4a7c15ULL >> table;
          float* sum = part.SparseSum(table, parasol::EngineOfKey(k, engines), k, dim);
          for (uint32_t d = 0; d < dim; ++d) sum[d] += 0.125f * static_cast<float>(key + d);
        }
      }
      for (uint32_t table : {2u, 3u}) {
        if (table == 3 && clock == 4) continue;
        const uint64_t n = shard.dense(table).slice().size();
        float* sum = part.DenseSum(table, n);
        for (uint64_t i = 0; i < n; ++i) sum[i] -= 0.5f * static_cast<float>(i + worker);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  SmallShard shard;
  if (!Write(shard, dir + "/fresh", -1)) return 1;
  Train(shard, 4);
  if (!Write(shard, dir + "/few-rows", 4)) return 1;
  shard.Reset();
  Train(shard, 24);
  if (!Write(shard, dir + "/more-rows", 4)) return 1;
  shard.Reset();
  Train(shard, 4);
  SumPending(shard);
  // (corpus/checkpoint/pending-sums is the same state as written before sums were kept per
  // worker: block kinds 5 and 6.)
  if (!Write(shard, dir + "/pending-sums-per-worker", 4)) return 1;
  // Dense tables holding other elements than the listed shards' cut (block kind 12), as in the
  // middle of a change of the shard count (2 -> 1 at clock 10), with their pending sums.
  shard.Reset();
  Train(shard, 4);
  if (!shard.membership().SetServers(10, 1).ok()) return 1;
  shard.Reslice(2, parasol::SliceRange{0, 21});
  shard.Reslice(3, parasol::SliceRange{0, 5});
  SumPending(shard);
  if (!Write(shard, dir + "/dense-ranges", 4)) return 1;
  return 0;
}
