#include "worker/data_reader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <fstream>
#include <chrono>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"
#include "worker/binary_data.hpp"

namespace parasol {
namespace {

// A real-looking row: empty I1 (start of the features), empty I12 and C19..C26 tail fields.
const char* kRow =
    "1\t\t-1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4"
    "\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6"
    "\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb"
    "\tc5c50484\te8b83407\t9727dd16";

TEST(CriteoParseTest, ParsesEveryFieldOfARealLookingRow) {
  Batch b;
  b.Clear();
  ASSERT_TRUE(ParseCriteoRow(kRow, true, &b).ok());
  ASSERT_EQ(b.size, 1u);
  EXPECT_EQ(b.labels[0], 1.0f);
  ASSERT_EQ(b.dense.size(), 13u);
  EXPECT_EQ(b.dense[0], 0.0f);                              // empty I1
  EXPECT_EQ(b.dense[1], 0.0f);                              // I2 = -1: log(1 + max(x, 0))
  EXPECT_FLOAT_EQ(b.dense[2], std::log1p(5.0f));
  EXPECT_EQ(b.dense[3], 0.0f);                              // I4 = 0
  EXPECT_FLOAT_EQ(b.dense[4], std::log1p(1382.0f));
  EXPECT_EQ(b.dense[11], 0.0f);                             // empty I12
  EXPECT_FLOAT_EQ(b.dense[12], std::log1p(2.0f));
  ASSERT_EQ(b.keys.size(), 26u);
  EXPECT_EQ(b.keys[0], CriteoKey(0, "68fd1e64"));
  EXPECT_EQ(b.keys[21], CriteoKey(21, ""));                 // empty C22: the missing key
  EXPECT_EQ(b.keys[25], CriteoKey(25, "9727dd16"));
  EXPECT_EQ(b.offsets, (std::vector<uint32_t>{0, 26}));
}

TEST(CriteoParseTest, KeysDependOnFieldAndValue) {
  EXPECT_NE(CriteoKey(0, "abc"), CriteoKey(1, "abc"));      // same value, other field
  EXPECT_NE(CriteoKey(3, ""), CriteoKey(4, ""));            // each field its own missing key
  EXPECT_NE(CriteoKey(3, ""), CriteoKey(3, "0"));
  EXPECT_EQ(CriteoKey(7, "dead"), CriteoKey(7, "dead"));
}

TEST(CriteoParseTest, EmptyFieldsAtTheEndOfTheLineAreKept) {
  std::string row = "0";
  for (int i = 0; i < 13; ++i) row += "\t1";
  for (int i = 0; i < 26; ++i) row += i < 20 ? "\tab" : "\t";
  Batch b;
  b.Clear();
  ASSERT_TRUE(ParseCriteoRow(row, true, &b).ok());
  EXPECT_EQ(b.keys[25], CriteoKey(25, ""));
}

TEST(CriteoParseTest, MalformedRowsSayWhy) {
  Batch b;
  b.Clear();
  Status st = ParseCriteoRow("1\t2\t3", true, &b);
  EXPECT_EQ(st.message(), "expected 40 tab-separated fields, found 3");
  std::string bad_int = kRow;
  bad_int.replace(bad_int.find("1382"), 4, "13x2");
  st = ParseCriteoRow(bad_int, true, &b);
  EXPECT_EQ(st.message(), "integer feature I5 is '13x2', not an integer");
  std::string bad_label = kRow;
  bad_label[0] = '7';
  EXPECT_EQ(ParseCriteoRow(bad_label, true, &b).message(), "label must be 0 or 1, found '7'");
  EXPECT_EQ(b.size, 0u);  // nothing was appended
  // The unlabeled test-file layout: 39 fields.
  EXPECT_TRUE(ParseCriteoRow(std::string(kRow).substr(2), false, &b).ok());
}

TEST(LibsvmParseTest, ParsesLabelsAndFeatures) {
  Batch b;
  b.Clear();
  ASSERT_TRUE(ParseLibsvmRow("+1 3:0.5 17:2", &b).ok());
  ASSERT_TRUE(ParseLibsvmRow("-1 4:1", &b).ok());
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0}));
  EXPECT_EQ(b.keys, (std::vector<uint64_t>{LibsvmKey(3), LibsvmKey(17), LibsvmKey(4)}));
  EXPECT_EQ(b.values, (std::vector<float>{0.5f, 2.0f, 1.0f}));
  EXPECT_EQ(b.offsets, (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_FALSE(ParseLibsvmRow("1 3-0.5", &b).ok());
  EXPECT_FALSE(ParseLibsvmRow("2 3:1", &b).ok());
}

TEST(CriteoParseTest, ASignAfterAPlusIsNotAnInteger) {
  std::string row = kRow;
  row.replace(row.find("1382"), 4, "+-13");
  Batch b;
  b.Clear();
  EXPECT_EQ(ParseCriteoRow(row, true, &b).message(),
            "integer feature I5 is '+-13', not an integer");
  row.replace(row.find("+-13"), 4, "+13");
  EXPECT_TRUE(ParseCriteoRow(row, true, &b).ok());
}

TEST(ReadRowTest, SplitsLinesAndKeepsEmptyOnes) {
  std::istringstream in("a\tb\n\nlast");
  std::string line;
  bool too_long = true;
  std::vector<std::string> lines;
  while (ReadRow(in, &line, &too_long)) {
    EXPECT_FALSE(too_long);
    lines.push_back(line);
  }
  EXPECT_EQ(lines, (std::vector<std::string>{"a\tb", "", "last"}));
}

TEST(ReadRowTest, ALineLongerThanTheLimitIsCutAndFlaggedAndTheNextOneIsWhole) {
  std::istringstream in(std::string(100, 'x') + "\nshort\n");
  std::string line;
  bool too_long = false;
  ASSERT_TRUE(ReadRow(in, &line, &too_long, 10));
  EXPECT_TRUE(too_long);
  EXPECT_EQ(line, std::string(10, 'x'));  // never more than the limit in memory
  ASSERT_TRUE(ReadRow(in, &line, &too_long, 10));
  EXPECT_FALSE(too_long);
  EXPECT_EQ(line, "short");
  EXPECT_FALSE(ReadRow(in, &line, &too_long, 10));
}

class BatchReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    std::ofstream out(dir_ + "/d.tsv");
    for (int i = 0; i < 10; ++i) {
      out << (i == 3 ? std::string("1\tnot-a-row") : std::string(kRow)) << "\n";
    }
  }
  void TearDown() override { testing::RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(BatchReaderTest, MalformedRowsAreCountedAndSkipped) {
  ReaderOptions o;
  o.files = {dir_ + "/d.tsv"};
  o.batch_size = 4;
  BatchReader r(o);
  uint32_t rows = 0, batches = 0;
  while (true) {
    auto b = r.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    rows += (*b)->size;
    ++batches;
  }
  EXPECT_EQ(rows, 9u);
  EXPECT_EQ(batches, 3u);  // 4 + 4 + 1
  EXPECT_EQ(r.bad_rows(), 1u);
  EXPECT_EQ(r.first_bad_row(),
            dir_ + "/d.tsv:4: expected 40 tab-separated fields, found 2");
}

TEST_F(BatchReaderTest, FailPolicyStopsWithFileAndLine) {
  ReaderOptions o;
  o.files = {dir_ + "/d.tsv"};
  o.batch_size = 2;
  o.on_bad_row = DataOptions::OnBadRow::kFail;
  BatchReader r(o);
  Status failure;
  for (int i = 0; i < 20 && failure.ok(); ++i) {
    auto b = r.Next();
    if (!b.ok()) failure = b.status();
    else if (!*b) break;
  }
  ASSERT_FALSE(failure.ok());
  EXPECT_NE(failure.message().find(dir_ + "/d.tsv:4: "), std::string::npos) << failure.message();
  EXPECT_NE(failure.message().find("on_bad_row: fail"), std::string::npos);
}

TEST_F(BatchReaderTest, WorkersShareTheRowsByLineModulo) {
  uint32_t total = 0;
  for (uint32_t rank = 0; rank < 3; ++rank) {
    ReaderOptions o;
    o.files = {dir_ + "/d.tsv"};
    o.rank = rank;
    o.workers = 3;
    o.epochs = 2;
    BatchReader r(o);
    while (true) {
      auto b = r.Next();
      ASSERT_TRUE(b.ok());
      if (!*b) break;
      total += (*b)->size;
    }
  }
  EXPECT_EQ(total, 18u);  // 9 good rows, 2 epochs, each row seen once per epoch
}

TEST_F(BatchReaderTest, ARowLongerThanTheLimitIsABadRowNotAnAllocation) {
  {
    std::ofstream out(dir_ + "/long.tsv");
    out << kRow << "\n" << std::string(kMaxRowBytes + 1, '7') << "\n" << kRow << "\n";
  }
  ReaderOptions o;
  o.files = {dir_ + "/long.tsv"};
  BatchReader r(o);
  uint32_t rows = 0;
  while (true) {
    auto b = r.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    rows += (*b)->size;
  }
  EXPECT_EQ(rows, 2u);
  EXPECT_EQ(r.bad_rows(), 1u);
  EXPECT_EQ(r.first_bad_row(), dir_ + "/long.tsv:2: row longer than " +
                                   std::to_string(kMaxRowBytes) + " bytes");
}

TEST_F(BatchReaderTest, AMissingFileIsAnError) {
  ReaderOptions o;
  o.files = {dir_ + "/none.tsv"};
  BatchReader r(o);
  auto b = r.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("none.tsv"), std::string::npos);
}

}  // namespace
}  // namespace parasol

