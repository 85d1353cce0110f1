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
// holds at least 16 blocks of the size asked for (so that rounding it up to whole huge pages
// wastes little, whatever the block size) and grows with the arena, to an eighth of what it
// holds so far, capped at 64 MiB: a shard of 100 GiB of rows maps a few thousand chunks, well
// within the kernel's count of mappings (vm.max_map_count). Only what is handed out is touched,
// so at most the huge page under a chunk's free end is resident beyond it (resident_bound()).
// An arena serves blocks of one size best (a partition's rows and keys use one each).
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
  // The bytes mapped, chunks' untouched ends included.
  uint64_t mapped_bytes() const { return mapped_; }
  // At most what is resident: each chunk's bytes handed out, rounded up to whole huge pages.
  uint64_t resident_bound() const;

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
  uint64_t closed_resident_ = 0;  // resident_bound() of the chunks before the newest
};

// Asks the kernel to back the whole 2 MiB-aligned pages inside [p, p + bytes) with huge pages
// when they are first touched (a hint, as above; ranges under 4 MiB are left alone). For large
// buffers of a restore that are filled right after (blocks read from a file, an index's
// arrays): their 4 KiB faults cost as much as the restore's own work on a virtual machine.
void AdviseHugePages(void* p, size_t bytes);

// Empties `v` and reserves room for `n` elements, advised as above: the elements are then added
// (resize, assign, push_back) with huge pages under what was not touched yet. Large
// reservations usually come straight from the kernel (glibc maps them), untouched. When the
// memory cannot be had, `v` is left as it was (std::bad_alloc).
template <typename Vector>
void ReserveInHugePages(Vector& v, size_t n) {
  if (v.capacity() >= n) {
    v.clear();
    return;
  }
  Vector fresh;
  fresh.reserve(n);
  AdviseHugePages(fresh.data(), n * sizeof(typename Vector::value_type));
  v.swap(fresh);
}

}  // namespace parasol
