#include "server/checkpoint.hpp"

#include "common/fault_points.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/hash.hpp"
#include "common/huge_page_arena.hpp"

// Header-only (inlined here): nothing to link, for this library or for those that use it.
#define XXH_INLINE_ALL
#include <xxhash.h>
// XXH3's output is stable from 0.8.0 on; an earlier one would sum format 6 files differently.
static_assert(XXH_VERSION_NUMBER >= 800, "libxxhash 0.8 or later is needed");

namespace parasol {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'O', 'L', 'C', 'K', 'P', 'T'};
constexpr char kEnd[8] = {'P', 'S', 'O', 'L', 'E', 'N', 'D', '!'};

struct RawHeader {
  char magic[8];
  uint32_t version, shard, shards, flags;
  uint64_t fingerprint;
  int64_t clock;
  uint64_t sequence, blocks, checksum;
};
struct RawBlock {
  uint32_t kind, table;
  uint64_t count, bytes, checksum, header_checksum;
};
struct RawFooter {
  char magic[8];
  uint64_t blocks, checksum;
};
static_assert(sizeof(RawHeader) == kCheckpointHeaderBytes);
static_assert(sizeof(RawBlock) == kCheckpointBlockHeaderBytes);
static_assert(sizeof(RawFooter) == kCheckpointFooterBytes);

// What a payload is read and checksummed in, at a time: well inside a core's L2 cache.
constexpr uint64_t kChecksumPieceBytes = 512 << 10;

// Seeded with the block's index, so a block header copied to another place does not verify.
uint64_t BlockHeaderChecksum(const RawBlock& b, uint64_t index) {
  return Checksum64(&b, offsetof(RawBlock, header_checksum), index);
}

// Reads a file front to back, keeping the offset and the bytes left in it, so every size read
// from the file can be checked against what the file holds before anything is allocated.
class Cursor {
 public:
  Cursor(std::istream& in, uint64_t size) : in_(in), size_(size) {}
  uint64_t size() const { return size_; }
  uint64_t offset() const { return offset_; }
  uint64_t left() const { return size_ - offset_; }
  bool Read(void* out, uint64_t n) {
    if (n > left()) return false;
    if (!in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n))) return false;
    offset_ += n;
    return true;
  }

 private:
  std::istream& in_;
  const uint64_t size_;
  uint64_t offset_ = 0;
};

}  // namespace

Status CheckpointNotReadable(const Status& st) {
  std::string m = st.message();
  const std::string prefix = "cannot read ";
  if (m.rfind(prefix, 0) == 0) m.insert(prefix.size(), "checkpoint ");
  return Status(st.code(), m);
}

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
  if (n > i) std::memcpy(&tail, p + i, n - i);  // never with a null `data` (n == 0)
  return Fmix64(h ^ tail ^ (n - i));
}

