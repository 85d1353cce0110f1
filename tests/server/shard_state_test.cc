#include "server/shard_state.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

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
        SparseTable::Partition& part = table.partition(EngineOfKey(key, table.engines()));
        float* v = part.FindOrCreate(key, 2);
        v[0] = static_cast<float>(key % 1000) + 0.5f * t;
        part.Store(v);  // a 16-bit row keeps its change
      }
    }
    for (uint32_t t : {2u, 3u}) {
      DenseTable& d = s.dense(t);
      std::vector<char> bytes;
      d.AppendArrays(&bytes);  // values, then state: the values set here
      for (uint64_t i = 0; i < d.slice().size(); ++i) {
        const float v = 0.25f * i - t;
        std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof(v));
      }
      d.RestoreArrays(bytes.data());
    }
    s.controller().SetClock(0, 3);
    s.controller().SetClock(1, 4);
    s.controller().SetClock(2, 3);
    s.controller().SetDone(2, 3);
    ASSERT_TRUE(s.record().Mark(1, 99, 5).ok());
  }

  // BSP sums pending for clocks 3 and 4 (Train's slowest worker is at 3): three keys in each
  // sparse table; dense table 'w' at both clocks, 'b' at clock 4 only. Values no arithmetic
  // would round-trip by accident: -0, a subnormal, a NaN with a payload.
  // `several`: sums of workers 0 and 1 and, at clock 4, of no one worker (as an older
  // checkpoint holds them); else of worker 0 only.
  static void TrainPending(SmallShard& s, bool several = false) {
    const uint32_t engines = s.manifest().server.engine_threads;
    const uint32_t tables = static_cast<uint32_t>(s.manifest().tables.size());
    const float odd[] = {-0.0f, 1e-40f, std::bit_cast<float>(0x7fc01234u), -3.5f};
    for (int64_t clock : {3, 4}) {
      std::unique_ptr<ClockAggregate>& agg = s.pending()[clock];
      agg = std::make_unique<ClockAggregate>(tables, engines);
      for (int64_t worker : {int64_t{0}, int64_t{1}, ClockAggregate::kNoWorker}) {
        if (worker != 0 && !several) continue;
        if (worker == ClockAggregate::kNoWorker && clock == 3) continue;
        ClockAggregate::Part& part = agg->PartOf(worker);
        for (uint32_t t : {0u, 1u}) {
          const uint32_t dim = s.sparse(t).dim();
          for (uint64_t key : {5ull, 6ull, 1ull << 50}) {
            if (worker == 1 && key == 6) continue;
            float* sum = part.SparseSum(t, EngineOfKey(key, engines), key, dim);
            for (uint32_t d = 0; d < dim; ++d) {
              sum[d] = odd[(key + d) % 4] + 0.5f * clock + static_cast<float>(worker);
            }
          }
        }
        for (uint32_t t : {2u, 3u}) {
          if (t == 3 && (clock == 3 || (several && worker == 0))) continue;
          const uint64_t n = s.dense(t).slice().size();
          float* sum = part.DenseSum(t, n);
          for (uint64_t i = 0; i < n; ++i) {
            sum[i] = odd[i % 4] - 0.25f * static_cast<float>(i) + static_cast<float>(worker);
          }
        }
      }
    }
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

  // Writes each case's changed copy of `good` and loads it into a fresh shard: it must be
  // refused, naming the file and what the case says, with nothing applied.
  struct BadBlocks {
    const char* what;
    std::function<void(std::vector<CheckpointBlock>&, CheckpointHeader&)> change;
    const char* says;
  };
  void ExpectRefused(const SmallShard& trained, const std::vector<CheckpointBlock>& good,
                     const std::vector<BadBlocks>& cases);

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
      (void)table.partition(e).ForEachRow([&](uint64_t key, const float* row) {
        out[{t, key}] = std::vector<float>(row, row + n);
      });
    }
  }
  for (uint32_t t : {2u, 3u}) {
    DenseTable& d = s.dense(t);
    std::vector<float>& v = out[{t, ~0ull}];
    std::vector<char> bytes;
    d.AppendArrays(&bytes);
    v.resize(bytes.size() / sizeof(float));
    std::memcpy(v.data(), bytes.data(), bytes.size());
  }
  return out;
}

