#include "common/file_system.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace parasol {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return IoError("cannot " + what + " '" + path + "': " + std::strerror(errno));
}

class PosixFile final : public WritableFile {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override { ::close(fd_); }

  Status Append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_);
      }
      p += w;
      offset += static_cast<uint64_t>(w);
      n -= static_cast<size_t>(w);
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (::fsync(fd_) != 0) return Errno("fsync", path_);
    return Status::Ok();
  }

 private:
  const int fd_;
  const std::string path_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> Create(const std::string& path) override {
    // A folder made here is itself a name in its parent: synced too, so that a crash right
    // after cannot lose the folder with the file.
    const std::string folder = ParentOf(path);
    std::error_code ec;
    if (!std::filesystem::exists(folder, ec)) {
      std::filesystem::create_directories(folder, ec);
      (void)SyncDir(ParentOf(folder));
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Errno("create", path);
    return std::unique_ptr<WritableFile>(std::make_unique<PosixFile>(fd, path));
  }
  Result<std::unique_ptr<std::istream>> Open(const std::string& path) override {
    auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*in) return NotFound("cannot read '" + path + "': " + std::strerror(errno));
    return std::unique_ptr<std::istream>(std::move(in));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return IoError("cannot rename '" + from + "' to '" + to + "': " + std::strerror(errno));
    }
    return Status::Ok();
  }
  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("remove", path);
    return Status::Ok();
  }
  Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Errno("open folder", dir);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    // A file system that cannot sync a folder (EINVAL, ENOTSUP) keeps its names as it can, as
    // PostgreSQL assumes too; failing every checkpoint there would help no one.
    if (rc != 0 && err != EINVAL && err != ENOTSUP && err != EBADF) {
      errno = err;
      return Errno("fsync folder", dir);
    }
    return Status::Ok();
  }
  bool Exists(const std::string& path) override {
    std::error_code ec;
    return std::filesystem::exists(path, ec);
  }
  std::vector<std::string> List(const std::string& dir) override {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      out.push_back(e.path().filename().string());
    }
    return out;
  }
};

}  // namespace

FileSystem* FileSystem::Real() {
  static PosixFileSystem fs;
  return &fs;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status WriteFileDurably(FileSystem* fs, const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  Status st;
  {
    Result<std::unique_ptr<WritableFile>> f = fs->Create(tmp);
    if (!f.ok()) return f.status();
    st = (*f)->Append(text.data(), text.size());
    if (st.ok()) st = (*f)->Sync();
  }
  if (st.ok()) st = fs->Rename(tmp, path);
  if (!st.ok()) {
    (void)fs->Remove(tmp);
    return st;
  }
  return fs->SyncDir(ParentOf(path));
}

}  // namespace parasol
