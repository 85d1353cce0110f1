#include "server/push_record.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace parasol {
namespace {

using V = PushRecord::Verdict;

TEST(PushRecordTest, APushIsAppliedOnlyAfterItIsMarked) {
  PushRecord r;
  EXPECT_EQ(r.Check(1, 5, 0), V::kNew);
  ASSERT_TRUE(r.Mark(1, 5, 0).ok());
  EXPECT_EQ(r.Check(1, 5, 0), V::kApplied);
  EXPECT_EQ(r.Check(1, 5, 1), V::kNew);
  EXPECT_EQ(r.Check(1, 6, 0), V::kNew);  // another clock
  EXPECT_EQ(r.Check(2, 5, 0), V::kNew);  // another worker
}

TEST(PushRecordTest, OutOfOrderIndexesAreTrackedOneByOneAndCompacted) {
  PushRecord r;
  ASSERT_TRUE(r.Mark(0, 3, 2).ok());
  ASSERT_TRUE(r.Mark(0, 3, 0).ok());
  EXPECT_EQ(r.Check(0, 3, 0), V::kApplied);
  EXPECT_EQ(r.Check(0, 3, 1), V::kNew);
  EXPECT_EQ(r.Check(0, 3, 2), V::kApplied);
  ASSERT_TRUE(r.Mark(0, 3, 1).ok());
  EXPECT_EQ(r.Entries(), 1u);  // 0..2 is one prefix now
  EXPECT_EQ(r.Check(0, 3, 3), V::kNew);
}

TEST(PushRecordTest, ARecomputedStepIsRecognised) {
  // A worker that restarts at clock 7 sends push 0 of clock 7 again: the same identity.
  PushRecord r;
  for (int64_t c = 0; c <= 7; ++c) {
    ASSERT_TRUE(r.Mark(4, c, 0).ok());
    if (c < 7) { ASSERT_TRUE(r.Mark(4, c, 1).ok()); }
  }
  EXPECT_EQ(r.Check(4, 7, 0), V::kApplied);
  EXPECT_EQ(r.Check(4, 7, 1), V::kNew);
}

TEST(PushRecordTest, ClocksOlderThanTheWindowAreRefusedNeverAppliedTwice) {
  PushRecord r(/*window_clocks=*/4);
  for (int64_t c = 0; c < 10; ++c) ASSERT_TRUE(r.Mark(0, c, 0).ok());
  EXPECT_EQ(r.Floor(0), 6);
  EXPECT_EQ(r.Check(0, 5, 0), V::kTooOld);
  EXPECT_EQ(r.Check(0, 5, 1), V::kTooOld);  // never seen, still cannot be told apart
  EXPECT_EQ(r.Check(0, 6, 0), V::kApplied);
  const Status st = r.Mark(0, 5, 1);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("older than the push record"), std::string::npos) << st.ToString();
  EXPECT_LE(r.Entries(), 4u);
}