// Every pending sum, by (clock, worker, table, engine, key) (dense: engine and key ~0), as
// bits.
std::map<std::tuple<int64_t, int64_t, uint32_t, uint32_t, uint64_t>, std::vector<uint32_t>>
PendingBits(SmallShard& s) {
  std::map<std::tuple<int64_t, int64_t, uint32_t, uint32_t, uint64_t>, std::vector<uint32_t>> out;
  auto bits = [](const float* v, uint64_t n) {
    std::vector<uint32_t> b(n);
    std::memcpy(b.data(), v, n * sizeof(float));
    return b;
  };
  for (const auto& [clock, agg] : s.pending()) {
    for (const auto& [worker, part] : agg->parts()) {
      for (uint32_t t : {0u, 1u}) {
        const uint32_t dim = s.sparse(t).dim();
        for (uint32_t e = 0; e < s.manifest().server.engine_threads; ++e) {
          part.ForEachSparse(t, e, dim, [&](uint64_t key, const float* sum) {
            out[{clock, worker, t, e, key}] = bits(sum, dim);
          });
        }
      }
      for (uint32_t t : {2u, 3u}) {
        if (const float* sum = part.DenseSumIfAny(t)) {
          out[{clock, worker, t, ~0u, ~0ull}] = bits(sum, s.dense(t).slice().size());
        }
      }
    }
  }
  return out;
}

void ShardStateTest::ExpectRefused(const SmallShard& trained,
                                   const std::vector<CheckpointBlock>& good,
                                   const std::vector<BadBlocks>& cases) {
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
    EXPECT_EQ(s.record().Check(1, 99, 5), PushRecord::Verdict::kNew);
    EXPECT_TRUE(s.pending().empty());
  }
}

TEST_F(ShardStateTest, ASavedShardLoadsBackValueForValue) {
  SmallShard saved;
  Train(saved);
  const std::string path = dir_ + "/ckpt.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, HeaderOf(saved), *saved.state().Save()).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Contents(loaded), Contents(saved));
  EXPECT_EQ(loaded.controller().clocks(), saved.controller().clocks());
  EXPECT_EQ(loaded.record().Check(1, 99, 5), PushRecord::Verdict::kApplied);
  EXPECT_EQ(loaded.record().Check(1, 99, 6), PushRecord::Verdict::kNew);
}

TEST_F(ShardStateTest, RowsStreamedInSmallBlocksLoadBackValueForValue) {
  SmallShard saved;
  Train(saved);
  const std::string path = dir_ + "/ckpt.bin";
  // Blocks of at most 40 bytes: a row each, so every sparse table comes in several blocks,
  // written one by one as Save() produces them.
  std::map<uint32_t, int> sparse_blocks;
  const Status written = WriteCheckpointFile(path, HeaderOf(saved), [&](const CheckpointBlockSink& sink) {
    return saved.state().Save(
        [&](const CheckpointBlock& b) {
          if (b.kind == 1) ++sparse_blocks[b.table];
          return sink(b);
        },
        40);
  });
  ASSERT_TRUE(written.ok()) << written.ToString();
  ASSERT_FALSE(sparse_blocks.empty());
  for (const auto& [table, blocks] : sparse_blocks) EXPECT_GT(blocks, 1) << "table " << table;
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Contents(loaded), Contents(saved));
  EXPECT_EQ(loaded.controller().clocks(), saved.controller().clocks());
}

// The membership (which ranks leave the running job, and when) comes back as it was; an entry
// out of range is refused and changes nothing.
TEST_F(ShardStateTest, TheMembershipLoadsBackAndABadEntryIsRefused) {
  SmallShard saved;
  Train(saved);
  ASSERT_TRUE(saved.membership().SetLeave(1, 7).ok());
  const std::vector<CheckpointBlock> good = *saved.state().Save();
  ASSERT_EQ(good.back().kind, 10u);
  const std::string path = dir_ + "/ckpt.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, HeaderOf(saved), good).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(loaded.membership(), saved.membership());
  EXPECT_EQ(loaded.membership().leave(1), 7);
  const std::vector<BadBlocks> cases = {
      {"a rank past cluster.max_workers",
       [](auto& b, auto&) {
         const int64_t worker = 9;
         std::memcpy(b.back().bytes.data(), &worker, 8);
       },
       "membership entry 0 (worker 9, join -1, leave 7) is out of range"},
      {"a second membership block", [](auto& b, auto&) { b.push_back(b.back()); },
       "a second membership block"},
  };
  ExpectRefused(saved, good, cases);
}

