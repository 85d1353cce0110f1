#include "worker/reshard.hpp"

#include <spdlog/spdlog.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/wire.hpp"

namespace parasol {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Op.Migrate's steps (protocols/message.fbs).
constexpr uint64_t kExport = 1, kInstall = 2, kCommit = 3, kDrop = 4;

double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// Refusals that pass: the shard restarts, is behind, or has not heard of the change yet.
bool Transient(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kTimeout;
}

class Mover {
 public:
  Mover(PsClient& client, int64_t clock, SteadyClock::time_point deadline)
      : client_(client), clock_(clock), deadline_(deadline) {}

  // One Migrate request, repeated while the refusal passes, until the deadline.
  Result<PsClient::Reply> Call(uint32_t shard, uint64_t step, uint32_t table, uint64_t offset,
                               uint64_t known_epoch = 0, const std::vector<uint64_t>* keys = nullptr,
                               const std::vector<float>* rows = nullptr, uint32_t floats = 1) {
    for (int attempt = 0;; ++attempt) {
      Header h = client_.ToolRequest(Op::Migrate, table);
      h.clock = clock_;
      h.seq = step;
      h.offset = offset;
      h.known_epoch = known_epoch;
      h.value_dim = floats;
      std::vector<zmq::message_t> payload;
      const uint64_t n = keys ? keys->size() : 0;
      h.key_count = n;
      payload.emplace_back(keys ? keys->data() : nullptr, n * sizeof(uint64_t));
      if (n > 0) {
        const FramePlan plan = PlanValueFrames(n, floats, 1u << 20);
        h.value_frames = plan.frames;
        h.rows_per_frame = plan.rows_per_frame;
        for (uint32_t f = 0; f < plan.frames; ++f) {
          payload.emplace_back(rows->data() + f * plan.rows_per_frame * floats,
                               plan.RowsInFrame(f, n) * floats * sizeof(float));
        }
      }
      Result<PsClient::Reply> r = client_.Call(shard, std::move(h), std::move(payload));
      if (r.ok() || !Transient(r.status()) || SteadyClock::now() > deadline_) {
        if (!r.ok()) {
          return r.status().WithContext("shard " + std::to_string(shard) +
                                        ", moving the rows for clock " + std::to_string(clock_));
        }
        return r;
      }
      if (attempt % 100 == 99) spdlog::info("scale: waiting for shard {}: {}", shard, r.status().ToString());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  PsClient& client_;
  const int64_t clock_;
  const SteadyClock::time_point deadline_;
};

}  // namespace

std::string ReshardReport::ToString() const {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "%u -> %u shards from clock %lld: %llu rows moved in %.2f s (%.0f rows/s), %llu "
                "dropped, %llu pass(es); waited %.2f s for the clock, %.2f s in all",
                from, to, static_cast<long long>(clock),
                static_cast<unsigned long long>(rows_moved), copy_seconds,
                copy_seconds > 0 ? rows_moved / copy_seconds : 0.0,
                static_cast<unsigned long long>(rows_dropped),
                static_cast<unsigned long long>(passes), wait_seconds, total_seconds);
  return buf;
}

Result<ReshardReport> Reshard(PsClient& client, uint32_t servers,
                              std::chrono::milliseconds timeout) {
  const auto start = SteadyClock::now();
  const auto deadline = start + timeout;
  ReshardReport report;
  Result<int64_t> clock = client.ScaleServers(servers);
  while (!clock.ok() && Transient(clock.status()) && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    clock = client.ScaleServers(servers);
  }
  if (!clock.ok()) return clock.status();
  report.clock = *clock;
  const Membership& m = client.membership();
  const Placement before = m.PlacementAt(report.clock - 1);
  const Placement after = m.PlacementAt(report.clock);
  report.from = before.count();
  report.to = after.count();
  if (report.to != servers) {
    return FailedPrecondition("shard 0 answered a change to " + std::to_string(report.to) +
                              " shards, not " + std::to_string(servers));
  }
  spdlog::info("scale: {} -> {} shards from clock {}", report.from, report.to, report.clock);
  const Manifest& manifest = client.manifest();
  const uint32_t listed = static_cast<uint32_t>(manifest.cluster.servers.size());
  Mover mover(client, report.clock, deadline);

  bool first_page = true;
  while (true) {
    ++report.passes;
    const auto pass_start = SteadyClock::now();
    uint64_t moved = 0;
    // The process of each target that took rows (0: none yet); a target that took rows from
    // two processes lost the first's: the pass is done again.
    std::vector<uint64_t> installed_epoch(listed, 0);
    bool again = false;
    for (uint32_t t = 0; t < manifest.tables.size() && !again; ++t) {
      if (manifest.tables[t].kind != TableKind::kSparse) continue;
      for (uint32_t s = 0; s < before.count() && !again; ++s) {
        uint64_t cursor = 0, source_epoch = 0;
        while (true) {
          PARASOL_ASSIGN_OR_RETURN(PsClient::Reply page, mover.Call(s, kExport, t, cursor));
          if (first_page) {
            report.wait_seconds = Since(start);
            first_page = false;
          }
          if (source_epoch != 0 && page.header.server_epoch != source_epoch) {
            spdlog::info("scale: shard {} restarted while its rows were read; reading again", s);
            source_epoch = 0;
            cursor = 0;
            continue;
          }
          source_epoch = page.header.server_epoch;
          const uint64_t n = page.header.key_count;
          const uint32_t floats = page.header.value_dim;
          if (page.frames.empty() || page.frames[0].size() != n * sizeof(uint64_t)) {
            return BadMessage("shard " + std::to_string(s) + ": an export page of " +
                              std::to_string(n) + " rows without its keys");
          }
          // The page's rows by the shard that holds them from the change on.
          std::vector<std::vector<uint64_t>> keys(listed);
          std::vector<std::vector<float>> rows(listed);
          const auto* k = page.frames[0].data<uint64_t>();
          uint64_t row = 0;
          for (size_t f = 1; f < page.frames.size(); ++f) {
            const float* v = page.frames[f].data<float>();
            const uint64_t in_frame = page.frames[f].size() / (sizeof(float) * floats);
            for (uint64_t i = 0; i < in_frame && row < n; ++i, ++row) {
              uint64_t key;
              std::memcpy(&key, k + row, sizeof(key));
              const uint32_t d = after.ShardOf(key);
              keys[d].push_back(key);
              rows[d].insert(rows[d].end(), v + i * floats, v + (i + 1) * floats);
            }
          }
          if (row != n) {
            return BadMessage("shard " + std::to_string(s) + ": an export page of " +
                              std::to_string(n) + " rows carried " + std::to_string(row));
          }
          for (uint32_t d = 0; d < listed; ++d) {
            if (keys[d].empty()) continue;
            PARASOL_ASSIGN_OR_RETURN(
                PsClient::Reply ack,
                mover.Call(d, kInstall, t, 0, 0, &keys[d], &rows[d], floats));
            if (ack.header.duplicate) continue;  // committed already
            if (installed_epoch[d] != 0 && installed_epoch[d] != ack.header.server_epoch) {
              again = true;
            }
            installed_epoch[d] = ack.header.server_epoch;
            moved += keys[d].size();
          }
          if (page.header.done) break;
          cursor = page.header.offset;
        }
      }
    }
    // Commit: every shard, each to the process that took its rows.
    for (uint32_t s = 0; s < listed && !again; ++s) {
      const uint64_t epoch = installed_epoch[s] ? installed_epoch[s] : client.shard_epoch(s);
      Result<PsClient::Reply> ack = mover.Call(s, kCommit, 0, 0, epoch);
      if (!ack.ok() && ack.status().code() == StatusCode::kFailedPrecondition &&
          installed_epoch[s] != 0 && client.shard_epoch(s) != installed_epoch[s]) {
        spdlog::info("scale: shard {} restarted before it committed its rows; copying again", s);
        again = true;
        break;
      }
      if (!ack.ok()) return ack.status();
    }
    report.copy_seconds = Since(pass_start);
    report.rows_moved = moved;
    if (!again) break;
    if (SteadyClock::now() > deadline) {
      return Timeout("scale: shards kept restarting while the rows were copied");
    }
  }
  for (uint32_t s = 0; s < before.count(); ++s) {
    PARASOL_ASSIGN_OR_RETURN(PsClient::Reply ack, mover.Call(s, kDrop, 0, 0));
    if (!ack.header.duplicate) report.rows_dropped += ack.header.offset;
  }
  report.total_seconds = Since(start);
  return report;
}

}  // namespace parasol