namespace parasol {

namespace {

// Every batch a reader hands out: (step, micro-batch, the stream lines of its samples).
struct Taken {
  int64_t step;
  uint32_t micro;
  std::vector<uint64_t> positions;
  bool operator==(const Taken&) const = default;
};

std::vector<Taken> Drain(BatchReader& r, int64_t until_step = -1) {
  std::vector<Taken> out;
  while (true) {
    auto b = r.Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || !*b) break;
    out.push_back({(*b)->step, (*b)->micro, (*b)->positions});
    if (until_step >= 0 && (*b)->step >= until_step) break;
  }
  return out;
}

}  // namespace

// A membership change re-splits the data from the first step not taken: what the reader hands
// out then is what a reader started with the new membership would have handed out, and the
// steps before it stand. A reader started at a later step (a restarted or joining worker) reads
// that step's batches.
TEST_F(BatchReaderTest, RepositionReadsTheStepsAfterAChangeAsTheNewMembershipSplitsThem) {
  for (uint32_t per : {1u, 3u}) {
    SCOPED_TRACE("batches per step " + std::to_string(per));
    Membership before(2, 3);
    Membership after = before;
    ASSERT_TRUE(after.SetJoin(2, 9).ok());
    ASSERT_TRUE(after.SetLeave(0, 17).ok());
    ReaderOptions o;
    o.files = {dir_ + "/d.tsv", dir_ + "/d.tsv"};
    o.batch_size = 2;
    o.epochs = 40;
    o.rank = 0;
    o.batches_per_step = per;
    o.queue_batches = 4;
    o.membership = after;
    BatchReader fresh(o);
    const std::vector<Taken> want = Drain(fresh);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(want.back().step, 16);  // it leaves at 17
    o.membership = before;
    BatchReader r(o);
    std::vector<Taken> got = Drain(r, 5);  // read ahead past step 5 meanwhile
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r.Reposition(after, 6);
    for (Taken& t : Drain(r)) got.push_back(std::move(t));
    EXPECT_EQ(got, want);
    // Started at step 11: the same batches from there.
    o.membership = after;
    o.start_step = 11;
    BatchReader later(o);
    const std::vector<Taken> tail = Drain(later);
    std::vector<Taken> want_tail;
    for (const Taken& t : want) {
      if (t.step >= 11) want_tail.push_back(t);
    }
    EXPECT_EQ(tail, want_tail);
    o.start_step = 0;
  }
}

}  // namespace parasol