// A checkpoint taken while a replay was owed says the count it holds every acknowledged push
// before (less than its sequence); one taken otherwise says nothing, and loads as its own. A
// count at or past the file's sequence, or a second one, is refused and changes nothing.
TEST_F(ShardStateTest, TheCompleteThroughCountLoadsBackAndABadOneIsRefused) {
  SmallShard saved;
  Train(saved);
  const std::string path = dir_ + "/ckpt.bin";
  CheckpointHeader h = HeaderOf(saved);
  {
    ASSERT_TRUE(WriteCheckpointFile(path, h, *saved.state().Save()).ok());
    SmallShard loaded;
    const Status st = Load(loaded, path);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_FALSE(loaded.state().complete_through().has_value());
  }
  saved.state().set_complete_through(0, 77);  // by process 77, which restored no checkpoint
  const std::vector<CheckpointBlock> good = *saved.state().Save();
  ASSERT_TRUE(std::any_of(good.begin(), good.end(), [](const CheckpointBlock& b) {
    return b.kind == static_cast<uint32_t>(CheckpointBlockKind::kCompleteThrough);
  }));
  ASSERT_TRUE(WriteCheckpointFile(path, h, good).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(loaded.state().complete_through(), std::optional<uint64_t>(0));
  EXPECT_EQ(loaded.state().complete_writer(), 77u);
  EXPECT_EQ(Contents(loaded), Contents(saved));
  auto complete = [](std::vector<CheckpointBlock>& b) -> CheckpointBlock& {
    return *std::find_if(b.begin(), b.end(), [](const CheckpointBlock& x) {
      return x.kind == static_cast<uint32_t>(CheckpointBlockKind::kCompleteThrough);
    });
  };
  const std::vector<BadBlocks> cases = {
      {"a count at the file's own sequence",
       [&](auto& b, auto&) {
         const uint64_t n = 1;
         std::memcpy(complete(b).bytes.data(), &n, 8);
       },
       "complete-through count 1 is not below the checkpoint's sequence 1"},
      {"a second count", [&](auto& b, auto&) { b.push_back(complete(b)); },
       "a second complete-through block"},
      {"a count of two", [&](auto& b, auto&) {
         CheckpointBlock& c = complete(b);
         c.count = 2;
         c.bytes.resize(32);
       },
       "a complete-through block of 2"},
      {"no process", [&](auto& b, auto&) {
         const uint64_t none = 0;
         std::memcpy(complete(b).bytes.data() + 8, &none, 8);
       },
       "a complete-through block that names no process"},
      {"a short block", [&](auto& b, auto&) { complete(b).bytes.resize(8); }, "complete-through"},
  };
  ExpectRefused(saved, good, cases);
}

TEST_F(ShardStateTest, PendingSumsOfTwoClocksLoadBackBitForBit) {
  SmallShard saved;
  Train(saved);
  TrainPending(saved, /*several=*/true);
  const auto sums = PendingBits(saved);
  // Per clock and table: 3 keys of worker 0, 2 of worker 1, at clock 4 3 of no one worker.
  // Dense: 'w' of workers 0 and 1 at clock 3; at clock 4 'w' of all three, 'b' of worker 1
  // and no one worker.
  ASSERT_EQ(sums.size(), 2u * (5u + 8u) + 2u + 5u);
  const std::string path = dir_ + "/ckpt.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, HeaderOf(saved), *saved.state().Save()).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(loaded.pending().size(), 2u);
  EXPECT_EQ(PendingBits(loaded), sums);  // each key with the engine that owns it
  EXPECT_EQ(Contents(loaded), Contents(saved));
  EXPECT_EQ(loaded.controller().clocks(), saved.controller().clocks());
  EXPECT_EQ(loaded.controller().DoneAt(2), 3);  // worker 2 had left at clock 3
  EXPECT_EQ(loaded.controller().DoneAt(1), -1);
}

// A shard in the middle of a change of the shard count (2 -> 1 at clock 10, not committed yet),
// its dense tables spanning the slices before and after it: each table's range comes back with
// its values, state and pending sums; a range outside the tensor, or one that does not serve
// what the file's membership says this shard serves, is refused.
TEST_F(ShardStateTest, ADenseRangeLoadsBackWithItsPendingSumsAndABadOneIsRefused) {
  SmallShard saved;
  Train(saved);
  ASSERT_TRUE(saved.membership().SetServers(10, 1).ok());
  saved.Reslice(2, SliceRange{0, 21});  // 'w', 21 elements: [0, 11) before, all after
  saved.Reslice(3, SliceRange{0, 5});   // 'b', 5 elements: [0, 3) before, all after
  TrainPending(saved, /*several=*/true);
  const auto sums = PendingBits(saved);
  const std::vector<CheckpointBlock> good = *saved.state().Save();
  int ranges = 0;
  for (const CheckpointBlock& b : good) ranges += b.kind == 12 ? 1 : 0;
  EXPECT_EQ(ranges, 2);
  const std::string path = dir_ + "/ckpt.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, HeaderOf(saved), good).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(loaded.dense(2).slice().begin, 0u);
  EXPECT_EQ(loaded.dense(2).slice().end, 21u);
  EXPECT_EQ(loaded.dense(3).slice().end, 5u);
  EXPECT_EQ(Contents(loaded), Contents(saved));
  EXPECT_EQ(PendingBits(loaded), sums);
  size_t w = 0;
  while (w < good.size() && !(good[w].kind == 12 && good[w].table == 2)) ++w;
  ASSERT_LT(w, good.size());
  const std::vector<BadBlocks> cases = {
      {"a range past the tensor's end",
       [w](auto& b, auto&) {
         const int64_t begin = 10;
         std::memcpy(b[w].bytes.data(), &begin, 8);
       },
       "table 'w': a dense range of 21 elements from 10 serving [0, 11) does not fit the "
       "tensor of 21"},
      {"elements served that the membership does not give the shard",
       [w](auto& b, auto&) {
         const int64_t live_end = 19;
         std::memcpy(b[w].bytes.data() + 16, &live_end, 8);
       },
       "table 'w' holds [0, 21) and serves [0, 19); by its membership this shard serves [0, 11)"},
      {"a range without its bounds",
       [w](auto& b, auto&) {
         b[w].count = 0;
         b[w].bytes.resize(8);
       },
       "a dense range of 8 bytes, too few for where it is"},
  };
  ExpectRefused(saved, good, cases);
}

// Each case changes the blocks of a good checkpoint (its checksums stay right: these are files
// a writer with a bug, or an attacker, could produce) and says what the refusal must name.
TEST_F(ShardStateTest, BlocksThatDisagreeWithTheManifestAreRefusedAndChangeNothing) {
  SmallShard trained;
  Train(trained);
  const std::vector<CheckpointBlock> good = *trained.state().Save();
  // emb, small, w, b, clocks, push record, done clocks, barrier, incarnations
  ASSERT_EQ(good.size(), 9u);
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
      {"a kind no shard writes", [](auto& b, auto&) { b[1].kind = 42; }, "unknown block kind 42"},
      // A table's rows may come in consecutive blocks (streamed), not split by another's.
      {"a second block of one table, after another's",
       [](auto& b, auto&) { b.insert(b.begin() + 2, b[0]); }, "a second block of table 'emb'"},
      {"a second slice of a dense table", [](auto& b, auto&) { b.insert(b.begin() + 3, b[2]); },
       "a second block of table 'w'"},
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
  ExpectRefused(trained, good, cases);
}

void SetPendingClock(CheckpointBlock& b, int64_t clock) {
  std::memcpy(b.bytes.data(), &clock, sizeof(clock));
}

void SetPendingWorker(CheckpointBlock& b, int64_t worker) {
  std::memcpy(b.bytes.data() + sizeof(int64_t), &worker, sizeof(worker));
}

// A checkpoint written before sums were kept per worker has kinds 5 and 6 (the clock, then
// the sums): they load as sums of no one worker, which a clock folds in first.
TEST_F(ShardStateTest, PendingSumsOfNoWorkerFromAnOlderCheckpointLoad) {
  SmallShard saved;
  Train(saved);
  TrainPending(saved);
  std::vector<CheckpointBlock> blocks = *saved.state().Save();
  int converted = 0;
  for (CheckpointBlock& b : blocks) {
    if (b.kind != 16 && b.kind != 17) continue;
    b.kind = b.kind == 16 ? 5 : 6;
    b.bytes.erase(b.bytes.begin() + sizeof(int64_t), b.bytes.begin() + 2 * sizeof(int64_t));
    ++converted;
  }
  ASSERT_EQ(converted, 7);
  const std::string path = dir_ + "/old.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, HeaderOf(saved), blocks).ok());
  SmallShard loaded;
  const Status st = Load(loaded, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto want = PendingBits(saved);
  decltype(want) as_no_worker;
  for (auto& [where, bits] : want) {
    auto [clock, worker, t, e, key] = where;
    ASSERT_EQ(worker, 0);
    as_no_worker[{clock, ClockAggregate::kNoWorker, t, e, key}] = bits;
  }
  EXPECT_EQ(PendingBits(loaded), as_no_worker);
}

TEST_F(ShardStateTest, DamagedPendingSumsAreRefusedAndChangeNothing) {
  SmallShard trained;
  Train(trained);
  TrainPending(trained);
  const std::vector<CheckpointBlock> good = *trained.state().Save();
  // 4 tables, clocks, push record; clock 3: emb, small, w; clock 4: emb, small, w, b; done, barrier,
  // incarnations.
  ASSERT_EQ(good.size(), 16u);
  ASSERT_EQ(good[6].kind, 16u);
  ASSERT_EQ(good[8].kind, 17u);
  const std::vector<BadBlocks> cases = {
      {"pending sparse sums for a dense table", [](auto& b, auto&) { b[6].table = 2; },
       "block 6 (kind 16, table 2, at byte"},
      {"pending sparse sums for a dense table (what)", [](auto& b, auto&) { b[6].table = 2; },
       "pending sums of sparse rows for dense table 'w'"},
      {"pending dense sums for a sparse table", [](auto& b, auto&) { b[8].table = 0; },
       "pending dense sums for sparse table 'emb'"},
      {"pending dense sums of the wrong slice",
       [](auto& b, auto&) {
         b[12].count += 1;
         b[12].bytes.resize(b[12].bytes.size() + sizeof(float));
       },
       "table 'b': pending sums of 4 elements; its block has 3"},
      {"pending dense sums beyond the tensor",
       [](auto& b, auto&) {
         b[12].count += 1000;
         b[12].bytes.resize(b[12].bytes.size() + 1000 * sizeof(float));
       },
       "table 'b': pending sums of a slice of 1003 elements"},
      {"a sparse count that does not match the bytes", [](auto& b, auto&) { b[6].count += 1; },
       "table 'emb' pending sums after the clock: 4 x 24 bytes do not make"},
      // 3 + 2^61 keys x 24 bytes wraps around to exactly the 72 bytes of 3 keys.
      {"a count whose product with the row size wraps",
       [](auto& b, auto&) { b[6].count = 3 + (uint64_t{1} << 61); },
       "table 'emb' pending sums after the clock: 2305843009213693955 x 24 bytes overflow"},
      {"no room for the clock",
       [](auto& b, auto&) {
         b[8].bytes.resize(4);
         b[8].count = 0;
       },
       "table 'w': pending sums of 4 bytes, too few for their clock"},
      {"pending sums before the clocks",
       [](auto& b, auto&) {
         b.insert(b.begin(), b[6]);
         b.erase(b.begin() + 7);
       },
       "block 0 (kind 16, table 0, at byte 64): pending sums before the worker clocks"},
      {"a clock every worker has passed", [](auto& b, auto&) { SetPendingClock(b[6], 2); },
       "pending sums of clock 2, out of range (the slowest worker is at clock 3)"},
      {"a clock out of range",
       [](auto& b, auto&) { SetPendingClock(b[12], kMaxCheckpointClock + 1); },
       "pending sums of clock 4611686018427387905, out of range"},
      {"a second block of one table for one clock",
       [](auto& b, auto&) { SetPendingClock(b[9], 3); },
       "a second block of pending sums of table 'emb' for clock 3"},
      {"a key twice",
       [](auto& b, auto&) { std::memcpy(b[7].bytes.data() + 16 + 12, b[7].bytes.data() + 16, 8); },
       "twice in the pending sums of table 'small' for clock 3"},
      {"a worker rank outside the manifest's",
       [](auto& b, auto&) { SetPendingWorker(b[7], 3); },
       "pending sums of table 'small' for clock 3 of worker 3; the manifest has 3 worker ranks"},
      {"a negative worker other than no one worker's",
       [](auto& b, auto&) { SetPendingWorker(b[7], -2); }, "of worker -2; the manifest has"},
      {"a second block of one table for one clock and worker",
       [](auto& b, auto&) { b.insert(b.begin() + 8, b[7]); },
       "a second block of pending sums of table 'small' for clock 3 of worker 0"},
      {"no room for the worker",
       [](auto& b, auto&) {
         b[8].bytes.resize(12);
         b[8].count = 0;
       },
       "table 'w': pending sums of 12 bytes, too few for their clock"},
  };
  ExpectRefused(trained, good, cases);
}

}  // namespace
}  // namespace parasol
