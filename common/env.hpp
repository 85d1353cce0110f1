// Env: what a process of the job takes from outside its own code: the time, random numbers,
// a worker's connections to the shards, a shard's files and the fault points. It is passed in rather than read from globals, as
// leveldb's Env is. Env::Real() is the steady clock, the OS's random device and ZeroMQ. The
// deterministic simulation (tests/sim) gives each process it runs an Env of its own, so that
// shards and workers share one virtual clock, one seeded source of randomness, a simulated
// network and a simulated disk (whose hosts may crash, losing what was not synced), and a
// whole job runs in one process on one seeded schedule.
//
// Thread-safety: Env::Real() may be used from any thread. A ShardLinks belongs to one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/curve_keys.hpp"
#include "common/fault_points.hpp"
#include "common/file_system.hpp"
#include "common/manifest.hpp"
#include "common/status.hpp"

namespace parasol {

// A worker's connections to the shards of the job, one per shard, in order per connection
// (ZeroMQ's DEALER to a shard's ROUTER). A connection that breaks drops what it had queued
// and connects again by itself; the next Wait() reports it (TakeReconnect()).
class ShardLinks {
 public:
  virtual ~ShardLinks() = default;

  // Opens shard `shard`'s connection anew: what the old one still held is dropped.
  virtual Status Open(uint32_t shard) = 0;
  // Sends one message; the frames are consumed. With `dontwait`, a connection that cannot take
  // it now refuses it at once. Never throws.
  virtual Status Send(uint32_t shard, std::vector<zmq::message_t>& frames,
                      bool dontwait = false) = 0;
  // Waits at most `wait` for a reply from any shard (or a reconnection).
  virtual Status Wait(std::chrono::milliseconds wait) = 0;
  // The next reply from `shard` into `frames` (cleared first): false when none is waiting.
  virtual Result<bool> Receive(uint32_t shard, std::vector<zmq::message_t>* frames) = 0;
  // Whether `shard`'s connection was made again since the last call (the first connection is
  // no reconnection; a connection counts once its handshake succeeded, so one refused at the
  // handshake is none): the shard may have restarted.
  virtual bool TakeReconnect(uint32_t shard) = 0;
  // The connection's security mechanism (ZMQ_NULL, ZMQ_CURVE).
  virtual int Mechanism(uint32_t shard) const = 0;
};

// Work run beside its caller (a shard's background checkpoint write), made by Env::RunAside.
class AsideTask {
 public:
  virtual ~AsideTask() = default;
  // Whether the work has ended.
  virtual bool Done() = 0;
  // Until it has ended, or (the simulation's, for a process killed meanwhile) until it is
  // known that it never will run.
  virtual void Wait() = 0;
};

class Env {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~Env() = default;
  // The process's ZeroMQ, steady clock and random device (one for all).
  static Env* Real();

  virtual Clock::time_point Now() = 0;
  virtual uint64_t Random64() = 0;
  // Worker `worker`'s connections to every server of `manifest`, with its CURVE key pair and
  // the servers' public keys when the job uses CURVE (`keys` null otherwise). Nothing is
  // connected yet: Open() each shard.
  virtual Result<std::unique_ptr<ShardLinks>> LinkShards(
      const Manifest& manifest, uint32_t worker, const CurveKeyPair* keys,
      const std::vector<std::string>& server_public_keys) = 0;
  // The files a shard keeps its checkpoints and marks in.
  virtual FileSystem* Files() { return FileSystem::Real(); }
  // What to do at fault point `point` now (common/fault_points.hpp lists them). kKill never
  // returns from the real one.
  virtual Fault Hit(std::string_view point) { return FaultPoints::Get().Hit(point); }
  // Runs `work` beside the caller: the real one on a thread of its own, the simulation's as an
  // event of its schedule (so a seed still replays exactly). The work must touch nothing its
  // caller goes on using.
  virtual std::unique_ptr<AsideTask> RunAside(std::function<void()> work);
};

}  // namespace parasol
