#include "common/fault_points.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace parasol {

FaultPoints& FaultPoints::Get() {
  static FaultPoints* points = new FaultPoints();  // never destroyed: hit from any thread
  return *points;
}

FaultPoints::FaultPoints() {
  const char* spec = std::getenv("PARASOL_FAULTS");
  const char* once = std::getenv("PARASOL_FAULTS_ONCE");
  if (spec == nullptr || *spec == '\0') return;
  if (Status st = Set(spec, once ? once : ""); !st.ok()) {
    spdlog::error("PARASOL_FAULTS: {}; no faults will be injected", st.ToString());
  }
}

Status FaultPoints::Set(const std::string& spec, const std::string& once_dir) {
  std::map<std::string, Planned, std::less<>> plan;
  std::stringstream in(spec);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("'" + entry + "': expected point=action[@n]");
    }
    std::string action = entry.substr(eq + 1);
    Planned p;
    if (const size_t at = action.find('@'); at != std::string::npos) {
      char* end = nullptr;
      p.at = std::strtoull(action.c_str() + at + 1, &end, 10);
      if (end == action.c_str() + at + 1 || *end != '\0' || p.at == 0) {
        return InvalidArgument("'" + entry + "': @n needs a number >= 1");
      }
      action.resize(at);
    }
    if (action == "fail") {
      p.fault = Fault::kFail;
    } else if (action == "drop") {
      p.fault = Fault::kDrop;
    } else if (action == "kill") {
      p.fault = Fault::kKill;
    } else if (action == "slow") {
      p.fault = Fault::kSlow;
    } else {
      return InvalidArgument("'" + entry + "': the action is fail, drop, kill or slow");
    }
    plan[entry.substr(0, eq)] = p;
  }
  if (plan.size() > kMaxPoints) {
    return InvalidArgument("more than " + std::to_string(kMaxPoints) + " fault points planned");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shared_hits_ == nullptr) {
    void* m = ::mmap(nullptr, kMaxPoints * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return InvalidArgument("cannot map the fault points' counters");
    shared_hits_ = static_cast<uint64_t*>(m);
  }
  size_t i = 0;
  for (auto& [name, planned] : plan) {
    planned.hits = shared_hits_ + i++;
    *planned.hits = 0;
  }
  plan_ = std::move(plan);
  once_dir_ = once_dir;
  active_.store(!plan_.empty(), std::memory_order_relaxed);
  return Status::Ok();
}

Fault FaultPoints::Hit(std::string_view point) {
  if (!active_.load(std::memory_order_relaxed)) return Fault::kNone;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plan_.find(point);
  if (it == plan_.end()) return Fault::kNone;
  Planned& p = it->second;
  const uint64_t hit = __atomic_add_fetch(p.hits, 1, __ATOMIC_RELAXED);
  // Slow holds from the n-th hit on; the others fire once.
  if (p.fault == Fault::kSlow && hit > p.at) return Fault::kSlow;
  if (hit != p.at) return Fault::kNone;
  if (!once_dir_.empty()) {
    const std::string mark = once_dir_ + "/" + std::string(point) + ".fired";
    std::error_code ec;
    if (std::filesystem::exists(mark, ec)) return Fault::kNone;
    std::ofstream(mark) << ::getpid() << "\n";
  }
  spdlog::warn("fault injected at {} (hit {})", point, hit);
  if (p.fault == Fault::kKill) {
    spdlog::default_logger()->flush();
    // A background checkpoint's writer stands for its shard: the shard dies with it.
    if (const pid_t also = kill_also_.load(); also > 0) ::kill(also, SIGKILL);
    ::kill(::getpid(), SIGKILL);
    ::_exit(137);  // not reached
  }
  return p.fault;
}

uint64_t FaultPoints::hits(const std::string& point) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plan_.find(point);
  return it == plan_.end() ? 0 : __atomic_load_n(it->second.hits, __ATOMIC_RELAXED);
}

}  // namespace parasol