uint64_t PayloadChecksum(const void* data, size_t n, uint32_t version) {
  if (version < 6) return Checksum64(data, n);
  return XXH3_64bits(n == 0 ? "" : data, n);
}

Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                           const std::vector<CheckpointBlock>& blocks, Env* env) {
  return WriteCheckpointFile(path, header, [&](const CheckpointBlockSink& sink) -> Status {
    for (const CheckpointBlock& b : blocks) PARASOL_RETURN_IF_ERROR(sink(b));
    return Status::Ok();
  }, env);
}

Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                           const CheckpointBlockProducer& produce, Env* env) {
  if (std::string problem = CheckpointSequenceProblem(header.sequence, "checkpoint '" + path + "'");
      !problem.empty()) {
    return FailedPrecondition("cannot write " + problem);
  }
  if (env == nullptr) env = Env::Real();
  FileSystem* fs = env->Files();
  const std::string tmp = path + ".tmp";
  Status st;
  {
    Result<std::unique_ptr<WritableFile>> opened = fs->Create(tmp);
    if (!opened.ok()) return opened.status();
    WritableFile& file = **opened;
    RawHeader h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kCheckpointVersion;
    h.shard = header.shard;
    h.shards = header.shards;
    h.fingerprint = header.fingerprint;
    h.clock = header.clock;
    h.sequence = header.sequence;
    h.flags = (header.final ? 1u : 0u) | (header.delta ? 2u : 0u);
    // The block count is known at the end: the header is written again then.
    st = file.Append(&h, sizeof(h));
    uint64_t all = 0, count = 0;
    if (st.ok()) {
      st = produce([&](const CheckpointBlock& b) -> Status {
        RawBlock rb{b.kind, b.table, b.count, b.bytes.size(),
                    PayloadChecksum(b.bytes.data(), b.bytes.size()), 0};
        rb.header_checksum = BlockHeaderChecksum(rb, count);
        all = Checksum64(&rb.checksum, sizeof(rb.checksum), all);
        ++count;
        PARASOL_RETURN_IF_ERROR(file.Append(&rb, sizeof(rb)));
        return file.Append(b.bytes.data(), b.bytes.size());
      });
    }
    RawFooter f{};
    std::memcpy(f.magic, kEnd, 8);
    f.blocks = count;
    f.checksum = all;
    if (st.ok()) st = file.Append(&f, sizeof(f));
    h.blocks = count;
    h.checksum = Checksum64(&h, offsetof(RawHeader, checksum));
    if (st.ok()) st = file.WriteAt(0, &h, sizeof(h));
    if (st.ok()) {
      const Fault fault = env->Hit("checkpoint.write");
      if (fault == Fault::kFail) {
        st = IoError("cannot write '" + tmp + "': injected fault (checkpoint.write)");
      } else if (fault == Fault::kSlow) {
        ::usleep(500 * 1000);  // a large table's write, in a test
      }
    }
    if (st.ok()) st = file.Sync();
  }
  if (st.ok()) (void)env->Hit("checkpoint.rename");
  if (st.ok()) st = fs->Rename(tmp, path);
  if (!st.ok()) {
    (void)fs->Remove(tmp);
    return st;
  }
  return fs->SyncDir(ParentOf(path));
}

