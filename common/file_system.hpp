// FileSystem: the files a shard keeps (its checkpoints, its rollback and start marks), as
// leveldb's Env gives them to its database. FileSystem::Real() is the OS's; the deterministic
// simulation (tests/sim) keeps them in memory, and a crash of a simulated host loses what was
// not made durable, as a real host's crash does:
//   - a file's bytes survive once WritableFile::Sync() returns, not before;
//   - a new name (Create, Rename) or a removal survives once SyncDir() of its folder returns.
// Code that must survive a host's crash therefore writes NAME.tmp, syncs it, renames it to
// NAME and syncs the folder (WriteFileDurably does that for a small file).
//
// Thread-safety: FileSystem::Real() may be used from any thread; a WritableFile belongs to one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace parasol {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends `n` bytes at the end.
  virtual Status Append(const void* data, size_t n) = 0;
  // Writes `n` bytes at `offset`, within what was written already (a header written again).
  virtual Status WriteAt(uint64_t offset, const void* data, size_t n) = 0;
  // What was written so far survives a crash of the host from here on (fsync).
  virtual Status Sync() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // The OS's files (one for the process).
  static FileSystem* Real();

  // Creates `path` empty (or truncates it), its folders first.
  virtual Result<std::unique_ptr<WritableFile>> Create(const std::string& path) = 0;
  // Reads `path` from its start; NotFound when there is none. The OS's: OpenToReadOnce(path,
  // an eighth of the machine's memory).
  virtual Result<std::unique_ptr<std::istream>> Open(const std::string& path) = 0;
  // Replaces `to` with `from` at once (rename(2)).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Removes a file; one that is not there is no error.
  virtual Status Remove(const std::string& path) = 0;
  // What changed in folder `dir`'s names (files made, renamed, removed) survives a crash.
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // The names (not paths) of the entries of folder `dir`; none when it is not there.
  virtual std::vector<std::string> List(const std::string& dir) = 0;
};

// Writes `text` to `path` so that after a crash the file is either as before or holds all of
// `text`: written to PATH.tmp, synced, renamed into place, and the folder synced.
Status WriteFileDurably(FileSystem* fs, const std::string& path, const std::string& text);

// Opens `path` to be read front to back (seeking allowed): a file larger than
// `drop_behind_above` bytes has its pages given back to the kernel's cache behind the reader,
// each 64 MiB read; a smaller one keeps them. NotFound when it cannot be opened.
Result<std::unique_ptr<std::istream>> OpenToReadOnce(const std::string& path,
                                                     uint64_t drop_behind_above);

// The folder part of `path` ("a/b/c" -> "a/b"; "c" -> ".").
std::string ParentOf(const std::string& path);

}  // namespace parasol