namespace parasol {
namespace {

// Everything a batch carries, to compare readers with different thread counts.
struct Whole {
  int64_t step;
  uint32_t micro;
  uint32_t size, bad_rows;
  std::string first_bad;
  std::vector<float> labels, dense, values;
  std::vector<uint64_t> keys, unique, positions;
  std::vector<uint32_t> offsets, indices;
  bool operator==(const Whole&) const = default;
};

// Reads to the end (or the first error), repositioning once at `reposition_step` to `after`.
struct Outcome {
  std::vector<Whole> batches;
  std::string error;
  uint64_t bad_rows = 0;
  std::string first_bad;
};

Outcome ReadWhole(ReaderOptions o, int64_t reposition_step, const Membership& after) {
  Outcome out;
  BatchReader r(o);
  bool repositioned = false;
  for (int guard = 0; guard < 100000; ++guard) {
    auto b = r.Next();
    if (!b.ok()) {
      out.error = b.status().ToString();
      break;
    }
    if (!*b) break;
    const Batch& x = **b;
    out.batches.push_back({x.step, x.micro, x.size, x.bad_rows, x.first_bad, x.labels, x.dense,
                           x.values,
                           x.keys, x.distinct.unique, x.positions, x.offsets,
                           x.distinct.indices});
    if (!repositioned && reposition_step >= 0 && x.step + 1 == reposition_step &&
        x.micro + 1 == std::max<uint32_t>(1, o.batches_per_step)) {
      r.Reposition(after, reposition_step);
      repositioned = true;
    }
  }
  out.bad_rows = r.bad_rows();
  out.first_bad = r.first_bad_row();
  return out;
}

}  // namespace

// With several parsing threads the reader hands out the same batches, in the same order, as
// with one: over files, epochs, micro-batches, malformed rows (skipped, or failing), a
// membership change mid-way (when skipping), a later start, and lists of text and binary
// files. The rows and the bad ones are drawn from a seed.
TEST_F(BatchReaderTest, ParsingThreadsHandOutTheSameBatchesAsOne) {
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(dir_ + "/t" + std::to_string(f) + ".tsv");
    std::ofstream out(files.back());
    const int rows = 200 + static_cast<int>(rng() % 300);
    for (int i = 0; i < rows; ++i) {
      if (rng() % 37 == 0 && (f > 0 || i > 150)) {  // some batches before the first
        out << "1\tbroken row " << i << "\n";
        continue;
      }
      out << (rng() % 2) << "\t" << (rng() % 100);
      for (int d = 1; d < 13; ++d) out << "\t" << (rng() % 1000);
      for (int c = 0; c < 26; ++c) out << "\t" << std::hex << (rng() % 5000) << std::dec;
      out << "\n";
    }
  }
  // The same list with its middle file as a binary copy (its malformed rows left out): text
  // rows and binary rows meet inside batches.
  std::vector<std::string> mixed = files;
  mixed[1] = dir_ + "/t1.bin";
  ASSERT_TRUE(ConvertCriteo(files[1], mixed[1], true, DataOptions::OnBadRow::kSkip).ok());
  Membership before(2, 3);
  Membership after = before;
  ASSERT_TRUE(after.SetJoin(2, 4).ok());
  for (const std::vector<std::string>& list : {files, mixed}) {
    SCOPED_TRACE(list[1]);
    for (auto policy : {DataOptions::OnBadRow::kSkip, DataOptions::OnBadRow::kFail}) {
      for (uint32_t per : {1u, 2u}) {
        for (int64_t start : {0, 3}) {
          SCOPED_TRACE("policy " + std::to_string(int(policy)) + ", batches per step " +
                       std::to_string(per) + ", start step " + std::to_string(start));
          ReaderOptions o;
          o.files = list;
          o.batch_size = 16 + static_cast<uint32_t>(rng() % 48);
          o.epochs = 2;
          o.rank = 1;
          o.membership = before;
          o.batches_per_step = per;
          o.start_step = start;
          o.on_bad_row = policy;
          o.deduplicate = true;
          o.queue_batches = 3;
          // Under on_bad_row: fail a malformed row ends the reader where it is found, in the
          // batches it reads ahead too, so a membership change after it could not undo it (with
          // any thread count): the failing runs read without one.
          const int64_t reposition = policy == DataOptions::OnBadRow::kSkip ? start + 2 : -1;
          o.reader_threads = 1;
          const Outcome want = ReadWhole(o, reposition, after);
          // (A failing run may stop before its first batch when it starts late.)
          if (policy == DataOptions::OnBadRow::kSkip || (start == 0 && per == 1)) {
            ASSERT_FALSE(want.batches.empty());
          }
          if (policy == DataOptions::OnBadRow::kFail) {
            EXPECT_NE(want.error.find("on_bad_row: fail"), std::string::npos) << want.error;
          } else {
            EXPECT_EQ(want.error, "");
            EXPECT_GT(want.bad_rows, 0u);
          }
          for (uint32_t threads : {2u, 3u, 8u}) {
            o.reader_threads = threads;
            const Outcome got = ReadWhole(o, reposition, after);
            EXPECT_EQ(got.batches.size(), want.batches.size()) << threads << " threads";
            EXPECT_TRUE(got.batches == want.batches) << threads << " threads";
            EXPECT_EQ(got.error, want.error) << threads << " threads";
            EXPECT_EQ(got.bad_rows, want.bad_rows) << threads << " threads";
            EXPECT_EQ(got.first_bad, want.first_bad) << threads << " threads";
          }
        }
      }
    }
  }
}