Status ReadCheckpoint(std::istream& in, const std::string& name, CheckpointHeader* header,
                      const CheckpointBlockFn& block, const CheckpointBlockCheck& check) {
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  if (end < 0 || !in) return IoError("cannot read checkpoint '" + name + "': cannot seek in it");
  Cursor c(in, static_cast<uint64_t>(end));
  auto damaged = [&](const std::string& what, uint64_t at) {
    // A read the disk refused (EIO) is not a damaged file: the file may be whole.
    if (in.bad()) {
      return IoError("cannot read checkpoint '" + name + "': the disk refused a read at byte " +
                     std::to_string(c.offset()) + " (an I/O error; the file itself may be "
                     "whole: check the disk)");
    }
    return IoError("checkpoint '" + name + "' is damaged: " + what + " (at byte " +
                   std::to_string(at) + ")");
  };
  RawHeader h{};
  if (!c.Read(&h, sizeof(h))) return damaged("the file ends inside the header", c.size());
  if (std::memcmp(h.magic, kMagic, 8) != 0) return damaged("not a Parasol checkpoint", 0);
  if (h.checksum != Checksum64(&h, offsetof(RawHeader, checksum))) {
    return damaged("header checksum", offsetof(RawHeader, checksum));
  }
  if (h.version < kOldestCheckpointVersion || h.version > kCheckpointVersion) {
    return Status(StatusCode::kVersionMismatch,
                  "checkpoint '" + name + "' is format version " + std::to_string(h.version) +
                      "; this build reads versions " + std::to_string(kOldestCheckpointVersion) +
                      " to " + std::to_string(kCheckpointVersion) + " only (at byte " +
                      std::to_string(offsetof(RawHeader, version)) + ")");
  }
  if (std::string problem = CheckpointSequenceProblem(h.sequence, "checkpoint '" + name + "'");
      !problem.empty()) {
    return damaged(problem, offsetof(RawHeader, sequence));
  }
  header->shard = h.shard;
  header->shards = h.shards;
  header->fingerprint = h.fingerprint;
  header->clock = h.clock;
  header->sequence = h.sequence;
  header->final = (h.flags & 1u) != 0;
  header->delta = (h.flags & 2u) != 0;
  if (c.left() < sizeof(RawFooter) ||
      h.blocks > (c.left() - sizeof(RawFooter)) / sizeof(RawBlock)) {
    return damaged(
        "the header lists " + std::to_string(h.blocks) + " blocks, more than the file has room for",
        offsetof(RawHeader, blocks));
  }
  uint64_t all = 0;
  CheckpointBlock b;
  for (uint64_t i = 0; i < h.blocks; ++i) {
    const uint64_t at = c.offset();
    const std::string which = "block " + std::to_string(i);
    RawBlock rb{};
    if (!c.Read(&rb, sizeof(rb))) return damaged("the file ends inside " + which, c.size());
    if (rb.header_checksum != BlockHeaderChecksum(rb, i)) {
      return damaged(which + " header checksum", at + offsetof(RawBlock, header_checksum));
    }
    // What the payload may take: the file less the later block headers and the footer.
    const uint64_t later = (h.blocks - i - 1) * sizeof(RawBlock) + sizeof(RawFooter);
    const uint64_t room = c.left() >= later ? c.left() - later : 0;
    if (rb.bytes > room) {
      return damaged(which + " claims " + std::to_string(rb.bytes) +
                         " payload bytes; the file has " + std::to_string(room) + " left for it",
                     at + offsetof(RawBlock, bytes));
    }
    auto refused = [&](const Status& st) {
      return Status(st.code(), "checkpoint '" + name + "' " + which + " (kind " +
                                   std::to_string(rb.kind) + ", table " + std::to_string(rb.table) +
                                   ", at byte " + std::to_string(at) + "): " + st.message());
    };
    if (check) {
      const Status st = check(CheckpointBlockHeader{rb.kind, rb.table, rb.count, rb.bytes});
      if (!st.ok()) return refused(st);
    }
    b.kind = rb.kind;
    b.table = rb.table;
    b.count = rb.count;
    if (b.bytes.capacity() < rb.bytes) ReserveInHugePages(b.bytes, rb.bytes);
    b.bytes.resize(rb.bytes);
    uint64_t payload_checksum;
    if (h.version >= 6) {
      // Checksummed piece by piece as it is read, each piece still in cache (a block is up
      // to 64 MiB); the same sum as PayloadChecksum() of the whole.
      XXH3_state_t state;
      XXH3_64bits_reset(&state);
      for (uint64_t done = 0; done < rb.bytes;) {
        const uint64_t piece = std::min<uint64_t>(rb.bytes - done, kChecksumPieceBytes);
        if (!c.Read(b.bytes.data() + done, piece)) {
          return damaged("the file ends inside " + which, c.size());
        }
        XXH3_64bits_update(&state, b.bytes.data() + done, piece);
        done += piece;
      }
      payload_checksum = XXH3_64bits_digest(&state);
    } else {
      if (!c.Read(b.bytes.data(), rb.bytes))
        return damaged("the file ends inside " + which, c.size());
      payload_checksum = PayloadChecksum(b.bytes.data(), b.bytes.size(), h.version);
    }
    if (payload_checksum != rb.checksum) {
      return damaged(which + " payload checksum", at + sizeof(RawBlock));
    }
    all = Checksum64(&rb.checksum, sizeof(rb.checksum), all);
    const Status st = block(b);
    if (!st.ok()) return refused(st);
  }
  const uint64_t at = c.offset();
  RawFooter f{};
  if (!c.Read(&f, sizeof(f))) return damaged("the file ends inside the footer", c.size());
  if (std::memcmp(f.magic, kEnd, 8) != 0) return damaged("footer magic", at);
  if (f.blocks != h.blocks) return damaged("footer block count", at + offsetof(RawFooter, blocks));
  if (f.checksum != all) return damaged("footer checksum", at + offsetof(RawFooter, checksum));
  if (c.left() != 0) {
    return damaged(std::to_string(c.left()) + " bytes after the footer", c.offset());
  }
  return Status::Ok();
}

