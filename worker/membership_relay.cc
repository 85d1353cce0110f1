#include "worker/membership_relay.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

namespace parasol {

MembershipRelay::MembershipRelay(Membership initial, uint32_t shards, uint32_t worker)
    : membership_(std::move(initial)), worker_(worker), shard_version_(shards, 0) {}

void MembershipRelay::Note(uint32_t shard, const Header& reply) {
  if (shard < shard_version_.size()) shard_version_[shard] = reply.membership_version;
  if (reply.members.empty()) return;
  // Shard 0's MACs, kept with their entries to travel with them.
  const size_t per_entry = reply.member_macs.size() / reply.members.size();
  if (shard == 0 && per_entry > 0 && per_entry * reply.members.size() == reply.member_macs.size()) {
    shard_zero_signs_ = true;
    for (size_t i = 0; i < reply.members.size(); ++i) {
      const MemberEntry& e = reply.members[i];
      macs_[{e.worker, e.join, e.leave}].assign(reply.member_macs.begin() + i * per_entry,
                                                reply.member_macs.begin() + (i + 1) * per_entry);
    }
  }
  const uint64_t before = membership_.version();
  if (Status st = membership_.Merge(reply.members); !st.ok()) {
    if (failure_.ok()) {
      failure_ = st.WithContext("worker " + std::to_string(worker_) + ": shard " +
                                std::to_string(shard) +
                                " sent a membership that contradicts this worker's");
      spdlog::error("{}", failure_.ToString());
    }
    return;
  }
  if (membership_.version() != before) {
    spdlog::info("worker {}: membership now names {} clock(s) (from shard {})", worker_,
                 membership_.version(), shard);
  }
}

void MembershipRelay::Stamp(uint32_t shard, bool carries, bool job_rank, Header& header) const {
  const uint64_t known = shard < shard_version_.size() ? shard_version_[shard] : 0;
  // A request to join carries every entry: the shard may have restarted since it said what it
  // knew, and admits the joiner only from the entry naming it (parasol_sim --elastic --seed
  // 898: a restarted shard refused a restarted joiner's Hello that carried none).
  if ((carries && known < membership_.version()) || (header.join && !membership_.Entries().empty())) {
    header.members = membership_.Entries();
    header.membership_version = membership_.version();
    header.member_macs = MacsOf(header.members);
  }
  // An entry learned from another shard comes without shard 0's MACs: a tick to shard 0 says it
  // knows none, so that shard 0 answers with every entry and its MACs.
  if (shard_zero_signs_ && shard == 0 && job_rank &&
      (header.op == Op::Clock || header.op == Op::Hello) && !AllSigned(membership_.Entries())) {
    header.membership_version = 0;
  }
}

std::vector<uint8_t> MembershipRelay::MacsOf(const std::vector<MemberEntry>& entries) const {
  if (macs_.empty()) return {};
  const size_t per_entry = macs_.begin()->second.size();
  std::vector<uint8_t> out(entries.size() * per_entry, 0);
  size_t held = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto it = macs_.find({entries[i].worker, entries[i].join, entries[i].leave});
    if (it == macs_.end() || it->second.size() != per_entry) continue;
    std::copy(it->second.begin(), it->second.end(), out.begin() + i * per_entry);
    ++held;
  }
  if (held == 0) return {};  // none held: none sent
  return out;                 // zeros where one is missing (the shard leaves that entry out)
}

bool MembershipRelay::AllSigned(const std::vector<MemberEntry>& entries) const {
  return std::all_of(entries.begin(), entries.end(), [&](const MemberEntry& e) {
    return macs_.count({e.worker, e.join, e.leave}) > 0;
  });
}

}  // namespace parasol
