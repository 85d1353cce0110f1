// HugePageArena: blocks aligned, apart, writable and kept until the arena goes; chunks hold many
// blocks of any size; what counts as resident is what was handed out; a moved arena keeps its
// blocks; a reservation in huge pages is empty, with room, and keeps what is added to it.
#include "common/huge_page_arena.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace parasol {
namespace {

TEST(HugePageArenaTest, BlocksAreAlignedApartAndKeepWhatWasWritten) {
  HugePageArena arena;
  std::vector<std::pair<char*, size_t>> blocks;
  // Sizes of a partition's row and key blocks, enough of them to need several chunks.
  for (int i = 0; i < 40; ++i) {
    const size_t bytes = i % 2 ? 4096 * 8 : 4096 * 18 * 4 + 3;
    char* p = static_cast<char*>(arena.Allocate(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::memset(p, i + 1, bytes);
    blocks.emplace_back(p, bytes);
  }
  EXPECT_GE(arena.mapped_bytes(), 2 * HugePageArena::kHugePage);
  EXPECT_EQ(arena.mapped_bytes() % HugePageArena::kHugePage, 0u);
  // No block overlaps another, and each still holds its own bytes.
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      const bool apart = blocks[i].first + blocks[i].second <= blocks[j].first ||
                         blocks[j].first + blocks[j].second <= blocks[i].first;
      EXPECT_TRUE(apart) << i << " and " << j;
    }
    for (size_t b = 0; b < blocks[i].second; b += 997) {
      ASSERT_EQ(blocks[i].first[b], static_cast<char>(i + 1)) << "block " << i << " byte " << b;
    }
  }
}

TEST(HugePageArenaTest, ChunksHoldManyBlocksOfAnySizeAndOnlyWhatIsHandedOutCounts) {
  // A block just over a huge page (a row block of 129 words): a chunk per block would leave
  // half of each chunk unused.
  HugePageArena arena;
  const size_t big = 4096 * 129 * sizeof(float);
  std::vector<char*> blocks;
  for (int i = 0; i < 16; ++i) {
    char* p = static_cast<char*>(arena.Allocate(big));
    p[0] = static_cast<char>(i);
    p[big - 1] = static_cast<char>(i);
    blocks.push_back(p);
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(blocks[0]) % HugePageArena::kHugePage, 0u);
  // One chunk for all 16, less than a huge page of it unused.
  EXPECT_EQ(arena.mapped_bytes() % HugePageArena::kHugePage, 0u);
  EXPECT_LT(arena.mapped_bytes(), 16 * big + HugePageArena::kHugePage);
  for (int i = 1; i < 16; ++i) EXPECT_EQ(blocks[i], blocks[i - 1] + big);
  EXPECT_GE(arena.resident_bound(), 16 * big);
  EXPECT_LT(arena.resident_bound(), 16 * big + HugePageArena::kHugePage);
  // Small blocks: the first chunk is two huge pages at most, and what counts is what was
  // handed out, rounded up to a huge page.
  HugePageArena keys;
  keys.Allocate(4096 * sizeof(uint64_t));
  EXPECT_LE(keys.mapped_bytes(), 2 * HugePageArena::kHugePage);
  EXPECT_EQ(keys.resident_bound(), HugePageArena::kHugePage);
  // A growing arena takes larger chunks, up to 64 MiB: few mappings for many blocks.
  HugePageArena many;
  for (int i = 0; i < 2000; ++i) many.Allocate(4096 * 18 * sizeof(float));
  const uint64_t used = 2000ull * 4096 * 18 * sizeof(float);
  EXPECT_GE(many.mapped_bytes(), used);
  EXPECT_LT(many.resident_bound(), used + 64 * HugePageArena::kHugePage);
}

TEST(HugePageArenaTest, AMovedArenaKeepsItsBlocks) {
  HugePageArena a;
  auto* p = static_cast<uint64_t*>(a.Allocate(1024 * sizeof(uint64_t)));
  for (uint64_t i = 0; i < 1024; ++i) p[i] = i * 7;
  HugePageArena b(std::move(a));
  EXPECT_EQ(a.mapped_bytes(), 0u);
  EXPECT_EQ(b.mapped_bytes(), HugePageArena::kHugePage);
  HugePageArena c;
  c = std::move(b);
  for (uint64_t i = 0; i < 1024; ++i) ASSERT_EQ(p[i], i * 7);
  EXPECT_EQ(c.mapped_bytes(), HugePageArena::kHugePage);
}

TEST(HugePageArenaTest, AReservationInHugePagesIsEmptyWithRoomAndKeepsWhatIsAddedAfter) {
  std::vector<uint64_t> v = {1, 2, 3};
  // Large enough to be advised (8 MiB): emptied, with room for all of it.
  ReserveInHugePages(v, 1 << 20);
  EXPECT_TRUE(v.empty());
  EXPECT_GE(v.capacity(), size_t{1} << 20);
  const uint64_t* data = v.data();
  for (uint64_t i = 0; i < (1u << 20); ++i) v.push_back(i * 7);
  EXPECT_EQ(v.data(), data);  // no reallocation while it filled
  for (uint64_t i = 0; i < (1u << 20); i += 4099) ASSERT_EQ(v[i], i * 7);
  // Room enough already: only emptied, the same memory kept.
  ReserveInHugePages(v, 1000);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.data(), data);
  // Small ones and ranges shorter than two huge pages are left as they are.
  std::vector<char> small;
  ReserveInHugePages(small, 100);
  EXPECT_GE(small.capacity(), 100u);
  AdviseHugePages(nullptr, 1 << 30);
  AdviseHugePages(small.data(), small.capacity());
}

}  // namespace
}  // namespace parasol
