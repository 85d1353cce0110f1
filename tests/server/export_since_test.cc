// `parasol export --since`: when the checkpoint it is since is in the same chains as the one
// exported, the export reads only the deltas after it, and holds exactly the rows updated since
// (removed ones left out) with their values now, and every dense tensor whole; otherwise it
// reads both models and compares them row by row. Seeded, printed; both ways are compared.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/sharding.hpp"
#include "server/checkpoint.hpp"
#include "server/model_export.hpp"
#include "tests/support/small_shard.hpp"
#include "tests/support/temp_dir.hpp"

namespace parasol {
namespace {

using testing::SmallShard;

constexpr const char* kManifest = R"(
cluster:
  servers: ["127.0.0.1:1"]
  workers: 1
server:
  engine_threads: 2
tables:
  - name: emb
    dim: 4
    optimizer: {kind: adagrad, lr: 0.1}
  - name: w
    kind: dense
    shape: [6]
)";

class ExportSinceTest : public testing::TempDirTest {
 protected:
  // Writes `s` as checkpoint `sequence` (a delta of the chain from `base` onto `sequence` - 1
  // when `since` >= 0: the rows updated at or after that clock).
  void Write(SmallShard& s, uint64_t sequence, int64_t since, uint64_t base) {
    CheckpointHeader h;
    h.shard = 0;
    h.shards = 1;
    h.fingerprint = s.manifest().Fingerprint();
    h.clock = static_cast<int64_t>(sequence);
    h.sequence = sequence;
    h.delta = since >= 0;
    DeltaSpec spec;
    if (since >= 0) {
      spec.base = base;
      spec.previous = sequence - 1;
      spec.since = static_cast<uint32_t>(since);
      spec.removed.resize(2);
      for (uint32_t e = 0; e < s.sparse(0).engines(); ++e) {
        std::vector<uint64_t> r = s.sparse(0).partition(e).TakeRemoved();
        spec.removed[0].insert(spec.removed[0].end(), r.begin(), r.end());
      }
    } else {
      for (uint32_t e = 0; e < s.sparse(0).engines(); ++e) (void)s.sparse(0).partition(e).TakeRemoved();
    }
    const Status st = WriteCheckpointFile(
        CheckpointPath(dir_, 0, sequence), h, [&](const CheckpointBlockSink& sink) {
          return s.state().Save(sink, ShardState::kRowBlockBytes, since >= 0 ? &spec : nullptr);
        });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  // Updates `n` random rows at `clock` (each to a new value) and removes `removals`; records
  // which keys were updated since the last call and which exist.
  void Change(SmallShard& s, std::mt19937_64& rng, uint32_t clock, int n, int removals) {
    for (int i = 0; i < n; ++i) {
      const uint64_t key = rng() % 300;
      SparseTable::Partition& p = s.sparse(0).partition(EngineOfKey(key, s.sparse(0).engines()));
      float* v = p.FindOrCreate(key, clock);
      v[0] += 1.0f + static_cast<float>(rng() % 100);
      SparseTable::Partition::LastClock(v) = clock;
      p.Store(v);
      updated_.insert(key);
    }
    for (int i = 0; i < removals; ++i) {
      const uint64_t key = rng() % 300;
      ASSERT_TRUE(s.sparse(0).partition(EngineOfKey(key, s.sparse(0).engines())).EraseKey(key).ok());
      updated_.erase(key);
    }
    std::vector<char> bytes;
    s.dense(1).AppendArrays(&bytes);
    const float v = static_cast<float>(clock) + 0.5f;
    std::memcpy(bytes.data() + 4 * (rng() % 6), &v, sizeof(v));
    s.dense(1).RestoreArrays(bytes.data());
  }

  std::set<uint64_t> updated_;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::map<uint64_t, std::vector<float>> RowsOf(SmallShard& s) {
  std::map<uint64_t, std::vector<float>> out;
  for (uint32_t e = 0; e < s.sparse(0).engines(); ++e) {
    EXPECT_TRUE(s.sparse(0).partition(e).ForEachRow([&](uint64_t key, const float* row) {
      out[key].assign(row + 1, row + 5);  // the values, after the clock word
    }).ok());
  }
  return out;
}

TEST_F(ExportSinceTest, SinceACheckpointOfTheSameChainsItHoldsTheRowsOfTheDeltasAfterIt) {
  for (uint64_t seed : {1ull, 2ull, 3ull}) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::printf("[ seed     ] %llu\n", (unsigned long long)seed);
    std::mt19937_64 rng(seed);
    Result<Manifest> m = ParseManifest(kManifest, "export_since");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    SmallShard s(kManifest);
    s.sparse(0).partition(0).RecordRemovals(true);
    s.sparse(0).partition(1).RecordRemovals(true);
    // A chain: full 1, deltas 2 to 4; then a full 5 and its delta 6.
    Change(s, rng, 1, 200, 0);
    Write(s, 1, -1, 0);
    updated_.clear();
    for (uint64_t seq = 2; seq <= 4; ++seq) {
      Change(s, rng, static_cast<uint32_t>(seq), 30 + static_cast<int>(rng() % 30),
             static_cast<int>(rng() % 8));
      Write(s, seq, static_cast<int64_t>(seq), 1);
    }
    const auto rows_at_4 = RowsOf(s);
    const std::set<uint64_t> since_1 = updated_;
    ExportOptions o;
    o.checkpoint_dir = dir_;
    o.sequence = 4;
    o.since = 1;
    ASSERT_TRUE(ExportModel(*m, o, dir_ + "/delta").ok());
    auto got = LoadExportedModel(*m, dir_ + "/delta");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_NE(ReadText(dir_ + "/delta/model.json").find("\"from_deltas\": true"),
              std::string::npos);
    // Exactly the rows updated since 1 and still there, with their values at 4.
    std::set<uint64_t> keys;
    for (const auto& [key, v] : got->sparse.at("emb")) {
      keys.insert(key);
      EXPECT_EQ(v, rows_at_4.at(key)) << "key " << key;
    }
    EXPECT_EQ(keys, since_1);
    EXPECT_GT(keys.size(), 20u);
    // Every value was changed by each update: the row-by-row comparison finds the same rows.
    // It is what a checkpoint outside the chain gets: since 4, exporting 6 (after a full 5).
    Change(s, rng, 5, 40, 3);
    Write(s, 5, -1, 0);
    updated_.clear();
    Change(s, rng, 6, 40, 3);
    Write(s, 6, 6, 5);
    const auto rows_at_6 = RowsOf(s);
    o.sequence = 6;
    o.since = 4;
    ASSERT_TRUE(ExportModel(*m, o, dir_ + "/compared").ok());
    auto compared = LoadExportedModel(*m, dir_ + "/compared");
    ASSERT_TRUE(compared.ok()) << compared.status().ToString();
    EXPECT_NE(ReadText(dir_ + "/compared/model.json").find("\"from_deltas\": false"),
              std::string::npos);
    std::set<uint64_t> changed;
    for (const auto& [key, v] : rows_at_6) {
      auto old = rows_at_4.find(key);
      if (old == rows_at_4.end() || old->second != v) changed.insert(key);
    }
    std::set<uint64_t> exported;
    for (const auto& [key, v] : compared->sparse.at("emb")) exported.insert(key);
    EXPECT_EQ(exported, changed);
    // And since 5, in 6's chain: the delta's rows.
    o.since = 5;
    ASSERT_TRUE(ExportModel(*m, o, dir_ + "/delta6").ok());
    auto six = LoadExportedModel(*m, dir_ + "/delta6");
    ASSERT_TRUE(six.ok());
    std::set<uint64_t> six_keys;
    for (const auto& [key, v] : six->sparse.at("emb")) six_keys.insert(key);
    EXPECT_EQ(six_keys, updated_);
    // Dense tensors whole, as at 6.
    std::vector<float> dense(6);
    s.dense(1).ReadValues(0, 6, dense.data());
    EXPECT_EQ(six->dense.at("w"), dense);
  }
}

}  // namespace
}  // namespace parasol
