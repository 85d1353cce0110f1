#include "server/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/hash.hpp"

namespace parasol {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'O', 'L', 'C', 'K', 'P', 'T'};
constexpr char kEnd[8] = {'P', 'S', 'O', 'L', 'E', 'N', 'D', '!'};

struct RawHeader {
  char magic[8];
  uint32_t version, shard, shards, reserved;
  uint64_t fingerprint;
  int64_t clock;
  uint64_t sequence, blocks, checksum;
};
struct RawBlock {
  uint32_t kind, table;
  uint64_t count, bytes, checksum;
};
struct RawFooter {
  char magic[8];
  uint64_t blocks, checksum;
};

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot write '" + path + "': " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return IoError("cannot open folder '" + dir + "': " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

}  // namespace

uint64_t Checksum64(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = SplitMix64(seed ^ n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ Fmix64(w + i)) * 0x9e3779b97f4a7c15ULL;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return Fmix64(h ^ tail ^ (n - i));
}

Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                           const std::vector<CheckpointBlock>& blocks) {
  const std::filesystem::path target(path);
  std::error_code ec;
  std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("cannot create '" + tmp + "': " + std::strerror(errno));
  RawHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kCheckpointVersion;
  h.shard = header.shard;
  h.shards = header.shards;
  h.fingerprint = header.fingerprint;
  h.clock = header.clock;
  h.sequence = header.sequence;
  h.blocks = blocks.size();
  h.checksum = Checksum64(&h, offsetof(RawHeader, checksum));
  Status st = WriteAll(fd, &h, sizeof(h), tmp);
  uint64_t all = 0;
  for (const CheckpointBlock& b : blocks) {
    if (!st.ok()) break;
    RawBlock rb{b.kind, b.table, b.count, b.bytes.size(), Checksum64(b.bytes.data(), b.bytes.size())};
    all = Checksum64(&rb.checksum, sizeof(rb.checksum), all);
    st = WriteAll(fd, &rb, sizeof(rb), tmp);
    if (st.ok()) st = WriteAll(fd, b.bytes.data(), b.bytes.size(), tmp);
  }
  RawFooter f{};
  std::memcpy(f.magic, kEnd, 8);
  f.blocks = blocks.size();
  f.checksum = all;
  if (st.ok()) st = WriteAll(fd, &f, sizeof(f), tmp);
  if (st.ok() && ::fsync(fd) != 0) st = IoError("cannot fsync '" + tmp + "': " + std::strerror(errno));
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = IoError("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return FsyncDir(target.parent_path().string());
}

Status ReadCheckpointFile(const std::string& path, CheckpointHeader* header,
                          const std::function<Status(const CheckpointBlock&)>& block) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read checkpoint '" + path + "': " + std::strerror(errno));
  auto bad = [&](const std::string& what) {
    return Status(StatusCode::kIoError, "checkpoint '" + path + "' is damaged: " + what +
                                            " (at byte " + std::to_string(in.tellg()) + ")");
  };
  RawHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h))) return bad("truncated header");
  if (std::memcmp(h.magic, kMagic, 8) != 0) return bad("not a Parasol checkpoint");
  if (h.checksum != Checksum64(&h, offsetof(RawHeader, checksum))) return bad("header checksum");
  if (h.version != kCheckpointVersion) {
    return bad("version " + std::to_string(h.version) + " is not supported");
  }
  header->shard = h.shard;
  header->shards = h.shards;
  header->fingerprint = h.fingerprint;
  header->clock = h.clock;
  header->sequence = h.sequence;
  uint64_t all = 0;
  CheckpointBlock b;
  for (uint64_t i = 0; i < h.blocks; ++i) {
    RawBlock rb{};
    if (!in.read(reinterpret_cast<char*>(&rb), sizeof(rb))) {
      return bad("truncated in block " + std::to_string(i));
    }
    if (rb.bytes > (uint64_t{1} << 40)) return bad("block " + std::to_string(i) + " size");
    b.kind = rb.kind;
    b.table = rb.table;
    b.count = rb.count;
    b.bytes.resize(rb.bytes);
    if (!in.read(b.bytes.data(), static_cast<std::streamsize>(rb.bytes))) {
      return bad("truncated in block " + std::to_string(i));
    }
    if (Checksum64(b.bytes.data(), b.bytes.size()) != rb.checksum) {
      return bad("checksum of block " + std::to_string(i));
    }
    all = Checksum64(&rb.checksum, sizeof(rb.checksum), all);
    PARASOL_RETURN_IF_ERROR(block(b));
  }
  RawFooter f{};
  if (!in.read(reinterpret_cast<char*>(&f), sizeof(f))) return bad("truncated footer");
  if (std::memcmp(f.magic, kEnd, 8) != 0 || f.blocks != h.blocks || f.checksum != all) {
    return bad("footer");
  }
  return Status::Ok();
}

std::string CheckpointPath(const std::string& dir, uint32_t shard, uint64_t sequence) {
  char name[64];
  std::snprintf(name, sizeof(name), "/shard-%u/ckpt-%010llu.bin", shard,
                static_cast<unsigned long long>(sequence));
  return dir + name;
}

std::vector<std::string> ListCheckpoints(const std::string& dir, uint32_t shard) {
  std::vector<std::string> out;
  std::error_code ec;
  const std::string folder = dir + "/shard-" + std::to_string(shard);
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 9 &&
        name.compare(name.size() - 4, 4, ".bin") == 0) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.rbegin(), out.rend());  // zero-padded sequences: newest first
  return out;
}

void PruneCheckpoints(const std::string& dir, uint32_t shard, uint32_t keep) {
  const std::vector<std::string> all = ListCheckpoints(dir, shard);
  for (size_t i = keep; i < all.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(all[i], ec);
  }
}

}  // namespace parasol
