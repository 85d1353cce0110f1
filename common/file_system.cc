#include "common/file_system.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <streambuf>
#include <vector>

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

// A file read front to back through its descriptor. One larger than an eighth of the machine's
// memory has its pages given back to the kernel's cache behind the reader (POSIX_FADV_DONTNEED,
// every kDropEvery bytes): a shard restoring a checkpoint of a good part of its memory reads it
// once, and a page cache filled with it only crowds out the memory the restored rows and their
// index are about to take (at 10^8 rows here, an 8 GB file on a 24 GiB machine: the index
// took 5.9 s with the file's pages kept, 2.8 s without them). Smaller files keep their pages:
// giving them back cost a 10^7-row restore a third of its speed. Reads of kDirectBytes or more
// go straight into the caller's buffer. Seeks as std::filebuf does (dropping what is buffered).
class ReadOnceBuf final : public std::streambuf {
 public:
  // Owns `fd` once made (closed when this goes).
  ReadOnceBuf(int fd, uint64_t drop_behind_above)
      : fd_(fd), buffer_(new char[kBufferBytes]) {  // not zeroed: only what read() fills is read
    (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    struct stat st {};
    drop_behind_ =
        ::fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) > drop_behind_above;
    setg(buffer_.get(), buffer_.get(), buffer_.get());
  }
  ~ReadOnceBuf() override { ::close(fd_); }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const ssize_t r = Read(buffer_.get(), kBufferBytes);
    if (r <= 0) return traits_type::eof();
    setg(buffer_.get(), buffer_.get(), buffer_.get() + r);
    return traits_type::to_int_type(*gptr());
  }
  std::streamsize xsgetn(char* s, std::streamsize n) override {
    if (n <= 0) return 0;
    std::streamsize got = 0;
    // What is buffered first, then large reads straight into `s`.
    const std::streamsize buffered = std::min<std::streamsize>(n, egptr() - gptr());
    if (buffered > 0) {
      std::memcpy(s, gptr(), static_cast<size_t>(buffered));
      gbump(static_cast<int>(buffered));
      got += buffered;
    }
    while (got < n) {
      if (n - got < static_cast<std::streamsize>(kDirectBytes)) {
        if (traits_type::eq_int_type(underflow(), traits_type::eof())) break;
        const std::streamsize more = std::min<std::streamsize>(n - got, egptr() - gptr());
        std::memcpy(s + got, gptr(), static_cast<size_t>(more));
        gbump(static_cast<int>(more));
        got += more;
        continue;
      }
      const ssize_t r = Read(s + got, static_cast<size_t>(n - got));
      if (r <= 0) break;
      got += r;
    }
    return got;
  }
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
    // The file offset is past what is buffered: a seek from here counts from the reader's place.
    if (dir == std::ios_base::cur && off == 0) {  // tellg(): the buffer stays
      const off_t at = ::lseek(fd_, 0, SEEK_CUR);
      if (at < 0) return pos_type(off_type(-1));
      return pos_type(static_cast<off_type>(at) - (egptr() - gptr()));
    }
    if (dir == std::ios_base::cur) off -= egptr() - gptr();
    const int whence = dir == std::ios_base::beg ? SEEK_SET
                       : dir == std::ios_base::cur ? SEEK_CUR
                                                   : SEEK_END;
    const off_t at = ::lseek(fd_, static_cast<off_t>(off), whence);
    if (at < 0) return pos_type(off_type(-1));
    setg(buffer_.get(), buffer_.get(), buffer_.get());
    dropped_to_ = std::min<uint64_t>(dropped_to_, static_cast<uint64_t>(at));
    return pos_type(static_cast<off_type>(at));
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override {
    return seekoff(off_type(pos), std::ios_base::beg, which);
  }

 private:
  static constexpr size_t kBufferBytes = 1 << 20;
  static constexpr size_t kDirectBytes = 256 << 10;
  static constexpr uint64_t kDropEvery = 64 << 20;

  ssize_t Read(char* s, size_t n) {
    ssize_t r;
    do {
      r = ::read(fd_, s, n);
    } while (r < 0 && errno == EINTR);
    // An error is not the file's end: the stream that calls this turns it into badbit (a
    // reader tells a refused read from a short file by it).
    if (r < 0) throw std::ios_base::failure(std::string("read: ") + std::strerror(errno));
    if (r > 0 && drop_behind_) {
      const off_t at = ::lseek(fd_, 0, SEEK_CUR);
      if (at > 0 && static_cast<uint64_t>(at) >= dropped_to_ + kDropEvery) {
        (void)::posix_fadvise(fd_, static_cast<off_t>(dropped_to_),
                              static_cast<off_t>(static_cast<uint64_t>(at) - dropped_to_),
                              POSIX_FADV_DONTNEED);
        dropped_to_ = static_cast<uint64_t>(at);
      }
    }
    return r;
  }

  const int fd_;
  std::unique_ptr<char[]> buffer_;
  bool drop_behind_ = false;
  uint64_t dropped_to_ = 0;  // the pages before it were given back
};

class ReadOnceStream final : public std::istream {
 public:
  ReadOnceStream(int fd, uint64_t drop_behind_above)
      : std::istream(nullptr), buf_(fd, drop_behind_above) {
    rdbuf(&buf_);
  }

 private:
  ReadOnceBuf buf_;
};

uint64_t EighthOfMemory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 8
                               : UINT64_MAX;
}

}  // namespace

Result<std::unique_ptr<std::istream>> OpenToReadOnce(const std::string& path,
                                                     uint64_t drop_behind_above) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot read '" + path + "': " + std::strerror(errno));
  try {
    return std::unique_ptr<std::istream>(std::make_unique<ReadOnceStream>(fd, drop_behind_above));
  } catch (...) {
    ::close(fd);  // not made: the stream never owned it
    throw;
  }
}

namespace {

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
    static const uint64_t eighth = EighthOfMemory();
    return OpenToReadOnce(path, eighth);
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
