// Incremental checkpoints: a full checkpoint and the deltas after it load back exactly as a full
// checkpoint of the same moment does, over random updates, new rows and removed rows (seeded,
// printed); a delta holds only the rows changed since the one before it; a delta is refused
// onto anything but the checkpoint it names; the chain of files is found, and pruning keeps
// every chain whole.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/half.hpp"
#include "common/sharding.hpp"
#include "server/checkpoint.hpp"
#include "tests/support/small_shard.hpp"
#include "tests/support/temp_dir.hpp"

namespace parasol {
namespace {

using testing::SmallShard;

// Every row (clock word, values, state) of every sparse table, by (table, key); every dense
// slice as the file holds it; the clocks.
struct Snapshot {
  std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> rows;
  std::map<uint32_t, std::vector<char>> dense;
  std::vector<int64_t> clocks;
  bool operator==(const Snapshot& o) const {
    if (rows.size() != o.rows.size() || dense != o.dense || clocks != o.clocks) return false;
    for (const auto& [k, v] : rows) {
      auto it = o.rows.find(k);
      if (it == o.rows.end() || std::memcmp(v.data(), it->second.data(), 4 * v.size()) != 0) {
        return false;
      }
    }
    return true;
  }
};

Snapshot Take(SmallShard& s) {
  Snapshot out;
  for (uint32_t t = 0; t < s.manifest().tables.size(); ++t) {
    if (s.manifest().tables[t].kind == TableKind::kSparse) {
      SparseTable& table = s.sparse(t);
      for (uint32_t e = 0; e < table.engines(); ++e) {
        const SparseTable::Partition& p = table.partition(e);
        EXPECT_TRUE(p.ForEachRow([&](uint64_t key, const float* row) {
                      out.rows[{t, key}].assign(row, row + p.stored_floats());
                    }).ok());
      }
    } else {
      s.dense(t).AppendArrays(&out.dense[t]);
    }
  }
  out.clocks = s.controller().clocks();
  return out;
}

class IncrementalCheckpointTest : public testing::TempDirTest {
 protected:

  CheckpointHeader HeaderOf(const SmallShard& s, uint64_t sequence, bool delta) const {
    CheckpointHeader h;
    h.shard = SmallShard::kShard;
    h.shards = static_cast<uint32_t>(s.manifest().cluster.servers.size());
    h.fingerprint = s.manifest().Fingerprint();
    h.clock = 3;
    h.sequence = sequence;
    h.delta = delta;
    return h;
  }

  // Writes shard `s` as checkpoint `sequence` of shard 0 under dir_; a delta with `delta`.
  // Returns the payload bytes of its rows blocks.
  uint64_t Write(SmallShard& s, uint64_t sequence, const DeltaSpec* delta) {
    const std::string path = CheckpointPath(dir_, SmallShard::kShard, sequence);
    uint64_t row_bytes = 0;
    const Status st = WriteCheckpointFile(
        path, HeaderOf(s, sequence, delta != nullptr), [&](const CheckpointBlockSink& sink) {
          return s.state().Save(
              [&](const CheckpointBlock& b) {
                if (IsSparseRows(static_cast<CheckpointBlockKind>(b.kind))) {
                  row_bytes += b.bytes.size();
                }
                return sink(b);
              },
              ShardState::kRowBlockBytes, delta);
        });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return row_bytes;
  }

  Status Load(SmallShard& s, const std::string& path, uint64_t onto) {
    std::ifstream in(path, std::ios::binary);
    CheckpointHeader h;
    return s.state().Load(in, path, &h, /*check_first=*/onto % 2 == 0, onto);
  }

