#include "server/checkpoint.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace parasol {
namespace {

// Offsets in a checkpoint file (server/checkpoint.hpp's layout).
constexpr size_t kVersionAt = 8, kHeaderChecksumAt = 56;
constexpr size_t kTableAt = 4, kBytesAt = 16, kBlockChecksumAt = 32;  // within a block header

class CheckpointReaderTest : public ::testing::Test {
 protected:
  // Shard 1 of 2 of manifest 77.
  static CheckpointHeader Header(uint64_t sequence) {
    CheckpointHeader h;
    h.shard = 1;
    h.shards = 2;
    h.fingerprint = 77;
    h.sequence = sequence;
    return h;
  }
  void SetUp() override {
    const CheckpointHeader h = Header(3);
    CheckpointBlock a;
    a.kind = 1;
    a.count = 3;
    a.bytes.assign(100, 'x');
    CheckpointBlock b;
    b.kind = 2;
    b.table = 1;
    b.count = 2;
    b.bytes.assign(60, 'y');
    char name[] = "/tmp/parasol-checkpoint-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
    ASSERT_TRUE(WriteCheckpointFile(dir_ + "/c.bin", h, {a, b}).ok());
    std::ifstream in(dir_ + "/c.bin", std::ios::binary);
    file_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Reads `bytes` as a checkpoint; counts the payloads read.
  Status Read(const std::string& bytes, int* payloads = nullptr) {
    std::istringstream in(bytes);
    CheckpointHeader h;
    return ReadCheckpoint(in, "c.bin", &h, [&](const CheckpointBlock&) {
      if (payloads) ++*payloads;
      return Status::Ok();
    });
  }

  static uint64_t Get64(const std::string& s, size_t at) {
    uint64_t v;
    std::memcpy(&v, s.data() + at, 8);
    return v;
  }
  static void Put64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

  // `f` (a whole, sound file) as format `version` writes it: every payload checksummed as that
  // version does, then the block headers, the footer and the header sealed again.
  static std::string AsVersion(std::string f, uint32_t version) {
    std::memcpy(f.data() + kVersionAt, &version, 4);
    const uint64_t blocks = Get64(f, 48);
    size_t pos = kCheckpointHeaderBytes;
    uint64_t all = 0;
    for (uint64_t i = 0; i < blocks; ++i) {
      const uint64_t bytes = Get64(f, pos + kBytesAt);
      const uint64_t payload = PayloadChecksum(f.data() + pos + kCheckpointBlockHeaderBytes,
                                               bytes, version);
      Put64(f, pos + 24, payload);
      Put64(f, pos + kBlockChecksumAt, Checksum64(f.data() + pos, 32, i));
      all = Checksum64(&payload, 8, all);
      pos += kCheckpointBlockHeaderBytes + bytes;
    }
    Put64(f, pos + 16, all);
    Put64(f, kHeaderChecksumAt, Checksum64(f.data(), kHeaderChecksumAt));
    return f;
  }

  std::string dir_;
  std::string file_;
};

TEST_F(CheckpointReaderTest, EveryBitFlipOfABlockHeaderIsRefusedBeforeItsPayloadIsRead) {
  ASSERT_TRUE(Read(file_).ok());
  const size_t second = kCheckpointHeaderBytes + kCheckpointBlockHeaderBytes + 100;
  for (size_t block : {kCheckpointHeaderBytes, second}) {
    for (size_t bit = 0; bit < kCheckpointBlockHeaderBytes * 8; ++bit) {
      std::string damaged = file_;
      damaged[block + bit / 8] ^= static_cast<char>(1 << (bit % 8));
      int payloads = 0;
      const Status st = Read(damaged, &payloads);
      ASSERT_FALSE(st.ok()) << "bit " << bit << " of the block at " << block;
      EXPECT_NE(st.message().find("checkpoint 'c.bin' is damaged"), std::string::npos);
      EXPECT_NE(st.message().find("header checksum (at byte " +
                                  std::to_string(block + kBlockChecksumAt) + ")"),
                std::string::npos)
          << st.message();
      EXPECT_EQ(payloads, block == second ? 1 : 0);
    }
  }
}

TEST_F(CheckpointReaderTest, AHugeBlockSizeIsRefusedNamingItsOffsetWithoutAllocating) {
  // A writer's bug or a forged file: the size is wrong but its header checksum is right.
  std::string forged = file_;
  const size_t block = kCheckpointHeaderBytes;
  Put64(forged, block + kBytesAt, uint64_t{1} << 50);
  Put64(forged, block + kBlockChecksumAt, Checksum64(forged.data() + block, 32, 0));
  const Status st = Read(forged);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("block 0 claims 1125899906842624 payload bytes; the file has " +
                              std::to_string(file_.size() - block - kCheckpointBlockHeaderBytes -
                                             kCheckpointBlockHeaderBytes - kCheckpointFooterBytes) +
                              " left for it (at byte " + std::to_string(block + kBytesAt) + ")"),
            std::string::npos)
      << st.message();
}

TEST_F(CheckpointReaderTest, ATableIdFlippedInABlockHeaderIsRefused) {
  std::string damaged = file_;
  damaged[kCheckpointHeaderBytes + kTableAt] ^= 1;
  const Status st = Read(damaged);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("block 0 header checksum"), std::string::npos) << st.message();
}

