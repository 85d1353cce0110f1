#include "server/shard_state.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include "common/sharding.hpp"
#include "tests/support/small_shard.hpp"

namespace parasol {
namespace {

using testing::SmallShard;

class ShardStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/parasol-shard-state-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Rows in both sparse tables, changed dense values, clocks and recorded pushes.
  static void Train(SmallShard& s) {
    for (uint32_t t : {0u, 1u}) {
      SparseTable& table = s.sparse(t);
      for (uint64_t key : {1ull, 2ull, 77ull, 1ull << 40}) {
        float* v = table.partition(EngineOfKey(key, table.engines())).FindOrCreate(key, 2);
        v[0] = static_cast<float>(key % 1000) + 0.5f * t;
      }
    }
    for (uint32_t t : {2u, 3u}) {
      float* v = s.dense(t).PrepareWrite();
      for (uint64_t i = 0; i < s.dense(t).slice().size(); ++i) v[i] = 0.25f * i - t;
    }
    s.controller().SetClock(0, 3);
    s.controller().SetClock(1, 4);
    s.controller().SetClock(2, 3);
    s.dedup().Mark(1, 99, 5);
  }

  CheckpointHeader HeaderOf(const SmallShard& s) const {
    CheckpointHeader h;
    h.shard = SmallShard::kShard;
    h.shards = static_cast<uint32_t>(s.manifest().cluster.servers.size());
    h.fingerprint = s.manifest().Fingerprint();
    h.clock = 3;
    h.sequence = 1;
    return h;
  }

  Status Load(SmallShard& s, const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    CheckpointHeader h;
    return s.state().Load(in, path, &h);
  }

  std::string dir_;
};

// Every value the shard holds, by (table, key): sparse rows (clock word first) and dense
// slices with their state (key ~0).
std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> Contents(SmallShard& s) {
  std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> out;
  for (uint32_t t : {0u, 1u}) {
    SparseTable& table = s.sparse(t);
    for (uint32_t e = 0; e < table.engines(); ++e) {
      const uint32_t n = table.partition(e).stored_floats();
      table.partition(e).ForEachRow([&](uint64_t key, const float* row) {
        out[{t, key}] = std::vector<float>(row, row + n);
      });
    }
  }
  for (uint32_t t : {2u, 3u}) {
    DenseTable& d = s.dense(t);
    std::vector<float>& v = out[{t, ~0ull}];
    const uint64_t n = d.slice().size();
    v.assign(d.Share().get(), d.Share().get() + n);
    for (uint32_t a = 0; a < d.state_array_count(); ++a) {
      v.insert(v.end(), d.state_arrays()[a], d.state_arrays()[a] + n);
    }
  }
  return out;
}

TEST_F(ShardStateTest, ASavedShardLoadsBackValueForValue) {
  SmallShard saved;
  Train(saved);
  const std::string path = dir_ + "/ckpt.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, HeaderOf(saved), saved.state().Save()).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Contents(loaded), Contents(saved));
  EXPECT_EQ(loaded.controller().clocks(), saved.controller().clocks());
  EXPECT_TRUE(loaded.dedup().Seen(1, 99, 5));
  EXPECT_FALSE(loaded.dedup().Seen(1, 99, 6));
}

// Each case changes the blocks of a good checkpoint (its checksums stay right: these are files
// a writer with a bug, or an attacker, could produce) and says what the refusal must name.
struct BadBlocks {
  const char* what;
  std::function<void(std::vector<CheckpointBlock>&, CheckpointHeader&)> change;
  const char* says;
};

TEST_F(ShardStateTest, BlocksThatDisagreeWithTheManifestAreRefusedAndChangeNothing) {
  SmallShard trained;
  Train(trained);
  const std::vector<CheckpointBlock> good = trained.state().Save();
  ASSERT_EQ(good.size(), 6u);  // emb, small, w, b, clocks, push record
  const uint64_t emb_rows = good[0].count;
  const std::vector<BadBlocks> cases = {
      {"table id past the manifest", [](auto& b, auto&) { b[0].table = 9; },
       "block 0 (kind 1, table 9, at byte 64): table 9 is not in the manifest (4 tables)"},
      {"sparse rows for a dense table", [](auto& b, auto&) { b[0].table = 2; },
       "sparse rows for dense table 'w'"},
      {"a dense slice for a sparse table", [](auto& b, auto&) { b[2].table = 0; },
       "block 2 (kind 2, table 0, at byte"},
      {"two dense slices swapped", [](auto& b, auto&) { std::swap(b[2].table, b[3].table); },
       "table 'b': a slice of 11 elements; this shard's slice has 3"},
      {"a dense count off by one", [](auto& b, auto&) { b[3].count += 1; },
       "table 'b': a slice of 4 elements"},
      {"a sparse count that does not match the bytes", [](auto& b, auto&) { b[0].count += 1; },
       "table 'emb' rows: "},
      // count x 44 wraps around to exactly the block's bytes: a check without overflow
      // detection would accept it and read 2^62 rows.
      {"a count whose product with the row size wraps",
       [emb_rows](auto& b, auto&) { b[0].count = emb_rows + (uint64_t{1} << 62); },
       "table 'emb' rows: 4611686018427387908 x 44 bytes overflow"},
      {"a kind no shard writes", [](auto& b, auto&) { b[1].kind = 9; }, "unknown block kind 9"},
      {"a second block of one table", [](auto& b, auto&) { b.insert(b.begin() + 1, b[0]); },
       "a second block of table 'emb'"},
      {"a table left out", [](auto& b, auto&) { b.erase(b.begin() + 1); },
       "has no block of table 'small'"},
      {"clocks of fewer workers",
       [](auto& b, auto&) {
         b[4].count = 2;
         b[4].bytes.resize(16);
       },
       "clocks of 2 workers; the manifest has 3"},
      {"a negative clock",
       [](auto& b, auto&) {
         const int64_t clock = -5;
         std::memcpy(b[4].bytes.data() + 8, &clock, 8);
       },
       "worker 1's clock -5 is out of range"},
      {"a malformed push record", [](auto& b, auto&) { b[5].bytes.resize(3); },
       "malformed push record"},
      {"another shard's file", [](auto&, auto& h) { h.shard = 1; }, "belongs to shard 1 of 2"},
      {"a header clock out of range",
       [](auto&, auto& h) { h.clock = std::numeric_limits<int64_t>::max(); },
       "clock 9223372036854775807 is out of range"},
  };
  for (const BadBlocks& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<CheckpointBlock> blocks = good;
    CheckpointHeader h = HeaderOf(trained);
    c.change(blocks, h);
    const std::string path = dir_ + "/bad.bin";
    ASSERT_TRUE(WriteCheckpointFile(path, h, blocks).ok());
    SmallShard s;
    const std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> before = Contents(s);
    const Status st = Load(s, path);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("checkpoint '" + path + "'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_EQ(Contents(s), before);  // nothing applied
    EXPECT_EQ(s.controller().MaxClock(), 0);
    EXPECT_FALSE(s.dedup().Seen(1, 99, 5));
  }
}

}  // namespace
}  // namespace parasol
