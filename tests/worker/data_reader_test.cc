#include "worker/data_reader.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <chrono>
#include <sstream>
#include <thread>

#include "tests/support/test_cluster.hpp"

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
