// The `parasol` program's global operator new: the default's allocation (malloc), counted per
// thread, so that a worker can report how often its training thread allocates once it runs
// (TrainReport::allocations_per_step). Only this program replaces it: libraries that link
// Parasol keep their own. The default operator delete (free) matches it.
#include <cstdlib>
#include <new>

#include "cli/commands.hpp"

namespace {

thread_local uint64_t t_allocations = 0;

void* Allocate(std::size_t n) {
  ++t_allocations;
  return std::malloc(n == 0 ? 1 : n);
}

}  // namespace

namespace parasol::cli {

uint64_t ThreadAllocations() { return t_allocations; }

}  // namespace parasol::cli

void* operator new(std::size_t n) {
  if (void* p = Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n); }
