// WorkerKeyBinding: with security.worker_keys set, ties each worker id of the job to that
// worker's own CURVE key, so that one admitted key cannot speak as another worker.
//
// A shard's ZAP handler answers every admitted connection with the client's Z85 public key as
// its User-Id, and ZeroMQ attaches it to each message of that connection (the "User-Id"
// property). Check() compares it with what the request's header claims:
//   - a job worker's id (worker_id < cluster.workers) is served only from that worker's key;
//   - an observer or tool id (worker_id >= cluster.workers: stats, checkpoint, shutdown,
//     reads) only from a key that is no worker's (an allowed_clients key): a worker key acts
//     only as its own worker, so a stolen one cannot stop or checkpoint the job either.
// With security.operator_keys, the operator's requests (Checkpoint, Shutdown, Migrate, and a
// Membership that scales the job) are served only from an operator key, and an operator key
// acts only as a tool (an observer id). Without operator keys, any key that is no worker's may
// send them (allowed_clients keys are the tools' keys).
// Without worker keys and operator keys the binding is off and every request passes.
//
// Which role may send which op (with CURVE):
//   worker r (worker_keys[r]): Hello, pulls, pushes, Clock, Barrier, Step, Stats, and a
//     Membership about itself (join, leave), each naming worker r;
//   operator (operator_keys): Checkpoint, Shutdown, Migrate, a scaling Membership, Stats and
//     reads, as an observer;
//   other admitted keys (allowed_clients): reads and Stats as an observer; the operator's
//     requests too, while no operator_keys are set.
// Thread-safety: immutable once built; Check() may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"
#include "common/wire.hpp"

namespace parasol {

class WorkerKeyBinding {
 public:
  // Off: Check() passes every request.
  WorkerKeyBinding() = default;
  // keys[r]: worker r's Z85 public key. REQUIRES: no key appears twice.
  // `max_workers`: the job's worker ranks (an operator key may claim none of them; 0: the
  // worker keys' count).
  explicit WorkerKeyBinding(std::vector<std::string> keys,
                            std::vector<std::string> operator_keys = {},
                            uint32_t max_workers = 0);

  // The binding of security.worker_keys and operator_keys (each PATH.pub is read); off when
  // curve is off or both lists are empty. Refuses an unreadable or malformed key file, two
  // workers sharing a key, and a key that is both a worker's and an operator's.
  static Result<WorkerKeyBinding> Load(const SecurityOptions& security,
                                       uint32_t max_workers = 0);

  bool enabled() const { return !keys_.empty() || !operator_keys_.empty(); }
  // The worker keys by rank: a shard admits them as well as allowed_clients.
  const std::vector<std::string>& keys() const { return keys_; }
  // The operator keys: admitted too.
  const std::vector<std::string>& operator_keys() const { return operator_keys_; }
  // Whether `request` is one of the operator's (checkpoint, shutdown, migrate, scale).
  static bool IsOperatorRequest(const Header& request);

  // OK when `request` may be served from a connection whose ZAP User-Id is `user_id` (null or
  // empty: the message carries none). Otherwise FailedPrecondition naming the worker id the
  // request claims and whose key sent it. Allocates only on refusal.
  Status Check(const Header& request, const char* user_id) const;

 private:
  std::vector<std::string> keys_;                         // by worker rank
  std::vector<std::string> operator_keys_;
  uint32_t max_workers_ = 0;
  std::map<std::string, uint32_t, std::less<>> rank_of_;  // key -> worker rank
};

}  // namespace parasol