  // Rows of tables 0 and 1 updated at `clock` (new ones among them), some removed, the dense
  // tensors and the clocks changed.
  static void Change(SmallShard& s, std::mt19937_64& rng, uint32_t clock, size_t updates,
                     size_t removals) {
    for (size_t i = 0; i < updates; ++i) {
      const uint32_t t = static_cast<uint32_t>(rng() % 2);
      const uint64_t key = rng() % 400;
      SparseTable& table = s.sparse(t);
      SparseTable::Partition& p = table.partition(EngineOfKey(key, table.engines()));
      float* v = p.FindOrCreate(key, clock);
      v[0] = static_cast<float>(rng() % 1000) / 7.0f;
      SparseTable::Partition::LastClock(v) = clock;
      p.Store(v);
    }
    for (size_t i = 0; i < removals; ++i) {
      const uint32_t t = static_cast<uint32_t>(rng() % 2);
      const uint64_t key = rng() % 400;
      SparseTable& table = s.sparse(t);
      SparseTable::Partition& p = table.partition(EngineOfKey(key, table.engines()));
      ASSERT_TRUE(p.EraseKey(key).ok());
      // Every other one created again since: in the delta's removed rows and its rows both.
      if (i % 2 == 0) {
        float* v = p.FindOrCreate(key, clock);
        v[0] = -static_cast<float>(key);
        SparseTable::Partition::LastClock(v) = clock;
        p.Store(v);
      }
    }
    for (uint32_t t : {2u, 3u}) {
      std::vector<char> bytes;
      s.dense(t).AppendArrays(&bytes);
      const float v = static_cast<float>(clock) + 0.25f;
      std::memcpy(bytes.data() + 4 * (rng() % s.dense(t).slice().size()), &v, sizeof(v));
      s.dense(t).RestoreArrays(bytes.data());
    }
    s.controller().SetClock(0, clock);
    s.controller().SetClock(1, clock);
    s.controller().SetClock(2, clock);
  }

