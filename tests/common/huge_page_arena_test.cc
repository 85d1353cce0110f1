// HugePageArena: blocks aligned, apart, writable and kept until the arena goes; a block larger
// than a huge page gets a chunk of its own; a moved arena keeps its blocks.
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

TEST(HugePageArenaTest, ABlockLargerThanAHugePageGetsAChunkOfItsOwn) {
  HugePageArena arena;
  const size_t big = HugePageArena::kHugePage * 2 + 100;
  char* p = static_cast<char*>(arena.Allocate(big));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % HugePageArena::kHugePage, 0u);
  EXPECT_EQ(arena.mapped_bytes(), 3 * HugePageArena::kHugePage);
  p[0] = 1;
  p[big - 1] = 2;
  // What is left of that chunk serves the next small block.
  char* q = static_cast<char*>(arena.Allocate(64));
  EXPECT_GE(q, p + big);
  EXPECT_EQ(arena.mapped_bytes(), 3 * HugePageArena::kHugePage);
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

}  // namespace
}  // namespace parasol
