#include "common/huge_page_arena.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <utility>

namespace parasol {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `size` bytes (a multiple of kHugePage) at a kHugePage boundary: mapped with a huge page to
// spare, and the unaligned ends given back.
void* MapAligned(size_t size) {
  const size_t align = HugePageArena::kHugePage;
  void* raw = ::mmap(nullptr, size + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, align);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = start + size + align;
  if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  void* base = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  (void)::madvise(base, size, MADV_HUGEPAGE);  // a hint: without THP, 4 KiB pages as before
#endif
  return base;
}

}  // namespace

void AdviseHugePages(void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (p == nullptr || bytes < 2 * HugePageArena::kHugePage) return;
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = RoundUp(start, HugePageArena::kHugePage);
  const uintptr_t last = (start + bytes) / HugePageArena::kHugePage * HugePageArena::kHugePage;
  if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

HugePageArena::~HugePageArena() { Release(); }

HugePageArena::HugePageArena(HugePageArena&& other) noexcept
    : chunks_(std::move(other.chunks_)),
      next_(std::exchange(other.next_, nullptr)),
      left_(std::exchange(other.left_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      closed_resident_(std::exchange(other.closed_resident_, 0)) {
  other.chunks_.clear();
}

HugePageArena& HugePageArena::operator=(HugePageArena&& other) noexcept {
  if (this != &other) {
    Release();
    chunks_ = std::move(other.chunks_);
    other.chunks_.clear();
    next_ = std::exchange(other.next_, nullptr);
    left_ = std::exchange(other.left_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    closed_resident_ = std::exchange(other.closed_resident_, 0);
  }
  return *this;
}

void HugePageArena::Release() {
  for (const Chunk& c : chunks_) ::munmap(c.base, c.size);
  chunks_.clear();
  next_ = nullptr;
  left_ = 0;
  mapped_ = 0;
  closed_resident_ = 0;
}

uint64_t HugePageArena::resident_bound() const {
  if (chunks_.empty()) return 0;
  const size_t used = chunks_.back().size - left_;
  return closed_resident_ + RoundUp(used, kHugePage);
}

void* HugePageArena::Allocate(size_t bytes) {
  bytes = RoundUp(bytes == 0 ? 1 : bytes, 64);
  if (bytes > left_) {
    constexpr size_t kMaxChunk = size_t{64} << 20;
    const size_t grown = std::min<size_t>(kMaxChunk, mapped_ / 8);
    const size_t size = RoundUp(std::max({bytes * 16, grown, kHugePage}), kHugePage);
    chunks_.reserve(chunks_.size() + 1);  // before the mapping: nothing to leak if it throws
    void* base = MapAligned(size);
    closed_resident_ = resident_bound();  // the newest chunk so far is closed now
    chunks_.push_back(Chunk{base, size});
    mapped_ += size;
    next_ = static_cast<char*>(base);
    left_ = size;
  }
  void* out = next_;
  next_ += bytes;
  left_ -= bytes;
  return out;
}

}  // namespace parasol
