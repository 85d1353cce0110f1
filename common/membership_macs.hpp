// MembershipMacs: shard 0 signs the membership clocks it names, so that the other shards take a
// join, a leave or a change of the shard count that a worker relays only when shard 0 named it.
//
// Workers carry the membership from shard to shard (common/membership.hpp); with
// security.worker_keys a worker's key may act only as that worker, yet what it relays is about
// every worker. So each entry carries, per shard k, a MAC that only shard 0 and shard k can
// make: HMAC-SHA-256 (truncated to 16 bytes) under the key both derive from their CURVE keys
// (X25519 of shard 0's secret key and shard k's public key, and the other way round), over the
// job's fingerprint, k and the entry. Shard 0 holds one such key per shard (its own with
// itself, for its restarts), shard k one. Workers hold none: they carry the MACs as given.
// Thread-safety: immutable once built.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/manifest.hpp"
#include "common/membership.hpp"
#include "common/status.hpp"

namespace parasol {

class MembershipMacs {
 public:
  static constexpr size_t kMacBytes = 16;

  // Off: signs and checks nothing.
  MembershipMacs() = default;
  // Shard `rank` of the `shards` listed, with security.curve and worker keys: its keys, from
  // its own key pair and the others' public keys (security.server_keys). Off otherwise.
  static Result<MembershipMacs> ForShard(const SecurityOptions& security, uint32_t rank,
                                         uint32_t shards, uint64_t fingerprint);

  bool enabled() const { return !keys_.empty(); }
  // Shard 0: the MACs of `entries` for every shard, entry by entry (entries x shards x 16
  // bytes). Empty when off or not shard 0.
  std::vector<uint8_t> Sign(std::span<const MemberEntry> entries) const;
  // Whether `macs` (as carried with a list of entries) holds shard 0's MAC of entry `index`,
  // `entry`, for this shard.
  bool Verify(const MemberEntry& entry, size_t index, std::span<const uint8_t> macs) const;

 private:
  std::array<uint8_t, kMacBytes> Mac(uint32_t shard, const std::array<uint8_t, 32>& key,
                                     const MemberEntry& e) const;

  uint32_t rank_ = 0;
  uint32_t shards_ = 0;
  uint64_t fingerprint_ = 0;
  // Shard 0: one per shard (by rank); shard k: one, shared with shard 0.
  std::vector<std::array<uint8_t, 32>> keys_;
};

}  // namespace parasol