Status ReadCheckpointFile(const std::string& path, CheckpointHeader* header,
                          const CheckpointBlockFn& block, const CheckpointBlockCheck& check,
                          FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  Result<std::unique_ptr<std::istream>> in = fs->Open(path);
  if (!in.ok()) return CheckpointNotReadable(in.status());
  return ReadCheckpoint(**in, path, header, block, check);
}

std::string CheckpointSequenceProblem(uint64_t sequence, const std::string& what) {
  if (sequence <= kMaxCheckpointSequence) return "";
  return what + " has sequence " + std::to_string(sequence) + ", beyond the largest a checkpoint "
         "may have (" + std::to_string(kMaxCheckpointSequence) + ": 10 digits in its file name)";
}

Result<uint64_t> CheckpointSequenceOfName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  const size_t digits = name.size() >= 9 ? name.size() - 9 : 0;
  if (name.rfind("ckpt-", 0) != 0 || name.size() <= 9 ||
      name.compare(name.size() - 4, 4, ".bin") != 0 ||
      name.find_first_not_of("0123456789", 5) != 5 + digits) {
    return InvalidArgument("'" + path + "' is not named ckpt-SEQUENCE.bin");
  }
  // More digits than the largest sequence has: beyond it without converting (no overflow).
  if (digits > 10) {
    return InvalidArgument("checkpoint file '" + path + "' names a sequence of " +
                           std::to_string(digits) + " digits, beyond the largest a checkpoint "
                           "may have (" + std::to_string(kMaxCheckpointSequence) + ")");
  }
  return std::stoull(name.substr(5, digits));
}

std::string CheckpointPath(const std::string& dir, uint32_t shard, uint64_t sequence) {
  char name[64];
  std::snprintf(name, sizeof(name), "/shard-%u/ckpt-%010llu.bin", shard,
                static_cast<unsigned long long>(sequence));
  return dir + name;
}

std::vector<std::string> ListCheckpoints(const std::string& dir, uint32_t shard,
                                         FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  std::vector<std::string> out;
  const std::string folder = dir + "/shard-" + std::to_string(shard);
  for (const std::string& name : fs->List(folder)) {
    // ckpt-DIGITS.bin only (a name with too many digits is listed, for Restore to refuse).
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 9 &&
        name.compare(name.size() - 4, 4, ".bin") == 0 &&
        name.find_first_not_of("0123456789", 5) == name.size() - 4) {
      out.push_back(folder + "/" + name);
    }
  }
  std::sort(out.rbegin(), out.rend());  // zero-padded sequences: newest first
  return out;
}

namespace {

// The sequence in a checkpoint file's name (0: not one).
uint64_t SequenceOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  if (name.rfind("ckpt-", 0) != 0) return 0;
  return std::strtoull(name.c_str() + 5, nullptr, 10);
}

}  // namespace

Result<CheckpointHeader> ReadCheckpointHeader(const std::string& path, FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  Result<std::unique_ptr<std::istream>> opened = fs->Open(path);
  if (!opened.ok()) return CheckpointNotReadable(opened.status());
  std::istream& in = **opened;
  RawHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h))) {
    return IoError("checkpoint '" + path + "' is damaged: the file ends inside the header");
  }
  if (std::memcmp(h.magic, kMagic, 8) != 0 ||
      h.checksum != Checksum64(&h, offsetof(RawHeader, checksum))) {
    return IoError("checkpoint '" + path + "' is damaged: its header does not verify");
  }
  if (h.version < kOldestCheckpointVersion || h.version > kCheckpointVersion) {
    return Status(StatusCode::kVersionMismatch,
                  "checkpoint '" + path + "' is format version " + std::to_string(h.version));
  }
  if (std::string problem = CheckpointSequenceProblem(h.sequence, "checkpoint '" + path + "'");
      !problem.empty()) {
    return IoError(problem);
  }
  CheckpointHeader out;
  out.shard = h.shard;
  out.shards = h.shards;
  out.fingerprint = h.fingerprint;
  out.clock = h.clock;
  out.sequence = h.sequence;
  out.final = (h.flags & 1u) != 0;
  out.delta = (h.flags & 2u) != 0;
  return out;
}