TEST_F(CheckpointReaderTest, AFileOfTheVersionBeforeDeltasReadsAsAFullOne) {
  EXPECT_TRUE(Read(AsVersion(file_, kOldestCheckpointVersion)).ok());
}

// Version 6 checksums payloads with XXH3; files of versions 4 and 5 (Checksum64) still read,
// and a payload checksummed the other version's way is refused as damaged.
TEST_F(CheckpointReaderTest, PayloadChecksumsFollowTheFilesVersion) {
  ASSERT_EQ(kCheckpointVersion, 6u);
  EXPECT_EQ(AsVersion(file_, 6), file_);  // what the writer wrote
  int payloads = 0;
  EXPECT_TRUE(Read(AsVersion(file_, 5), &payloads).ok());
  EXPECT_EQ(payloads, 2);
  const uint64_t block0 = kCheckpointHeaderBytes;
  EXPECT_NE(Get64(AsVersion(file_, 5), block0 + 24), Get64(file_, block0 + 24));
  for (uint32_t claimed : {5u, 6u}) {
    // The payload checksums of the other version, under this version's header.
    std::string mixed = AsVersion(file_, claimed == 5 ? 6 : 5);
    std::memcpy(mixed.data() + kVersionAt, &claimed, 4);
    Put64(mixed, kHeaderChecksumAt, Checksum64(mixed.data(), kHeaderChecksumAt));
    const Status st = Read(mixed);
    ASSERT_FALSE(st.ok()) << claimed;
    EXPECT_NE(st.message().find("block 0 payload checksum"), std::string::npos) << st.message();
  }
  // A payload of several pieces (read and summed 512 KiB at a time): read whole, and a byte
  // flipped in its third piece refused.
  CheckpointBlock big;
  big.kind = 1;
  big.count = 1;
  big.bytes.resize((3u << 19) + 12345);
  for (size_t i = 0; i < big.bytes.size(); ++i) big.bytes[i] = static_cast<char>(i * 131 + 7);
  ASSERT_TRUE(WriteCheckpointFile(dir_ + "/big.bin", Header(4), {big}).ok());
  std::ifstream in(dir_ + "/big.bin", std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream sound(whole);
  CheckpointHeader read_header;
  std::string got;
  ASSERT_TRUE(ReadCheckpoint(sound, "big.bin", &read_header, [&](const CheckpointBlock& b) {
                got.assign(b.bytes.begin(), b.bytes.end());
                return Status::Ok();
              }).ok());
  EXPECT_TRUE(got == std::string(big.bytes.begin(), big.bytes.end()));
  std::string flipped = whole;
  flipped[kCheckpointHeaderBytes + kCheckpointBlockHeaderBytes + (2u << 19) + 99] ^= 4;
  EXPECT_FALSE(Read(flipped).ok());
  // Every payload bit matters to XXH3 as it did to Checksum64.
  const size_t payload0 = kCheckpointHeaderBytes + kCheckpointBlockHeaderBytes;
  for (size_t bit = 0; bit < 100 * 8; ++bit) {
    std::string damaged = file_;
    damaged[payload0 + bit / 8] ^= static_cast<char>(1 << (bit % 8));
    ASSERT_FALSE(Read(damaged).ok()) << bit;
  }
}

TEST_F(CheckpointReaderTest, AFileOfTheOldVersionIsRefusedNamingItsVersion) {
  std::string old = file_;
  const uint32_t version = kOldestCheckpointVersion - 1;
  std::memcpy(old.data() + kVersionAt, &version, 4);
  Put64(old, kHeaderChecksumAt, Checksum64(old.data(), kHeaderChecksumAt));
  const Status st = Read(old);
  EXPECT_EQ(st.code(), StatusCode::kVersionMismatch);
  EXPECT_NE(st.message().find("checkpoint 'c.bin' is format version " + std::to_string(version) +
                              "; this build reads versions " +
                              std::to_string(kOldestCheckpointVersion) + " to " +
                              std::to_string(kCheckpointVersion)),
            std::string::npos)
      << st.message();
}

TEST_F(CheckpointReaderTest, MoreBlocksThanTheFileCanHoldAreRefused) {
  std::string forged = file_;
  Put64(forged, 48, uint64_t{1} << 60);
  Put64(forged, kHeaderChecksumAt, Checksum64(forged.data(), kHeaderChecksumAt));
  const Status st = Read(forged);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("more than the file has room for (at byte 48)"), std::string::npos)
      << st.message();
}

