// SimFileSystem: the simulated disks of a job's hosts, in memory (common/file_system.hpp). Each
// host owns the files under a prefix of its own (a shard's checkpoint folder). What survives a
// crash of a host is what a real host's crash leaves:
//   - a file's bytes as of its last Sync(); of what came after, a random part (a torn write:
//     the bytes up to a random length) or nothing;
//   - its folder's names (files created, renamed, removed) as of the folder's last SyncDir().
// A host may also die at a chosen moment: Freeze(prefix) makes every change under the prefix
// fail from then on (the process that asked is gone; nothing it does after reaches the disk),
// until the crash (Crash) or the kill (Thaw) that follows.
//
// Deterministic: the torn lengths come from the seeded `random` given at construction.
// Thread-safety: none (the simulation runs one thing at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/file_system.hpp"

namespace parasol::sim {

class SimFileSystem final : public FileSystem {
 public:
  explicit SimFileSystem(std::function<uint64_t()> random) : random_(std::move(random)) {}

  Result<std::unique_ptr<WritableFile>> Create(const std::string& path) override;
  Result<std::unique_ptr<std::istream>> Open(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  bool Exists(const std::string& path) override;
  std::vector<std::string> List(const std::string& dir) override;

  // The host of `prefix` dies now: nothing under it changes any more (changes fail).
  void Freeze(const std::string& prefix) { frozen_.insert(prefix); }
  // Its process was killed, the host stays up: what was written stays (the page cache).
  void Thaw(const std::string& prefix) { frozen_.erase(prefix); }
  // Its host crashed: under `prefix`, names go back to their folders' last sync, and each
  // file's bytes to its last sync, with a random torn part of what came after. Thaws it.
  void Crash(const std::string& prefix);

  // What crashes lost so far: bytes not synced, and names not synced.
  uint64_t lost_bytes() const { return lost_bytes_; }
  uint64_t lost_names() const { return lost_names_; }

 private:
  struct Node {
    std::string data;    // as the OS has it now
    std::string synced;  // as of the last Sync()
  };
  class File;

  bool Frozen(const std::string& path) const;
  Status Gone(const std::string& path) const;

  std::function<uint64_t()> random_;
  std::map<std::string, std::shared_ptr<Node>> names_;    // now
  std::map<std::string, std::shared_ptr<Node>> durable_;  // as a crash leaves them
  std::set<std::string> frozen_;
  uint64_t lost_bytes_ = 0, lost_names_ = 0;
};

}  // namespace parasol::sim