Result<std::vector<std::string>> CheckpointChain(const std::string& dir, uint32_t shard,
                                                 uint64_t sequence, FileSystem* fs) {
  std::vector<std::string> chain;
  for (uint64_t s = sequence; s > 0; --s) {
    const std::string path = CheckpointPath(dir, shard, s);
    Result<CheckpointHeader> h = ReadCheckpointHeader(path, fs);
    if (!h.ok()) {
      return Status(h.status().code(),
                    (s == sequence ? std::string() : "checkpoint " + std::to_string(sequence) +
                                                         " builds on " + std::to_string(s) + ": ") +
                        h.status().message());
    }
    if (h->sequence != s) {
      return IoError("checkpoint '" + path + "' says it is sequence " +
                     std::to_string(h->sequence));
    }
    chain.push_back(path);
    if (!h->delta) {
      std::reverse(chain.begin(), chain.end());
      return chain;
    }
  }
  return NotFound("checkpoint " + std::to_string(sequence) + " of shard " +
                  std::to_string(shard) + " is a delta with no full checkpoint before it");
}

void PruneCheckpoints(const std::string& dir, uint32_t shard, uint32_t keep, FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  const std::vector<std::string> all = ListCheckpoints(dir, shard, fs);
  if (all.size() <= keep || keep == 0) return;
  // The oldest kept checkpoint, and the full one its chain starts from: nothing from there on
  // goes. A chain that cannot be read now prunes nothing (its base may be what a newer delta
  // builds on); the next checkpoint tries again.
  uint64_t first_kept = SequenceOf(all[keep - 1]);
  Result<std::vector<std::string>> chain = CheckpointChain(dir, shard, first_kept, fs);
  if (!chain.ok()) return;
  first_kept = SequenceOf(chain->front());
  for (const std::string& path : all) {
    if (SequenceOf(path) >= first_kept) continue;
    (void)fs->Remove(path);
  }
}

namespace {

std::string RollbackMarkPath(const std::string& dir, uint32_t shard) {
  return dir + "/shard-" + std::to_string(shard) + "/rollback";
}

std::string NamedClocksPath(const std::string& dir, uint32_t shard) {
  return dir + "/shard-" + std::to_string(shard) + "/named";
}

// The most entries the file may hold: every rank of the largest job and every change of its
// shard count fit far below it.
constexpr uint64_t kMaxNamedEntries = 1 << 20;

// A small file a shard keeps beside its checkpoints (the rollback mark, the named clocks): its
// first line (at most 200 characters) and the stream after it; none when there is no file.
struct MarkFile {
  std::unique_ptr<std::istream> in;
  std::string line;
};
Result<std::optional<MarkFile>> OpenMarkFile(FileSystem* fs, const std::string& path,
                                             const std::string& what) {
  if (!fs->Exists(path)) return std::optional<MarkFile>();
  Result<std::unique_ptr<std::istream>> opened = fs->Open(path);
  MarkFile f;
  if (!opened.ok() || !std::getline(**opened, f.line) || f.line.size() > 200) {
    return IoError(what + " '" + path + "' cannot be read");
  }
  f.in = std::move(*opened);
  return std::optional<MarkFile>(std::move(f));
}

}  // namespace

Status WriteRollbackMark(const std::string& dir, uint32_t shard, const RollbackMark& mark,
                         FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  const std::string text = "parasol-rollback 1 " + std::to_string(mark.generation) + " " +
                           std::to_string(mark.clock) + " " + std::to_string(mark.sequence) +
                           " " + std::to_string(mark.first_new) + "\n";
  return WriteFileDurably(fs, RollbackMarkPath(dir, shard), text);
}

