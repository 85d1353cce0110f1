// FaultPoints: the seam through which tests make a real process fail at a chosen point (the
// idea of leveldb's Env, for the points where durability is decided). Code asks Hit(point) where
// a failure matters; the answer says what to do there. Unless a plan is set, the answer is
// always kNone, at the cost of one relaxed atomic load.
//
// A process reads its plan from the environment at the first Hit():
//   PARASOL_FAULTS="point=action@n[,point=action@n...]"
//     action: fail (the operation returns an error), drop (a message is not sent), kill (the
//     process dies at once, as by kill -9) or slow (the operation takes longer, as it would at
//     a larger size); n: the hit it applies to (1-based, default 1; slow: that hit and every
//     one after it).
//   PARASOL_FAULTS_ONCE=DIR: a fault that fires leaves DIR/POINT.fired, and no process fires it
//     again (so a process restarted with the same environment runs on).
// The points, and who asks:
//   client.send        a worker, before each request it sends (kill: dies with requests in
//                      flight, e.g. between its pushes to two shards or its ticks to them;
//                      drop: the message is lost on its way, and resent when overdue)
//   shard.applied      a shard, after applying and recording a push, before the reply (kill:
//                      the push is applied and never acknowledged)
//   shard.reply        a shard, before each reply (drop: the reply is lost)
//   shard.replay_reply a shard, before each reply to a replayed request (drop)
//   shard.restore      a shard, as it starts loading a checkpoint (slow: each block of the file
//                      waits 500 ms, twice)
//   checkpoint.write   a shard, with the checkpoint's blocks written but not synced (fail: the
//                      write fails; kill: a partial temporary file is left behind; slow: it
//                      waits 500 ms there)
//   checkpoint.feed    a tiered shard's feed of its disk rows to the child writing its checkpoint,
//                      before each table's rows are read from the snapshot (slow: it waits 500 ms
//                      there, while the shard serves and changes those rows)
//   checkpoint.rename  a shard, with the checkpoint synced but not yet renamed into place (kill)
//                      (a checkpoint written in the background: its writer asks, and a kill
//                      kills the shard with it)
// Thread-safety: Hit() and Set() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace parasol {

enum class Fault { kNone, kFail, kDrop, kKill, kSlow };

class FaultPoints {
 public:
  // The process's plan (read from PARASOL_FAULTS at the first call).
  static FaultPoints& Get();

  // What to do at `point` now. kKill never returns: the process is gone.
  Fault Hit(std::string_view point);
  // Replaces the plan (spec as in PARASOL_FAULTS); an error names the bad entry.
  Status Set(const std::string& spec, const std::string& once_dir = "");
  // Times `point` was hit since the plan was set (counted only for planned points).
  uint64_t hits(const std::string& point) const;
  // A kill also kills process `pid` first (a shard's background checkpoint writer names its
  // shard: a kill at checkpoint.write or checkpoint.rename is then a kill of the shard while
  // its checkpoint is written).
  void set_kill_also(int pid) { kill_also_.store(pid); }

 private:
  struct Planned {
    Fault fault = Fault::kNone;
    uint64_t at = 1;
    // In memory shared with forked children (a shard's background checkpoint writer), so that
    // "the n-th hit" counts the hits of the whole process tree.
    uint64_t* hits = nullptr;
  };
  FaultPoints();

  std::atomic<bool> active_{false};
  std::atomic<int> kill_also_{0};
  mutable std::mutex mu_;
  std::map<std::string, Planned, std::less<>> plan_;
  std::string once_dir_;
  uint64_t* shared_hits_ = nullptr;  // kMaxPoints counters, shared with forked children
  static constexpr size_t kMaxPoints = 64;
};

}  // namespace parasol
