#include "tests/sim/sim_file_system.hpp"

#include <sstream>

namespace parasol::sim {

class SimFileSystem::File final : public WritableFile {
 public:
  File(SimFileSystem* fs, std::string path, std::shared_ptr<Node> node)
      : fs_(fs), path_(std::move(path)), node_(std::move(node)) {}
  Status Append(const void* data, size_t n) override {
    if (fs_->Frozen(path_)) return fs_->Gone(path_);
    node_->data.append(static_cast<const char*>(data), n);
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, const void* data, size_t n) override {
    if (fs_->Frozen(path_)) return fs_->Gone(path_);
    if (offset + n > node_->data.size()) {
      return InvalidArgument("'" + path_ + "': a write at " + std::to_string(offset) +
                             " beyond its end");
    }
    node_->data.replace(offset, n, static_cast<const char*>(data), n);
    return Status::Ok();
  }
  Status Sync() override {
    if (fs_->Frozen(path_)) return fs_->Gone(path_);
    node_->synced = node_->data;
    return Status::Ok();
  }

 private:
  SimFileSystem* fs_;
  const std::string path_;
  std::shared_ptr<Node> node_;
};

bool SimFileSystem::Frozen(const std::string& path) const {
  for (const std::string& p : frozen_) {
    if (path.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}

Status SimFileSystem::Gone(const std::string& path) const {
  return IoError("cannot change '" + path + "': its host is down (simulated)");
}

Result<std::unique_ptr<WritableFile>> SimFileSystem::Create(const std::string& path) {
  if (Frozen(path)) return Gone(path);
  std::shared_ptr<Node>& node = names_[path];
  if (node) {
    node->data.clear();  // O_TRUNC: the same file, emptied (its synced bytes until a sync)
  } else {
    node = std::make_shared<Node>();
  }
  return std::unique_ptr<WritableFile>(std::make_unique<File>(this, path, node));
}

Result<std::unique_ptr<std::istream>> SimFileSystem::Open(const std::string& path) {
  auto it = names_.find(path);
  if (it == names_.end()) return NotFound("cannot read '" + path + "': no such file");
  return std::unique_ptr<std::istream>(std::make_unique<std::istringstream>(it->second->data));
}

Status SimFileSystem::Rename(const std::string& from, const std::string& to) {
  if (Frozen(from) || Frozen(to)) return Gone(Frozen(from) ? from : to);
  auto it = names_.find(from);
  if (it == names_.end()) {
    return IoError("cannot rename '" + from + "' to '" + to + "': no such file");
  }
  std::shared_ptr<Node> node = it->second;
  names_.erase(it);
  names_[to] = std::move(node);
  return Status::Ok();
}

Status SimFileSystem::Remove(const std::string& path) {
  if (Frozen(path)) return Gone(path);
  names_.erase(path);
  return Status::Ok();
}

Status SimFileSystem::SyncDir(const std::string& dir) {
  if (Frozen(dir + "/")) return Gone(dir);
  for (const auto& [path, node] : names_) {
    if (ParentOf(path) == dir) durable_[path] = node;
  }
  for (auto it = durable_.begin(); it != durable_.end();) {
    if (ParentOf(it->first) == dir && names_.count(it->first) == 0) {
      it = durable_.erase(it);
    } else {
      ++it;
    }
  }
  return Status::Ok();
}

bool SimFileSystem::Exists(const std::string& path) { return names_.count(path) != 0; }

std::vector<std::string> SimFileSystem::List(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [path, node] : names_) {
    if (ParentOf(path) == dir) out.push_back(path.substr(dir.size() + 1));
  }
  return out;
}

void SimFileSystem::Crash(const std::string& prefix) {
  auto under = [&](const std::string& path) { return path.compare(0, prefix.size(), prefix) == 0; };
  // The names first: back to each folder's last sync.
  for (auto it = names_.begin(); it != names_.end();) {
    auto d = durable_.find(it->first);
    if (under(it->first) && (d == durable_.end() || d->second != it->second)) {
      ++lost_names_;
      it = names_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [path, node] : durable_) {
    if (under(path)) names_[path] = node;
  }
  // Then each file's bytes: its last sync, and maybe a torn part of what came after.
  std::set<Node*> seen;
  for (auto& [path, node] : names_) {
    if (!under(path) || !seen.insert(node.get()).second || node->data == node->synced) continue;
    std::string kept = node->synced;
    if (random_() % 4 == 0 && node->data.size() > kept.size()) {
      // A torn write: some of the pages after the last sync reached the disk.
      const size_t upto = kept.size() + random_() % (node->data.size() - kept.size() + 1);
      kept = node->data.substr(0, upto);
    }
    lost_bytes_ += node->data.size() > kept.size() ? node->data.size() - kept.size() : 0;
    node->data = kept;
    node->synced = kept;
  }
  frozen_.erase(prefix);
}

}  // namespace parasol::sim
