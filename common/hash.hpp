// Small, fast, well-mixed 64-bit hashes used for sharding, engine ownership, deterministic
// initialisation and manifest fingerprints. All are pure functions: the same input gives the
// same output on every host and in every process.
#pragma once

#include <cstdint>
#include <string_view>

namespace parasol {

// The 64-bit finaliser of MurmurHash3: a bijection with full avalanche.
constexpr uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// SplitMix64 step: maps a counter to a well-distributed 64-bit value.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of `key` under `salt`; distinct salts give independent-looking hashes.
constexpr uint64_t HashKey(uint64_t key, uint64_t salt) { return Fmix64(key ^ SplitMix64(salt)); }

// Maps a 64-bit hash uniformly onto [0, n) without a division (Lemire's multiply-shift).
constexpr uint32_t ReduceRange(uint64_t hash, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(hash) * n) >> 64);
}

// FNV-1a over bytes, then Fmix64; for strings (field values, manifest fingerprints).
constexpr uint64_t HashBytes(std::string_view bytes, uint64_t seed = 0) {
  uint64_t h = 0xcbf29ce484222325ULL ^ seed;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return Fmix64(h);
}

}  // namespace parasol
