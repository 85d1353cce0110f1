#include "server/worker_key_binding.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include "common/curve_keys.hpp"

namespace parasol {
namespace {

std::string Claim(const Header& request) {
  return std::string(OpName(request.op)) + " as worker " + std::to_string(request.worker_id) +
         " refused: ";
}

}  // namespace

WorkerKeyBinding::WorkerKeyBinding(std::vector<std::string> keys,
                                   std::vector<std::string> operator_keys, uint32_t max_workers)
    : keys_(std::move(keys)),
      operator_keys_(std::move(operator_keys)),
      max_workers_(std::max<uint32_t>(max_workers, static_cast<uint32_t>(keys_.size()))) {
  for (uint32_t r = 0; r < keys_.size(); ++r) rank_of_.emplace(keys_[r], r);
}

bool WorkerKeyBinding::IsOperatorRequest(const Header& request) {
  return request.op == Op::Shutdown || request.op == Op::Checkpoint ||
         request.op == Op::Migrate ||
         (request.op == Op::Membership && (request.key_count > 0 || request.shard_count > 0));
}

Result<WorkerKeyBinding> WorkerKeyBinding::Load(const SecurityOptions& security,
                                                uint32_t max_workers) {
  if (!security.curve || (security.worker_keys.empty() && security.operator_keys.empty())) {
    return WorkerKeyBinding();
  }
  std::vector<std::string> keys;
  std::map<std::string, size_t> rank_of;
  for (size_t r = 0; r < security.worker_keys.size(); ++r) {
    PARASOL_ASSIGN_OR_RETURN(std::string key, ReadCurvePublicKey(security.worker_keys[r]));
    auto [first, fresh] = rank_of.emplace(key, r);
    if (!fresh) {
      return InvalidArgument("security.worker_keys[" + std::to_string(first->second) + "] and [" +
                             std::to_string(r) +
                             "] hold the same public key; each worker needs its own key pair");
    }
    keys.push_back(std::move(key));
  }
  WorkerKeyBinding binding(std::move(keys), {}, max_workers);
  for (size_t i = 0; i < security.operator_keys.size(); ++i) {
    PARASOL_ASSIGN_OR_RETURN(std::string key, ReadCurvePublicKey(security.operator_keys[i]));
    if (auto w = rank_of.find(key); w != rank_of.end()) {
      return InvalidArgument("security.operator_keys[" + std::to_string(i) +
                             "] is worker " + std::to_string(w->second) +
                             "'s key too; an operator needs a key of its own");
    }
    binding.operator_keys_.push_back(std::move(key));
  }
  return binding;
}

Status WorkerKeyBinding::Check(const Header& request, const char* user_id) const {
  if (!enabled()) return Status::Ok();
  const std::string_view key = user_id != nullptr ? user_id : "";
  if (key.empty()) {
    return FailedPrecondition(Claim(request) +
                              "the connection carries no CURVE key, and security.worker_keys "
                              "or operator_keys bind every request to one");
  }
  const uint32_t id = request.worker_id;
  const auto owner = rank_of_.find(key);
  const bool operator_key =
      std::find(operator_keys_.begin(), operator_keys_.end(), key) != operator_keys_.end();
  if (!operator_keys_.empty()) {
    if (IsOperatorRequest(request) && !operator_key) {
      return FailedPrecondition(Claim(request) + OpName(request.op) +
                                " is an operator's request, and this connection's CURVE key is "
                                "not one of security.operator_keys");
    }
    if (operator_key) {
      // A tool: an observer id, never a worker of the job.
      if (id < max_workers_) {
        return FailedPrecondition(Claim(request) + "an operator key acts only as a tool (an "
                                  "observer), not as a worker of the job");
      }
      return Status::Ok();
    }
    if (keys_.empty()) return Status::Ok();  // no worker keys: any other key may be any worker
  }
  if (id < keys_.size()) {
    if (key == keys_[id]) {
      // A worker trains; stopping or checkpointing the job is for tools (observer ids), so a
      // stolen worker key cannot do either.
      if (IsOperatorRequest(request)) {
        return FailedPrecondition(Claim(request) + "a worker's key may not ask for " +
                                  OpName(request.op) + "; an operator's key may, as an observer");
      }
      return Status::Ok();
    }
    const std::string mine = std::to_string(id);
    std::string whose =
        owner != rank_of_.end()
            ? "worker " + std::to_string(owner->second) + "'s key"
            : "a tool key (security.allowed_clients), which may act only as an observer "
              "(worker id >= cluster.max_workers = " +
                  std::to_string(keys_.size()) + ")";
    return FailedPrecondition(Claim(request) + "this connection's CURVE key is not worker " + mine +
                              "'s key (security.worker_keys[" + mine + "]); it is " + whose);
  }
  if (owner == rank_of_.end()) return Status::Ok();  // a tool key acting as an observer
  const std::string theirs = std::to_string(owner->second);
  return FailedPrecondition(Claim(request) + "this connection's CURVE key is worker " + theirs +
                            "'s key (security.worker_keys[" + theirs +
                            "]), which may act only as worker " + theirs);
}

}  // namespace parasol
