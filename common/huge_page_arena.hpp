// HugePageArena: memory for blocks that live as long as their owner (a table partition's rows
// and keys), taken from the kernel in 2 MiB-aligned chunks that it may back with transparent
// huge pages (madvise MADV_HUGEPAGE; with THP "madvise" or "always").
//
// Why: a shard that restores or fills 10^7 rows touches gigabytes of new memory, and with 4 KiB
// pages every 4 KiB is a page fault; on a virtual machine a fault costs microseconds (a restore
// of 10^7 rows x 16 spent 42% of its time in faults). A huge page faults in once per 2 MiB, and
// a fork (a background checkpoint) copies one page-table entry for it instead of 512.
//
// Blocks are never freed one by one: the arena gives all its chunks back when it goes. A chunk
// is one huge page (2 MiB), or as many as one block larger than that needs; what a block does
// not fill at a chunk's end stays unused (at most one block's size per chunk).
//
// Thread-safety: none; an arena belongs to its owner's thread (a partition's engine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parasol {

class HugePageArena {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageArena() = default;
  ~HugePageArena();
  HugePageArena(HugePageArena&& other) noexcept;
  HugePageArena& operator=(HugePageArena&& other) noexcept;
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  // `bytes` of uninitialised memory (zeroes, as the kernel gives it, unless reused), aligned
  // to 64 bytes, valid until the arena goes. Throws std::bad_alloc when the kernel refuses.
  void* Allocate(size_t bytes);
  // The bytes mapped, chunks' unused ends included.
  uint64_t mapped_bytes() const { return mapped_; }

 private:
  void Release();

  struct Chunk {
    void* base = nullptr;
    size_t size = 0;
  };
  std::vector<Chunk> chunks_;
  char* next_ = nullptr;  // the free end of the newest chunk
  size_t left_ = 0;
  uint64_t mapped_ = 0;
};

}  // namespace parasol
