#include "common/membership_macs.hpp"

#include <sodium.h>
#include <zmq.h>

#include <cstring>

#include "common/curve_keys.hpp"

namespace parasol {
namespace {

Result<std::array<uint8_t, 32>> Binary(const std::string& z85, const std::string& what) {
  std::array<uint8_t, 32> out{};
  if (z85.size() != 40 || zmq_z85_decode(out.data(), z85.c_str()) == nullptr) {
    return InvalidArgument(what + ": not a 40-character Z85 key");
  }
  return out;
}

}  // namespace

Result<MembershipMacs> MembershipMacs::ForShard(const SecurityOptions& security, uint32_t rank,
                                                uint32_t shards, uint64_t fingerprint) {
  MembershipMacs m;
  if (!security.curve || security.worker_keys.empty()) return m;
  if (rank >= shards || security.server_keys.size() != shards) {
    return InvalidArgument("membership MACs: shard " + std::to_string(rank) + " of " +
                           std::to_string(security.server_keys.size()) + " server keys");
  }
  if (sodium_init() < 0) return Internal("libsodium cannot start");
  PARASOL_ASSIGN_OR_RETURN(CurveKeyPair mine, ReadCurveKeyPair(security.server_keys[rank]));
  PARASOL_ASSIGN_OR_RETURN(auto secret, Binary(mine.secret_key, security.server_keys[rank]));
  m.rank_ = rank;
  m.shards_ = shards;
  m.fingerprint_ = fingerprint;
  // Shard 0 with every shard (itself included); shard k with shard 0.
  for (uint32_t other = 0; other < shards; ++other) {
    if (rank != 0 && other != 0) continue;
    PARASOL_ASSIGN_OR_RETURN(std::string pub, ReadCurvePublicKey(security.server_keys[other]));
    PARASOL_ASSIGN_OR_RETURN(auto public_key, Binary(pub, security.server_keys[other]));
    std::array<uint8_t, 32> shared{};
    if (crypto_box_beforenm(shared.data(), public_key.data(), secret.data()) != 0) {
      return InvalidArgument("membership MACs: the key of server " + std::to_string(other) +
                             " is not a valid public key");
    }
    m.keys_.push_back(shared);
  }
  sodium_memzero(secret.data(), secret.size());
  return m;
}

std::array<uint8_t, MembershipMacs::kMacBytes> MembershipMacs::Mac(
    uint32_t shard, const std::array<uint8_t, 32>& key, const MemberEntry& e) const {
  uint8_t message[8 + 4 + 4 + 8 + 8];
  std::memcpy(message, &fingerprint_, 8);
  std::memcpy(message + 8, &shard, 4);
  std::memcpy(message + 12, &e.worker, 4);
  std::memcpy(message + 16, &e.join, 8);
  std::memcpy(message + 24, &e.leave, 8);
  uint8_t full[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256(full, message, sizeof(message), key.data());
  std::array<uint8_t, kMacBytes> mac{};
  std::memcpy(mac.data(), full, kMacBytes);
  return mac;
}

std::vector<uint8_t> MembershipMacs::Sign(std::span<const MemberEntry> entries) const {
  if (!enabled() || rank_ != 0) return {};
  std::vector<uint8_t> out;
  out.reserve(entries.size() * shards_ * kMacBytes);
  for (const MemberEntry& e : entries) {
    for (uint32_t k = 0; k < shards_; ++k) {
      const auto mac = Mac(k, keys_[k], e);
      out.insert(out.end(), mac.begin(), mac.end());
    }
  }
  return out;
}

bool MembershipMacs::Verify(const MemberEntry& entry, size_t index,
                            std::span<const uint8_t> macs) const {
  if (!enabled()) return true;
  const size_t at = (index * shards_ + rank_) * kMacBytes;
  if (macs.size() % (static_cast<size_t>(shards_) * kMacBytes) != 0 ||
      at + kMacBytes > macs.size()) {
    return false;
  }
  const auto expected = Mac(rank_, keys_.front(), entry);  // shard 0: its own key, with itself
  return sodium_memcmp(expected.data(), macs.data() + at, kMacBytes) == 0;
}

}  // namespace parasol