  // The removed keys each partition recorded since the last call, by table.
  static std::vector<std::vector<uint64_t>> TakeRemoved(SmallShard& s) {
    std::vector<std::vector<uint64_t>> out(s.manifest().tables.size());
    for (uint32_t t : {0u, 1u}) {
      for (uint32_t e = 0; e < s.sparse(t).engines(); ++e) {
        std::vector<uint64_t> keys = s.sparse(t).partition(e).TakeRemoved();
        out[t].insert(out[t].end(), keys.begin(), keys.end());
      }
    }
    return out;
  }

};

TEST_F(IncrementalCheckpointTest, AFullCheckpointAndItsDeltasLoadAsAFullOneOfTheSameMoment) {
  for (uint64_t seed : {1ull, 2ull, 3ull, 4ull, 5ull}) {
    std::filesystem::remove_all(dir_);
    std::mt19937_64 rng(seed);
    const int deltas = 1 + static_cast<int>(rng() % 5);
    std::printf("[ seed     ] %llu: a full checkpoint and %d deltas\n", (unsigned long long)seed,
                deltas);
    SmallShard s;
    for (uint32_t t : {0u, 1u}) {
      for (uint32_t e = 0; e < s.sparse(t).engines(); ++e) {
        s.sparse(t).partition(e).RecordRemovals(true);
      }
    }
    Change(s, rng, 1, 300, 0);
    (void)TakeRemoved(s);
    Write(s, 1, nullptr);
    uint32_t since = 1;  // the clock when the checkpoint before was taken
    for (int d = 0; d < deltas; ++d) {
      const uint32_t clock = 2 + d;
      Change(s, rng, clock, 20 + rng() % 60, rng() % 15);
      DeltaSpec spec{1, 1 + static_cast<uint64_t>(d), since, TakeRemoved(s)};
      Write(s, 2 + d, &spec);
      since = clock;
    }
    const Snapshot want = Take(s);
    // The chain, found from its newest file.
    auto chain = CheckpointChain(dir_, SmallShard::kShard, 1 + deltas);
    ASSERT_TRUE(chain.ok()) << chain.status().ToString();
    ASSERT_EQ(chain->size(), static_cast<size_t>(1 + deltas));
    SmallShard loaded;
    uint64_t onto = 0;
    for (const std::string& file : *chain) {
      const Status st = Load(loaded, file, onto);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ++onto;
    }
    // As a full checkpoint of the same moment loads.
    Write(s, 100, nullptr);
    SmallShard full;
    ASSERT_TRUE(Load(full, CheckpointPath(dir_, SmallShard::kShard, 100), 0).ok());
    const Snapshot got = Take(loaded), reference = Take(full);
    EXPECT_EQ(got.rows.size(), want.rows.size());
    EXPECT_TRUE(got == want) << "seed " << seed;
    EXPECT_TRUE(reference == want) << "seed " << seed;
  }
}

TEST_F(IncrementalCheckpointTest, WithDtypeBf16RowsTakeFewerBytesAndLoadRoundedToNearest) {
  // The same shard written with checkpoint.dtype f32 and bf16, fulls and a chain of deltas:
  // the bf16 rows take (8 + 4 + 2 (n - 1)) bytes a row where f32 rows take 8 + 4 n, and load as
  // the f32 rows rounded to bf16's nearest (a row's clock word exact); the rest is exact.
  // The small shard's tables and a sparse adam table, whose rows end with a step count (a
  // uint32, written as it is).
  static const std::string kTablesPlusAdam =
      std::string(testing::kSmallShardManifest) +
      "  - name: moments\n    dim: 3\n    optimizer: {kind: adam, lr: 0.01}\n";
  static const std::string kWide = kTablesPlusAdam;
  static const std::string kBf16 = kTablesPlusAdam + "checkpoint:\n  dtype: bf16\n";
  // Adam rows with their steps set past what bf16 holds exactly (a float's rounding of the
  // step's bits would lose them).
  auto adam_rows = [](SmallShard& s, uint32_t clock) {
    SparseTable& table = s.sparse(4);
    for (uint64_t key = 0; key < 40; ++key) {
      SparseTable::Partition& p = table.partition(EngineOfKey(key, table.engines()));
      float* v = p.FindOrCreate(key, clock);
      v[0] = 0.1f * static_cast<float>(key) + static_cast<float>(clock);
      const uint32_t step = 40001 + static_cast<uint32_t>(key) + clock;
      std::memcpy(&v[3 + 2 * 3], &step, sizeof(step));  // after the values, m and v
      SparseTable::Partition::LastClock(v) = clock;
      p.Store(v);
    }
  };
  for (uint64_t seed : {11ull, 12ull, 13ull}) {
    std::filesystem::remove_all(dir_);
    std::printf("[ seed     ] %llu\n", (unsigned long long)seed);
    std::mt19937_64 rng(seed), same(seed);
    SmallShard wide(kWide.c_str()), narrow(kBf16.c_str());
    ASSERT_TRUE(narrow.manifest().checkpoint.bf16);
    for (SmallShard* s : {&wide, &narrow}) {
      for (uint32_t t : {0u, 1u}) {
        for (uint32_t e = 0; e < s->sparse(t).engines(); ++e) {
          s->sparse(t).partition(e).RecordRemovals(true);
        }
      }
    }
    Change(wide, rng, 1, 300, 0);
    Change(narrow, same, 1, 300, 0);
    adam_rows(wide, 1);
    adam_rows(narrow, 1);
    (void)TakeRemoved(wide);
    (void)TakeRemoved(narrow);
    const uint64_t wide_bytes = Write(wide, 1, nullptr);
    const uint64_t narrow_bytes = Write(narrow, 101, nullptr);
    uint64_t want_wide = 0, want_narrow = 0;
    for (const auto& [k, v] : Take(wide).rows) {
      const size_t raw = k.first == 4 ? 1 : 0;  // adam's step
      want_wide += 8 + 4 * v.size();
      want_narrow += 8 + 4 + 4 * raw + 2 * (v.size() - 1 - raw);
    }
    EXPECT_EQ(wide_bytes, want_wide);
    EXPECT_EQ(narrow_bytes, want_narrow);
    std::printf("rows: %llu bytes as f32, %llu as bf16 (%.3f)\n",
                (unsigned long long)wide_bytes, (unsigned long long)narrow_bytes,
                static_cast<double>(narrow_bytes) / wide_bytes);
    // Two deltas on each.
    uint32_t since = 1;
    for (int d = 0; d < 2; ++d) {
      const uint32_t clock = 2 + d;
      const size_t updates = 20 + rng() % 60, removals = rng() % 15;
      same.seed(rng());  // the two shards change alike
      std::mt19937_64 again = same;
      Change(wide, same, clock, updates, removals);
      Change(narrow, again, clock, updates, removals);
      adam_rows(wide, clock);
      adam_rows(narrow, clock);
      DeltaSpec w{1, 1 + static_cast<uint64_t>(d), since, TakeRemoved(wide)};
      DeltaSpec n{101, 101 + static_cast<uint64_t>(d), since, TakeRemoved(narrow)};
      Write(wide, 2 + d, &w);
      Write(narrow, 102 + d, &n);
      since = clock;
    }
    const Snapshot want = Take(wide);
    ASSERT_TRUE(Take(narrow) == want);  // the same state, written two ways
    auto chain = CheckpointChain(dir_, SmallShard::kShard, 103);
    ASSERT_TRUE(chain.ok()) << chain.status().ToString();
    ASSERT_EQ(chain->size(), 3u);
    SmallShard loaded(kBf16.c_str());
    uint64_t onto = 0;
    for (const std::string& file : *chain) {
      const Status st = Load(loaded, file, onto == 0 ? 0 : 100 + onto);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ++onto;
    }
    const Snapshot got = Take(loaded);
    ASSERT_EQ(got.rows.size(), want.rows.size());
    EXPECT_EQ(got.dense, want.dense);
    EXPECT_EQ(got.clocks, want.clocks);
    uint64_t rounded = 0;
    for (const auto& [k, v] : want.rows) {
      const std::vector<float>& g = got.rows.at(k);
      ASSERT_EQ(g.size(), v.size());
      ASSERT_EQ(std::memcmp(&g[0], &v[0], 4), 0) << "the clock word of key " << k.second;
      if (k.first == 4) {  // adam's step count, the row's last word: exact
        ASSERT_EQ(std::memcmp(&g.back(), &v.back(), 4), 0) << "the step of key " << k.second;
        uint32_t step;
        std::memcpy(&step, &g.back(), 4);
        EXPECT_GT(step, 40000u);
      }
      for (size_t j = 1; j + (k.first == 4 ? 1 : 0) < v.size(); ++j) {
        const float r = Bf16ToF32(F32ToBf16(v[j]));
        ASSERT_EQ(std::memcmp(&g[j], &r, 4), 0)
            << "table " << k.first << " key " << k.second << " float " << j << ": " << g[j]
            << " for " << v[j];
        rounded += r != v[j];
      }
    }
    EXPECT_GT(rounded, 0u);  // some values were not bf16 to begin with (f16 state, f32 rows)
  }
}

TEST_F(IncrementalCheckpointTest, ADeltaHoldsOnlyTheRowsChangedSinceTheCheckpointBefore) {
  SmallShard s(testing::kOneTableManifest);
  SparseTable& table = s.sparse(0);
  for (uint64_t key = 0; key < 50000; ++key) {
    table.partition(EngineOfKey(key, 2)).FindOrCreate(key, 1);
  }
  const uint64_t full = Write(s, 1, nullptr);
  const uint64_t stride = 8 + 4 * (1 + 16 + 1);
  EXPECT_EQ(full, 50000 * stride);
  for (const uint64_t changed : {10ull, 1000ull}) {
    for (uint64_t i = 0; i < changed; ++i) {
      const uint64_t key = i * 37 % 50000;
      float* v = table.partition(EngineOfKey(key, 2)).Find(key);
      ASSERT_NE(v, nullptr);
      v[0] += 1;
      SparseTable::Partition::LastClock(v) = 2;
    }
    DeltaSpec spec{1, 1, 2, {}};
    const uint64_t bytes = Write(s, 2, &spec);
    EXPECT_EQ(bytes, changed * stride) << changed << " rows changed";
    // The next round starts from the same full checkpoint: the rows go back to clock 1.
    for (uint64_t i = 0; i < changed; ++i) {
      const uint64_t key = i * 37 % 50000;
      SparseTable::Partition::LastClock(table.partition(EngineOfKey(key, 2)).Find(key)) = 1;
    }
  }
}

TEST_F(IncrementalCheckpointTest, ADeltaIsRefusedOntoAnythingButTheCheckpointItNames) {
  SmallShard s;
  std::mt19937_64 rng(9);
  Change(s, rng, 1, 100, 0);
  Write(s, 1, nullptr);
  Change(s, rng, 2, 30, 0);
  DeltaSpec spec{1, 1, 1, TakeRemoved(s)};
  Write(s, 2, &spec);
  const std::string delta = CheckpointPath(dir_, SmallShard::kShard, 2);
  // Onto nothing, and onto another checkpoint.
  for (uint64_t onto : {0ull, 5ull}) {
    SmallShard loaded;
    const Status st = Load(loaded, delta, onto);
    EXPECT_FALSE(st.ok()) << "onto " << onto;
    EXPECT_NE(st.message().find("a delta of checkpoint 1"), std::string::npos) << st.ToString();
  }
  // A full checkpoint onto one.
  SmallShard loaded;
  ASSERT_TRUE(Load(loaded, CheckpointPath(dir_, SmallShard::kShard, 1), 0).ok());
  const Status st = Load(loaded, CheckpointPath(dir_, SmallShard::kShard, 1), 1);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a full checkpoint, loaded onto checkpoint 1"), std::string::npos)
      << st.ToString();
}

TEST_F(IncrementalCheckpointTest, PruningNeverBreaksAChainAndAMissingLinkIsNamed) {
  SmallShard s;
  std::mt19937_64 rng(11);
  Change(s, rng, 1, 50, 0);
  // Sequences 1 (full), 2, 3, 4 (deltas), 5 (full), 6 (delta).
  for (uint64_t seq = 1; seq <= 6; ++seq) {
    const bool full = seq == 1 || seq == 5;
    DeltaSpec spec{seq < 5 ? 1ull : 5ull, seq - 1, static_cast<uint32_t>(seq), {}};
    Write(s, seq, full ? nullptr : &spec);
  }
  // Keeping 3 keeps 4, 5 and 6, and what 4 builds on: 1 to 3.
  PruneCheckpoints(dir_, SmallShard::kShard, 3);
  EXPECT_EQ(ListCheckpoints(dir_, SmallShard::kShard).size(), 6u);
  // Keeping 2 keeps 5 and 6 only.
  PruneCheckpoints(dir_, SmallShard::kShard, 2);
  const auto left = ListCheckpoints(dir_, SmallShard::kShard);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[1], CheckpointPath(dir_, SmallShard::kShard, 5));
  auto chain = CheckpointChain(dir_, SmallShard::kShard, 6);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->size(), 2u);
  // Without its full checkpoint, a delta's chain names what is missing.
  std::filesystem::remove(CheckpointPath(dir_, SmallShard::kShard, 5));
  chain = CheckpointChain(dir_, SmallShard::kShard, 6);
  ASSERT_FALSE(chain.ok());
  EXPECT_NE(chain.status().message().find("builds on 5"), std::string::npos)
      << chain.status().ToString();
}

}  // namespace
}  // namespace parasol