TEST_F(CheckpointReaderTest, BytesAfterTheFooterAreRefused) {
  const Status st = Read(file_ + "z");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(
      st.message().find("1 bytes after the footer (at byte " + std::to_string(file_.size()) + ")"),
      std::string::npos)
      << st.message();
}

TEST_F(CheckpointReaderTest, ARefusalOfTheCheckNamesTheBlockAndStopsBeforeThePayload) {
  std::istringstream in(file_);
  CheckpointHeader h;
  int payloads = 0;
  const Status st = ReadCheckpoint(
      in, "c.bin", &h,
      [&](const CheckpointBlock&) {
        ++payloads;
        return Status::Ok();
      },
      [](const CheckpointBlockHeader& b) {
        return b.table == 1 ? InvalidArgument("no table 1 here") : Status::Ok();
      });
  EXPECT_EQ(payloads, 1);
  EXPECT_EQ(st.message(),
            "checkpoint 'c.bin' block 1 (kind 2, table 1, at byte " +
                std::to_string(kCheckpointHeaderBytes + kCheckpointBlockHeaderBytes + 100) +
                "): no table 1 here");
}


constexpr size_t kSequenceAt = 40;

TEST_F(CheckpointReaderTest, ASequenceBeyondTenDigitsIsRefusedInTheHeader) {
  std::string wrapped = file_;
  Put64(wrapped, kSequenceAt, UINT64_MAX);
  Put64(wrapped, kHeaderChecksumAt, Checksum64(wrapped.data(), kHeaderChecksumAt));
  const Status st = Read(wrapped);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("checkpoint 'c.bin' is damaged: checkpoint 'c.bin' has sequence "
                              "18446744073709551615, beyond the largest a checkpoint may have "
                              "(9999999999: 10 digits in its file name) (at byte 40)"),
            std::string::npos)
      << st.message();
  {
    std::ofstream out(dir_ + "/wrapped.bin", std::ios::binary);
    out << wrapped;
  }
  Result<CheckpointHeader> h = ReadCheckpointHeader(dir_ + "/wrapped.bin");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("wrapped.bin' has sequence 18446744073709551615"),
            std::string::npos)
      << h.status().message();
  // The largest sequence itself is a checkpoint's.
  Put64(wrapped, kSequenceAt, kMaxCheckpointSequence);
  Put64(wrapped, kHeaderChecksumAt, Checksum64(wrapped.data(), kHeaderChecksumAt));
  EXPECT_TRUE(Read(wrapped).ok());
}

TEST_F(CheckpointReaderTest, ASequenceBeyondTheLargestIsNotWritten) {
  CheckpointHeader h;
  h.sequence = kMaxCheckpointSequence + 1;
  const std::string path = CheckpointPath(dir_, 0, h.sequence);
  const Status st = WriteCheckpointFile(path, h, std::vector<CheckpointBlock>{});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("has sequence 10000000000, beyond the largest"), std::string::npos)
      << st.message();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(CheckpointNameTest, AFileNameBeyondTheLargestSequenceIsRefusedNamingIt) {
  EXPECT_EQ(*CheckpointSequenceOfName("/d/shard-0/ckpt-0000000042.bin"), 42u);
  EXPECT_EQ(*CheckpointSequenceOfName("ckpt-9999999999.bin"), kMaxCheckpointSequence);
  Result<uint64_t> wrapped = CheckpointSequenceOfName("/d/shard-0/ckpt-18446744073709551615.bin");
  ASSERT_FALSE(wrapped.ok());
  EXPECT_EQ(wrapped.status().message(),
            "checkpoint file '/d/shard-0/ckpt-18446744073709551615.bin' names a sequence of 20 "
            "digits, beyond the largest a checkpoint may have (9999999999)");
  EXPECT_FALSE(CheckpointSequenceOfName("/d/ckpt-12x.bin").ok());
  EXPECT_FALSE(CheckpointSequenceOfName("/d/ckpt-.bin").ok());
}

}  // namespace
}  // namespace parasol
