#include "worker/binary_data.hpp"

#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/test_cluster.hpp"
#include "worker/data_generator.hpp"
#include "worker/data_reader.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;

class BinaryDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    text_ = dir_ + "/train.tsv";
    bin_ = dir_ + "/train.bin";
    GeneratorOptions g;
    g.rows = 5000;
    ASSERT_TRUE(GenerateCriteo(text_, g).ok());
  }
  void TearDown() override { RemoveTree(dir_); }

  // Every batch of `file` as the reader hands them out.
  static Result<std::vector<Batch>> ReadBatches(const std::string& file, uint32_t rank = 0,
                                                uint32_t workers = 1, uint32_t epochs = 1) {
    ReaderOptions o;
    o.files = {file};
    o.batch_size = 256;
    o.rank = rank;
    o.workers = workers;
    o.epochs = epochs;
    BatchReader reader(o);
    std::vector<Batch> out;
    while (true) {
      PARASOL_ASSIGN_OR_RETURN(std::optional<Batch> b, reader.Next());
      if (!b) break;
      out.push_back(std::move(*b));
    }
    return out;
  }

  static void ExpectSameBatches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].size, b[i].size) << "batch " << i;
      EXPECT_EQ(a[i].labels, b[i].labels) << "batch " << i;
      EXPECT_EQ(a[i].dense, b[i].dense) << "batch " << i;
      EXPECT_EQ(a[i].keys, b[i].keys) << "batch " << i;
      EXPECT_EQ(a[i].values, b[i].values) << "batch " << i;
      EXPECT_EQ(a[i].offsets, b[i].offsets) << "batch " << i;
      EXPECT_EQ(a[i].positions, b[i].positions) << "batch " << i;
      EXPECT_EQ(a[i].step, b[i].step) << "batch " << i;
    }
  }

  // Changes byte `at` of `path` (counted from its end when negative), or cuts the file there.
  static void Damage(const std::string& path, int64_t at, bool cut) {
    std::string bytes = ReadFile(path);
    const size_t i = at >= 0 ? static_cast<size_t>(at) : bytes.size() + at;
    if (cut) {
      bytes.resize(i);
    } else {
      bytes[i] = static_cast<char>(bytes[i] ^ 0x40);
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string dir_, text_, bin_;
};

TEST_F(BinaryDataTest, AWorkerReadsTheSameBatchesFromBinaryAsFromText) {
  // Blocks of 1,000 rows: five full ones, so a row's block and place in it both vary.
  Result<ConvertReport> r = ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail, 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rows, 5000u);
  EXPECT_EQ(r->bad_rows, 0u);
  ASSERT_TRUE(BinaryData::IsBinary(bin_));
  EXPECT_FALSE(BinaryData::IsBinary(text_));
  auto text = ReadBatches(text_);
  auto bin = ReadBatches(bin_);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  ASSERT_TRUE(bin.ok()) << bin.status().ToString();
  ASSERT_EQ(text->size(), 20u);  // 5,000 rows at 256: 19 full batches and one of 136
  ExpectSameBatches(*text, *bin);
  // Each of two workers its share, over two epochs, and a last block that is short.
  ASSERT_TRUE(ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail, 777).ok());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto t = ReadBatches(text_, rank, 2, 2);
    auto b = ReadBatches(bin_, rank, 2, 2);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_GT(t->size(), 10u);
    ExpectSameBatches(*t, *b);
  }
}