// The data's last rows, all malformed, end it in a batch of no rows: still counted and named.
TEST_F(BatchReaderTest, MalformedLastRowsAreCountedWithAnyThreadCount) {
  {
    std::ofstream out(dir_ + "/tail.tsv");
    for (int i = 0; i < 8; ++i) out << kRow << "\n";
    out << "1\tbad\n1\tbad too\n";
  }
  for (uint32_t threads : {1u, 3u}) {
    ReaderOptions o;
    o.files = {dir_ + "/tail.tsv"};
    o.batch_size = 4;
    o.reader_threads = threads;
    BatchReader r(o);
    uint32_t rows = 0;
    for (int i = 0; i < 10; ++i) {
      auto b = r.Next();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      if (!*b) break;
      rows += (*b)->size;
    }
    EXPECT_EQ(rows, 8u) << threads;
    EXPECT_EQ(r.bad_rows(), 2u) << threads;
    EXPECT_EQ(r.first_bad_row(), dir_ + "/tail.tsv:9: expected 40 tab-separated fields, found 2")
        << threads;
  }
}

// A reader with parsing threads that is dropped while they work stops them (no hang, no use of
// a freed batch: ASan and TSan builds see it), as does a reposition in the middle of a read.
TEST_F(BatchReaderTest, ParsingThreadsStopWithTheReader) {
  std::ofstream out(dir_ + "/big.tsv");
  for (int i = 0; i < 20000; ++i) out << kRow << "\n";
  out.close();
  for (int round = 0; round < 20; ++round) {
    ReaderOptions o;
    o.files = {dir_ + "/big.tsv"};
    o.batch_size = 64;
    o.epochs = 3;
    o.reader_threads = 4;
    o.deduplicate = true;
    BatchReader r(o);
    for (int i = 0; i < round; ++i) {
      auto b = r.Next();
      ASSERT_TRUE(b.ok() && *b) << i;
      EXPECT_EQ((*b)->size, 64u);
      EXPECT_EQ((*b)->step, i);
    }
    if (round % 2) r.Reposition(Membership(1, 1), round);
    if (round % 2) {
      auto b = r.Next();
      ASSERT_TRUE(b.ok() && *b);
      EXPECT_EQ((*b)->step, round);
    }
  }
}

}  // namespace parasol