TEST(PushRecordTest, OutOfOrderEntriesAreBounded) {
  PushRecord r(/*window_clocks=*/4, /*max_out_of_order=*/3);
  ASSERT_TRUE(r.Mark(0, 1, 10).ok());
  ASSERT_TRUE(r.Mark(0, 1, 20).ok());
  ASSERT_TRUE(r.Mark(0, 1, 30).ok());
  EXPECT_EQ(r.Mark(0, 1, 40).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(r.Check(0, 1, 40), V::kNew);  // refused, so not recorded
  EXPECT_TRUE(r.Mark(0, 1, 0).ok());      // the prefix may always grow
  EXPECT_TRUE(r.Mark(0, 1, 20).ok());     // a resend of a recorded one is fine
  EXPECT_FALSE(r.Mark(0, -1, 0).ok());
}

TEST(PushRecordTest, SaveAndLoadRoundTripAndRefuseDamage) {
  PushRecord r(8, 16);
  ASSERT_TRUE(r.Mark(0, 1, 0).ok());
  ASSERT_TRUE(r.Mark(0, 1, 5).ok());
  ASSERT_TRUE(r.Mark(3, 9, 2).ok());
  for (int64_t c = 0; c < 20; ++c) ASSERT_TRUE(r.Mark(7, c, 0).ok());
  const std::vector<char> bytes = r.Save();
  PushRecord back(8, 16);
  ASSERT_TRUE(back.Load(bytes));
  EXPECT_EQ(back.Save(), bytes);
  EXPECT_EQ(back.Check(0, 1, 5), V::kApplied);
  EXPECT_EQ(back.Check(0, 1, 4), V::kNew);
  EXPECT_EQ(back.Check(7, 11, 0), V::kTooOld);

  PushRecord other_window(9, 16);
  EXPECT_FALSE(other_window.Load(bytes));
  for (size_t cut = 0; cut < bytes.size(); cut += 8) {
    PushRecord t(8, 16);
    EXPECT_FALSE(t.Load(std::vector<char>(bytes.begin(), bytes.begin() + cut))) << cut;
  }
  // Each word flipped to all ones: refused or loaded, never a crash; a refusal changes nothing.
  for (size_t w = 0; w < bytes.size() / 8; ++w) {
    std::vector<char> bad = bytes;
    for (int k = 0; k < 8; ++k) bad[w * 8 + k] = static_cast<char>(0xff);
    PushRecord t(8, 16);
    ASSERT_TRUE(t.Mark(1, 0, 0).ok());
    if (!t.Load(bad)) { EXPECT_EQ(t.Check(1, 0, 0), V::kApplied); }
  }
}

TEST(PushRecordTest, AResendWithAnotherPayloadIsAConflictAndSurvivesSaveAndLoad) {
  PushRecord r(8, 16);
  ASSERT_TRUE(r.Mark(2, 4, 0, 0xabc).ok());
  ASSERT_TRUE(r.Mark(2, 4, 1).ok());  // recorded without a checksum
  EXPECT_EQ(r.Check(2, 4, 0, 0xabc), V::kApplied);  // a true duplicate
  EXPECT_EQ(r.Check(2, 4, 0, 0xabd), V::kConflict);
  EXPECT_EQ(r.Check(2, 4, 0), V::kApplied);          // not checked
  EXPECT_EQ(r.Check(2, 4, 1, 0x123), V::kApplied);   // nothing to compare with
  EXPECT_EQ(r.Check(2, 4, 2, 0x123), V::kNew);
  // Another process of the worker recomputed the step (ssp, asp: from rows that changed).
  ASSERT_TRUE(r.Mark(2, 4, 3, 0x555, /*incarnation=*/9).ok());
  EXPECT_EQ(r.Check(2, 4, 3, 0x556, 9), V::kConflict);
  EXPECT_EQ(r.Check(2, 4, 3, 0x556, 10), V::kApplied);
  PushRecord back(8, 16);
  ASSERT_TRUE(back.Load(r.Save()));
  EXPECT_EQ(back.Check(2, 4, 0, 0xabd), V::kConflict);
  EXPECT_EQ(back.Check(2, 4, 0, 0xabc), V::kApplied);
  EXPECT_EQ(back.Check(2, 4, 3, 0x556, 9), V::kConflict);
  // Clocks leaving the window take their checksums with them.
  for (int64_t c = 5; c < 20; ++c) ASSERT_TRUE(r.Mark(2, c, 0, 7).ok());
  EXPECT_EQ(r.Check(2, 4, 0, 0xabd), V::kTooOld);
  EXPECT_LE(r.Save().size(), 8u * (4 + 3 + 8 * 3 + 1 + 8 * 4));  // 8 clocks, 8 checksums
}

TEST(PushRecordTest, AnEarlierBuildsChecksumsAreDroppedAndItsPushesKept) {
  // Records written before push checksums became XXH3 ("PSRECRD2") hold Checksum64 sums: a
  // shard restored from one keeps what was applied and checks no payload against them (its
  // own sum of the same resend differs, which would refuse it as a conflict).
  PushRecord r(8, 16);
  ASSERT_TRUE(r.Mark(2, 4, 0, 0xabc, /*incarnation=*/9).ok());
  ASSERT_TRUE(r.Mark(2, 4, 1, 0xdef, 9).ok());
  std::vector<char> bytes = r.Save();
  ASSERT_GE(bytes.size(), 8u);
  EXPECT_EQ(bytes[0], '3');  // the magic's low byte: "PSRECRD3", little-endian
  PushRecord now(8, 16);
  ASSERT_TRUE(now.Load(bytes));
  EXPECT_EQ(now.Check(2, 4, 0, 0xabd, 9), V::kConflict);  // this build's sums are compared
  bytes[0] = '2';
  PushRecord earlier(8, 16);
  ASSERT_TRUE(earlier.Load(bytes));
  EXPECT_EQ(earlier.Check(2, 4, 0, 0xabd, 9), V::kApplied);
  EXPECT_EQ(earlier.Check(2, 4, 1, 0x123, 9), V::kApplied);
  EXPECT_EQ(earlier.Check(2, 4, 2, 0x123, 9), V::kNew);
  // Saved again, it is a record of this build's format with no sums.
  const std::vector<char> again = earlier.Save();
  EXPECT_EQ(again[0], '3');
  EXPECT_LT(again.size(), bytes.size());
  bytes[0] = '4';
  PushRecord unknown(8, 16);
  EXPECT_FALSE(unknown.Load(bytes));

  // The earlier format's checksum entries are still checked before they are dropped: the
  // record ends with their count and two entries of (clock, index, sum, incarnation).
  bytes[0] = '2';
  auto word = [](std::vector<char>& b, size_t w, uint64_t v) {
    std::memcpy(b.data() + w * 8, &v, 8);
  };
  const size_t words = bytes.size() / 8;
  ASSERT_EQ(bytes.size() % 8, 0u);
  const size_t first = words - 8;  // the first entry's clock
  struct Damage {
    const char* what;
    size_t at;
    uint64_t value;
  };
  const Damage damages[] = {
      {"a sum of 0", first + 2, 0},
      {"entries out of order", first + 5, 0},  // the second entry's index below the first's
      {"more entries than a record holds", first - 1, PushRecord::kMaxChecksums + 1},
      {"a clock past any", first + 4, uint64_t{1} << 63},
      {"more entries than the bytes hold", first - 1, 3},
  };
  for (const Damage& d : damages) {
    std::vector<char> bad = bytes;
    word(bad, d.at, d.value);
    PushRecord t(8, 16);
    ASSERT_TRUE(t.Mark(1, 0, 0).ok());
    EXPECT_FALSE(t.Load(bad)) << d.what;
    EXPECT_EQ(t.Check(1, 0, 0), V::kApplied) << d.what;  // a refusal changes nothing
  }
  std::vector<char> cut(bytes.begin(), bytes.end() - 8);
  PushRecord t(8, 16);
  EXPECT_FALSE(t.Load(cut));
}

TEST(PushRecordTest, ChecksumsPerWorkerAreBounded) {
  PushRecord r(4, 1 << 20);
  const uint64_t n = PushRecord::kMaxChecksums + 100;
  for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(r.Mark(0, 1, i, i + 1).ok());
  EXPECT_EQ(r.Check(0, 1, 0, 999999), V::kApplied);      // its checksum was dropped
  EXPECT_EQ(r.Check(0, 1, n - 1, 999999), V::kConflict);  // the newest are kept
  const std::vector<char> bytes = r.Save();
  EXPECT_LE(bytes.size(), 8u * (4 + 3 + 3 + 1 + 4 * PushRecord::kMaxChecksums));
  PushRecord back(4, 1 << 20);
  EXPECT_TRUE(back.Load(bytes));
}

}  // namespace
}  // namespace parasol