TEST_F(BinaryDataTest, EvaluationUnlabeledFilesAndMixedListsReadAsTheirText) {
  ASSERT_TRUE(ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail, 1000).ok());
  // Evaluation reads a whole file (ReadAll).
  uint64_t bad_text = 1, bad_bin = 1;
  auto t = ReadAll(DataOptions::Format::kCriteo, text_, 512, true, &bad_text);
  auto b = ReadAll(DataOptions::Format::kCriteo, bin_, 512, true, &bad_bin);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(bad_text, 0u);
  EXPECT_EQ(bad_bin, 0u);
  ExpectSameBatches(*t, *b);
  // A file without labels (Criteo's test layout, 39 fields), written with --no-label.
  const std::string unlabeled = dir_ + "/test.tsv", unlabeled_bin = dir_ + "/test.bin";
  {
    std::ifstream in(text_);
    std::ofstream out(unlabeled);
    std::string line;
    while (std::getline(in, line)) out << line.substr(line.find('\t') + 1) << "\n";
  }
  ASSERT_TRUE(
      ConvertCriteo(unlabeled, unlabeled_bin, false, DataOptions::OnBadRow::kFail, 999).ok());
  auto ut = ReadAll(DataOptions::Format::kCriteo, unlabeled, 512, false, nullptr);
  auto ub = ReadAll(DataOptions::Format::kCriteo, unlabeled_bin, 512, false, nullptr);
  ASSERT_TRUE(ut.ok()) << ut.status().ToString();
  ASSERT_TRUE(ub.ok()) << ub.status().ToString();
  ASSERT_EQ(ut->size(), 10u);
  ExpectSameBatches(*ut, *ub);
  // data.train as a list of text and binary files, over two epochs.
  ReaderOptions mixed;
  mixed.files = {text_, bin_, text_};
  mixed.batch_size = 300;
  mixed.epochs = 2;
  ReaderOptions all_text = mixed;
  all_text.files = {text_, text_, text_};
  for (ReaderOptions* o : {&mixed, &all_text}) o->rank = 1, o->workers = 3;
  BatchReader a(mixed), c(all_text);
  std::vector<Batch> from_mixed, from_text;
  for (auto [reader, out] : {std::pair{&a, &from_mixed}, std::pair{&c, &from_text}}) {
    while (true) {
      auto next = reader->Next();
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      if (!*next) break;
      out->push_back(std::move(**next));
    }
  }
  ASSERT_GT(from_text.size(), 30u);
  ExpectSameBatches(from_text, from_mixed);
}

TEST_F(BinaryDataTest, ValuesTheTextReaderCannotMakeAreRefused) {
  ASSERT_TRUE(ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail, 1000).ok());
  const std::string good = ReadFile(bin_);
  // Row 1001's label (block 1, its second row) and a dense feature of row 2000, each written
  // with the block's checksum made again: only the values' check can refuse them.
  auto rewrite = [&](uint64_t block, uint64_t offset_in_block, float value) {
    std::string bytes = good;
    const uint64_t start = 64 + block * BinaryBlockBytes(1000);
    std::memcpy(&bytes[start + offset_in_block], &value, sizeof(value));
    const uint64_t sum = XXH3_64bits(bytes.data() + start, 1000 * 264);
    std::memcpy(&bytes[start + 1000 * 264], &sum, sizeof(sum));
    std::ofstream(bin_, std::ios::binary | std::ios::trunc) << bytes;
    auto b = ReadBatches(bin_);
    return b.ok() ? std::string() : b.status().message();
  };
  std::string e = rewrite(1, 1 * sizeof(float), 0.5f);
  EXPECT_NE(e.find("block 1 (rows 1000 to 1999): row 1001 has label 0.5"), std::string::npos)
      << e;
  e = rewrite(2, 1000 * sizeof(float) + 3 * sizeof(float), std::nanf(""));
  EXPECT_NE(e.find("block 2 (rows 2000 to 2999): row 2000 has dense feature I4 = nan"),
            std::string::npos)
      << e;
  e = rewrite(2, 1000 * sizeof(float), -1.0f);
  EXPECT_NE(e.find("row 2000 has dense feature I1 = -1"), std::string::npos) << e;
  // A binary file whose magic was damaged is not read as text.
  std::string bytes = good;
  bytes[0] = 'X';
  std::ofstream(bin_, std::ios::binary | std::ios::trunc) << bytes;
  auto b = ReadBatches(bin_);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("neither text nor binary data"), std::string::npos)
      << b.status().ToString();
  EXPECT_NE(b.status().message().find(bin_), std::string::npos);
}