Result<std::optional<RollbackMark>> ReadRollbackMark(const std::string& dir, uint32_t shard,
                                                    FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  const std::string path = RollbackMarkPath(dir, shard);
  Result<std::optional<MarkFile>> opened = OpenMarkFile(fs, path, "rollback mark");
  if (!opened.ok()) return opened.status();
  if (!opened->has_value()) return std::optional<RollbackMark>();
  const std::string& line = (*opened)->line;
  std::istringstream fields(line);
  std::string magic, extra;
  int version = 0;
  RollbackMark m;
  if (!(fields >> magic >> version >> m.generation >> m.clock >> m.sequence >> m.first_new) ||
      (fields >> extra) || magic != "parasol-rollback" || version != 1 || m.generation == 0 ||
      m.clock < 0 || m.first_new <= m.sequence) {
    return IoError("rollback mark '" + path + "' is damaged: '" + line +
                   "' is not 'parasol-rollback 1 GENERATION CLOCK SEQUENCE FIRST_NEW'");
  }
  return std::optional<RollbackMark>(m);
}

Status WriteNamedClocks(const std::string& dir, uint32_t shard, uint64_t fingerprint,
                        const std::vector<MemberEntry>& entries, FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Real();
  std::string body;
  for (const MemberEntry& e : entries) {
    body += std::to_string(e.worker) + " " + std::to_string(e.join) + " " +
            std::to_string(e.leave) + "\n";
  }
  const std::string text = "parasol-named 1 " + std::to_string(fingerprint) + " " +
                           std::to_string(entries.size()) + " " +
                           std::to_string(XXH64(body.data(), body.size(), 0)) + "\n" + body;
  return WriteFileDurably(fs, NamedClocksPath(dir, shard), text);
}

Result<std::optional<std::vector<MemberEntry>>> ReadNamedClocks(const std::string& dir,
                                                                uint32_t shard,
                                                                uint64_t fingerprint,
                                                                FileSystem* fs) {
  using Named = std::optional<std::vector<MemberEntry>>;
  if (fs == nullptr) fs = FileSystem::Real();
  const std::string path = NamedClocksPath(dir, shard);
  Result<std::optional<MarkFile>> opened = OpenMarkFile(fs, path, "named clocks");
  if (!opened.ok()) return opened.status();
  if (!opened->has_value()) return Named();
  std::istream& in = *(*opened)->in;
  std::string line = (*opened)->line;
  std::istringstream fields(line);
  std::string magic, extra;
  int version = 0;
  uint64_t written_for = 0, count = 0, sum = 0;
  if (!(fields >> magic >> version >> written_for >> count >> sum) || (fields >> extra) ||
      magic != "parasol-named" || version != 1 || count > kMaxNamedEntries) {
    return IoError("named clocks '" + path + "' are damaged: '" + line.substr(0, 80) +
                   "' is not 'parasol-named 1 FINGERPRINT COUNT SUM'");
  }
  if (written_for != fingerprint) {
    return FailedPrecondition("named clocks '" + path + "' belong to a job of another manifest "
                              "(fingerprint " + std::to_string(written_for) + "); remove the "
                              "folder's files of that job, or start with its manifest");
  }
  std::vector<MemberEntry> entries;
  std::string body;
  for (uint64_t i = 0; i < count; ++i) {
    MemberEntry e;
    int64_t worker = -1;
    if (!std::getline(in, line) || line.size() > 80) {
      return IoError("named clocks '" + path + "' are damaged: " + std::to_string(count) +
                     " entries stated, " + std::to_string(i) + " found");
    }
    std::istringstream entry(line);
    if (!(entry >> worker >> e.join >> e.leave) || (entry >> extra) || worker < 0 ||
        worker > UINT32_MAX) {
      return IoError("named clocks '" + path + "' are damaged: entry " + std::to_string(i) +
                     " '" + line.substr(0, 40) + "' is not 'WORKER JOIN LEAVE'");
    }
    e.worker = static_cast<uint32_t>(worker);
    body += line + "\n";
    entries.push_back(e);
  }
  if (std::getline(in, line) || XXH64(body.data(), body.size(), 0) != sum) {
    return IoError("named clocks '" + path + "' are damaged: their sum does not match (or "
                   "lines follow the last entry)");
  }
  return Named(std::move(entries));
}

}  // namespace parasol
