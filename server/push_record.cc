#include "server/push_record.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

namespace parasol {
namespace {
constexpr uint64_t kRecordMagic = 0x5053524543524431ull;  // "PSRECRD1"
// The same, followed by each worker's checksums of applied payloads: Checksum64 sums, which
// a shard no longer computes (their entries are read and dropped), ...
constexpr uint64_t kRecordMagicWithChecksums = 0x5053524543524432ull;  // "PSRECRD2"
// ... and XXH3 sums (ShardServer::PushChecksum), written since.
constexpr uint64_t kRecordMagicWithXxh3 = 0x5053524543524433ull;  // "PSRECRD3"
constexpr uint64_t kMaxClock = uint64_t{1} << 62;  // clocks are >= 0 and far below this
}  // namespace

PushRecord::PushRecord(uint32_t window_clocks, uint32_t max_out_of_order)
    : window_clocks_(std::max<uint32_t>(2, window_clocks)),
      max_out_of_order_(std::max<uint32_t>(1, max_out_of_order)) {}

PushRecord::Verdict PushRecord::Check(uint32_t worker, int64_t clock, uint64_t index,
                                      uint64_t checksum, uint64_t incarnation) const {
  auto w = workers_.find(worker);
  if (w == workers_.end()) return Verdict::kNew;
  if (clock < w->second.floor) return Verdict::kTooOld;
  auto c = w->second.clocks.find(clock);
  if (c == w->second.clocks.end()) return Verdict::kNew;
  if (index < c->second.next || c->second.beyond.count(index)) {
    if (checksum != 0) {
      auto s = w->second.checksums.find({clock, index});
      if (s != w->second.checksums.end() && s->second.first != checksum &&
          s->second.second == incarnation) {
        return Verdict::kConflict;
      }
    }
    return Verdict::kApplied;
  }
  return Verdict::kNew;
}

int64_t PushRecord::Floor(uint32_t worker) const {
  auto w = workers_.find(worker);
  return w == workers_.end() ? 0 : w->second.floor;
}

Status PushRecord::CanMark(uint32_t worker, int64_t clock, uint64_t index) const {
  if (clock < 0 || clock > static_cast<int64_t>(kMaxClock)) {
    return InvalidArgument("push of clock " + std::to_string(clock) + ": clocks are >= 0");
  }
  auto w = workers_.find(worker);
  if (w == workers_.end()) return Status::Ok();
  if (clock < w->second.floor) {
    return FailedPrecondition("push " + std::to_string(index) + " of clock " +
                              std::to_string(clock) + " of worker " + std::to_string(worker) +
                              " is older than the push record (it keeps clocks from " +
                              std::to_string(w->second.floor) +
                              "); it may have been applied already, so it is refused");
  }
  auto c = w->second.clocks.find(clock);
  if (c == w->second.clocks.end()) return Status::Ok();
  const ClockEntry& e = c->second;
  if (index > e.next && !e.beyond.count(index) && e.beyond.size() >= max_out_of_order_) {
    return ResourceExhausted("worker " + std::to_string(worker) + " has " +
                             std::to_string(e.beyond.size()) + " pushes of clock " +
                             std::to_string(clock) + " past push " + std::to_string(e.next) +
                             ", which has not arrived; push " + std::to_string(index) +
                             " is refused");
  }
  return Status::Ok();
}

Status PushRecord::Mark(uint32_t worker, int64_t clock, uint64_t index, uint64_t checksum,
                        uint64_t incarnation) {
  PARASOL_RETURN_IF_ERROR(CanMark(worker, clock, index));
  WorkerRecord& w = workers_[worker];
  if (checksum != 0) {
    w.checksums[{clock, index}] = {checksum, incarnation};
    if (w.checksums.size() > kMaxChecksums) w.checksums.erase(w.checksums.begin());
  }
  ClockEntry& e = w.clocks[clock];
  if (index == e.next) {
    ++e.next;
    while (!e.beyond.empty() && *e.beyond.begin() == e.next) {
      e.beyond.erase(e.beyond.begin());
      ++e.next;
    }
  } else if (index > e.next) {
    e.beyond.insert(index);
  }
  // Keep the newest window_clocks clocks. Clocks are checked against the worker's own clock
  // before a push is recorded, so the newest clock is real.
  const int64_t floor = w.clocks.rbegin()->first - int64_t{window_clocks_} + 1;
  if (floor > w.floor) {
    w.floor = floor;
    w.clocks.erase(w.clocks.begin(), w.clocks.lower_bound(floor));
    w.checksums.erase(w.checksums.begin(),
                      w.checksums.lower_bound({floor, uint64_t{0}}));
  }
  return Status::Ok();
}

uint64_t PushRecord::Entries() const {
  uint64_t n = 0;
  for (const auto& [worker, w] : workers_) {
    for (const auto& [clock, e] : w.clocks) n += 1 + e.beyond.size();
  }
  return n;
}


std::vector<char> PushRecord::Save() const {
  std::vector<char> out;
  auto put = [&](uint64_t v) {
    const size_t at = out.size();
    out.resize(at + 8);
    std::memcpy(out.data() + at, &v, 8);
  };
  put(kRecordMagicWithXxh3);
  put(window_clocks_);
  put(max_out_of_order_);
  // Workers in id order, so equal records give equal bytes.
  std::vector<uint32_t> ids;
  for (const auto& [worker, w] : workers_) ids.push_back(worker);
  std::sort(ids.begin(), ids.end());
  put(ids.size());
  for (uint32_t id : ids) {
    const WorkerRecord& w = workers_.at(id);
    put(id);
    put(static_cast<uint64_t>(w.floor));
    put(w.clocks.size());
    for (const auto& [clock, e] : w.clocks) {
      put(static_cast<uint64_t>(clock));
      put(e.next);
      put(e.beyond.size());
      for (uint64_t i : e.beyond) put(i);
    }
    put(w.checksums.size());
    for (const auto& [at, sum] : w.checksums) {
      put(static_cast<uint64_t>(at.first));
      put(at.second);
      put(sum.first);
      put(sum.second);
    }
  }
  return out;
}

bool PushRecord::Load(const std::vector<char>& bytes) {
  size_t pos = 0;
  auto get = [&](uint64_t* v) {
    if (bytes.size() - pos < 8) return false;
    std::memcpy(v, bytes.data() + pos, 8);
    pos += 8;
    return true;
  };
  uint64_t magic = 0, window = 0, out_of_order = 0, count = 0;
  if (!get(&magic) || (magic != kRecordMagic && magic != kRecordMagicWithChecksums &&
                         magic != kRecordMagicWithXxh3) ||
      !get(&window) || window != window_clocks_ ||
      !get(&out_of_order) || out_of_order != max_out_of_order_ || !get(&count)) {
    return false;
  }
  std::unordered_map<uint32_t, WorkerRecord> workers;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t id = 0, floor = 0, clocks = 0;
    if (!get(&id) || id > std::numeric_limits<uint32_t>::max() || workers.count(id) ||
        !get(&floor) || !get(&clocks) || clocks > window_clocks_) {
      return false;
    }
    WorkerRecord w;
    if (floor > kMaxClock) return false;
    w.floor = static_cast<int64_t>(floor);
    int64_t previous = std::numeric_limits<int64_t>::min();
    for (uint64_t c = 0; c < clocks; ++c) {
      uint64_t clock = 0, next = 0, n = 0;
      if (!get(&clock) || !get(&next) || !get(&n) || n > max_out_of_order_) return false;
      if (clock > kMaxClock) return false;
      const int64_t sclock = static_cast<int64_t>(clock);
      if (sclock < w.floor || (c > 0 && sclock <= previous)) return false;
      previous = sclock;
      ClockEntry e;
      e.next = next;
      uint64_t last = next;
      for (uint64_t k = 0; k < n; ++k) {
        uint64_t index = 0;
        if (!get(&index) || index <= last) return false;  // increasing, past the prefix + 1
        last = index;
        e.beyond.insert(index);
      }
      w.clocks.emplace(sclock, std::move(e));
    }
    // The window holds the newest clocks only.
    if (!w.clocks.empty() && w.clocks.rbegin()->first - w.floor >= int64_t(window_clocks_)) {
      return false;
    }
    if (magic == kRecordMagicWithChecksums || magic == kRecordMagicWithXxh3) {
      uint64_t sums = 0;
      if (!get(&sums) || sums > kMaxChecksums) return false;
      std::pair<int64_t, uint64_t> last{std::numeric_limits<int64_t>::min(), 0};
      for (uint64_t k = 0; k < sums; ++k) {
        uint64_t clock = 0, index = 0, sum = 0, incarnation = 0;
        if (!get(&clock) || !get(&index) || !get(&sum) || sum == 0 || !get(&incarnation) ||
            clock > kMaxClock) {
          return false;
        }
        const std::pair<int64_t, uint64_t> at{static_cast<int64_t>(clock), index};
        if (at.first < w.floor || (k > 0 && at <= last)) return false;  // increasing
        last = at;
        // A record of an earlier build's shard holds sums of another function: compared with
        // this one's, every resend of the same process would look like a conflict. Its pushes
        // stay applied (resends are duplicates); only their payloads go unchecked.
        if (magic == kRecordMagicWithXxh3) {
          w.checksums.emplace_hint(w.checksums.end(), at, std::make_pair(sum, incarnation));
        }
      }
    }
    workers.emplace(static_cast<uint32_t>(id), std::move(w));
  }
  if (pos != bytes.size()) return false;
  workers_ = std::move(workers);
  return true;
}

}  // namespace parasol