TEST_F(BinaryDataTest, MalformedRowsAreLeftOutAndCountedOrEndTheConversion) {
  {
    std::ofstream out(text_, std::ios::app);
    out << "1\tnot a row\n";
  }
  Result<ConvertReport> skipped =
      ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kSkip, 1000);
  ASSERT_TRUE(skipped.ok()) << skipped.status().ToString();
  EXPECT_EQ(skipped->rows, 5000u);
  EXPECT_EQ(skipped->bad_rows, 1u);
  EXPECT_EQ(skipped->first_bad,
            text_ + ":5001: expected 40 tab-separated fields, found 2");
  RemoveTree(bin_);
  Result<ConvertReport> failed =
      ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail, 1000);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find(text_ + ":5001"), std::string::npos)
      << failed.status().ToString();
  // Nothing is left behind: neither the file nor its partial copy.
  EXPECT_FALSE(std::ifstream(bin_).good());
  EXPECT_FALSE(std::ifstream(bin_ + ".partial").good());
}

TEST_F(BinaryDataTest, ADamagedFileIsRefusedNamingTheFileAndTheBlock) {
  ASSERT_TRUE(ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail, 1000).ok());
  const std::string good = ReadFile(bin_);
  auto error_of = [&](int64_t at, bool cut) {
    std::ofstream(bin_, std::ios::binary | std::ios::trunc) << good;
    Damage(bin_, at, cut);
    auto b = ReadBatches(bin_);
    return b.ok() ? std::string() : b.status().message();
  };
  // A changed byte in block 3 (the header is 64 bytes, a block of 1,000 rows 264,008).
  const int64_t block3 = 64 + 3 * int64_t{264008};
  std::string e = error_of(block3 + 5000, false);
  EXPECT_NE(e.find(bin_), std::string::npos) << e;
  EXPECT_NE(e.find("block 3 (rows 3000 to 3999) fails its checksum"), std::string::npos) << e;
  // A changed byte in a block's checksum.
  e = error_of(-1, false);
  EXPECT_NE(e.find("block 4"), std::string::npos) << e;
  // A file cut short, and one with bytes after its last block.
  e = error_of(-100, true);
  EXPECT_NE(e.find("cut short"), std::string::npos) << e;
  EXPECT_NE(e.find(bin_), std::string::npos) << e;
  {
    std::ofstream(bin_, std::ios::binary | std::ios::trunc) << good << "\n";
    auto b = ReadBatches(bin_);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("bytes where its header's 5000 rows make"),
              std::string::npos)
        << b.status().ToString();
  }
  // A changed header byte (its row count), and a file shorter than a header.
  e = error_of(17, false);
  EXPECT_NE(e.find("header fails its checksum"), std::string::npos) << e;
  e = error_of(20, true);
  EXPECT_NE(e.find("shorter (20 bytes) than its 64-byte header"), std::string::npos) << e;
  // The same file read undamaged is whole again.
  std::ofstream(bin_, std::ios::binary | std::ios::trunc) << good;
  EXPECT_TRUE(ReadBatches(bin_).ok());
}

TEST_F(BinaryDataTest, AFileWithoutLabelsIsNotReadAsOneWithThem) {
  ASSERT_TRUE(ConvertCriteo(text_, bin_, true, DataOptions::OnBadRow::kFail).ok());
  ReaderOptions o;
  o.files = {bin_};
  o.has_label = false;
  BatchReader reader(o);
  auto b = reader.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("binary data with labels"), std::string::npos)
      << b.status().ToString();
  o.has_label = true;
  o.format = DataOptions::Format::kLibsvm;
  BatchReader libsvm(o);
  auto l = libsvm.Next();
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("data.format is libsvm"), std::string::npos)
      << l.status().ToString();
  // A folder is no text file, and a text file is not overwritten by its own copy.
  auto folder = ConvertCriteo(dir_, dir_ + "/x.bin", true, DataOptions::OnBadRow::kFail);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find("not a regular file"), std::string::npos)
      << folder.status().ToString();
  auto itself = ConvertCriteo(text_, text_, true, DataOptions::OnBadRow::kFail);
  ASSERT_FALSE(itself.ok());
  EXPECT_NE(itself.status().message().find("is the text file itself"), std::string::npos);
  // Converting a binary file again is refused.
  auto again = ConvertCriteo(bin_, dir_ + "/again.bin", true, DataOptions::OnBadRow::kFail);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("binary data already"), std::string::npos);
}

}  // namespace
}  // namespace parasol