namespace parasol {
namespace {

// A batch's distinct keys in the order first seen, and each key's place among them, as a map
// gives them: for every length around the lookahead of the index's prefetch, with one index
// reused across batches (cleared, or grown for a larger batch), keys repeated and not.
TEST(DeduplicateKeysTest, FirstSeenOrderAndPlacesMatchAMapForEveryLength) {
  std::mt19937_64 rng(testing::TestSeed());
  KeyIndex index(16);
  BatchKeys out;
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 40; ++n) lengths.push_back(n);
  for (size_t n : {1000u, 106496u, 17u, 5000u}) lengths.push_back(n);
  for (size_t n : lengths) {
    for (uint64_t spread : {uint64_t{3}, uint64_t{50}, ~uint64_t{0}}) {
      std::vector<uint64_t> keys(n);
      for (uint64_t& k : keys) k = spread == ~uint64_t{0} ? rng() : rng() % spread;
      DeduplicateKeys(keys, index, &out);
      std::unordered_map<uint64_t, uint32_t> place;
      std::vector<uint64_t> unique;
      ASSERT_EQ(out.indices.size(), n);
      for (size_t i = 0; i < n; ++i) {
        auto [it, inserted] = place.emplace(keys[i], static_cast<uint32_t>(unique.size()));
        if (inserted) unique.push_back(keys[i]);
        ASSERT_EQ(out.indices[i], it->second) << "n " << n << ", key " << i;
      }
      ASSERT_EQ(out.unique, unique) << "n " << n;
    }
  }
}

}  // namespace
}  // namespace parasol
