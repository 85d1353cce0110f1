// The `parasol` program's global operator new and delete: malloc and free, as the defaults,
// with each thread's allocations counted, so that a worker can report how many objects its
// training thread allocates a step once it runs (TrainReport::allocations_per_step). Only
// this program replaces them: libraries that link Parasol keep their own. Under a sanitizer,
// which brings its own, nothing is replaced or counted.
#include <cstdlib>
#include <new>

#include "cli/commands.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PARASOL_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define PARASOL_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef PARASOL_COUNT_ALLOCATIONS
#define PARASOL_COUNT_ALLOCATIONS 1
#endif

namespace parasol::cli {

#if PARASOL_COUNT_ALLOCATIONS

namespace {

thread_local uint64_t t_allocations = 0;

// As the default operator new: malloc, calling the new-handler until it succeeds or there is
// none (then nullptr).
void* Allocate(std::size_t n) {
  ++t_allocations;
  if (n == 0) n = 1;
  while (true) {
    if (void* p = std::malloc(n)) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) return nullptr;
    handler();
  }
}

}  // namespace

bool AllocationsCounted() { return true; }
uint64_t ThreadAllocations() { return t_allocations; }

}  // namespace parasol::cli

void* operator new(std::size_t n) {
  if (void* p = parasol::cli::Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = parasol::cli::Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return parasol::cli::Allocate(n);
  } catch (...) {  // a new-handler may throw
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return operator new(n, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

#else  // a sanitizer's allocator: not replaced

bool AllocationsCounted() { return false; }
uint64_t ThreadAllocations() { return 0; }

}  // namespace parasol::cli

#endif
