// The file systems a shard keeps its checkpoints in (common/file_system.hpp): the OS's, and the
// simulation's (tests/sim/sim_file_system.hpp), whose host crashes lose what was not synced.
#include "common/file_system.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <random>
#include <sstream>

#include "server/checkpoint.hpp"
#include "tests/sim/sim_file_system.hpp"

namespace parasol {
namespace {

using sim::SimFileSystem;

std::string Read(FileSystem* fs, const std::string& path) {
  Result<std::unique_ptr<std::istream>> in = fs->Open(path);
  if (!in.ok()) return "<" + in.status().ToString() + ">";
  return std::string(std::istreambuf_iterator<char>(**in), std::istreambuf_iterator<char>());
}

void Write(FileSystem* fs, const std::string& path, const std::string& text, bool sync) {
  Result<std::unique_ptr<WritableFile>> f = fs->Create(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->Append(text.data(), text.size()).ok());
  if (sync) { ASSERT_TRUE((*f)->Sync().ok()); }
}

class FileSystemTest : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{7};
  SimFileSystem sim_{[this] { return rng_(); }};
};

TEST_F(FileSystemTest, TheOsFilesDoWhatTheSimulatedOnesDo) {
  char name[] = "/tmp/parasol-fs-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  const std::string dir = std::string(name) + "/a/b";
  for (FileSystem* fs : {FileSystem::Real(), static_cast<FileSystem*>(&sim_)}) {
    SCOPED_TRACE(fs == FileSystem::Real() ? "the OS's" : "the simulation's");
    Write(fs, dir + "/x", "hello", true);  // its folders made first
    {
      Result<std::unique_ptr<WritableFile>> f = fs->Create(dir + "/y");
      ASSERT_TRUE(f.ok());
      ASSERT_TRUE((*f)->Append("abcdef", 6).ok());
      ASSERT_TRUE((*f)->WriteAt(1, "XY", 2).ok());
    }
    EXPECT_EQ(Read(fs, dir + "/y"), "aXYdef");
    ASSERT_TRUE(fs->Rename(dir + "/y", dir + "/z").ok());
    EXPECT_FALSE(fs->Exists(dir + "/y"));
    EXPECT_EQ(Read(fs, dir + "/z"), "aXYdef");
    std::vector<std::string> names = fs->List(dir);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"x", "z"}));
    EXPECT_TRUE(fs->List(dir + "/none").empty());
    EXPECT_TRUE(fs->Remove(dir + "/z").ok());
    EXPECT_TRUE(fs->Remove(dir + "/z").ok());  // not there: no error
    EXPECT_FALSE(fs->Rename(dir + "/z", dir + "/w").ok());
    Result<std::unique_ptr<std::istream>> none = fs->Open(dir + "/z");
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
    EXPECT_NE(none.status().message().find(dir + "/z"), std::string::npos);
    ASSERT_TRUE(WriteFileDurably(fs, dir + "/mark", "started\n").ok());
    EXPECT_EQ(Read(fs, dir + "/mark"), "started\n");
    EXPECT_FALSE(fs->Exists(dir + "/mark.tmp"));
    EXPECT_TRUE(fs->SyncDir(dir).ok());
  }
  std::filesystem::remove_all(name);
}

// The OS's reader (OpenToReadOnce): reads of every size (single characters, pieces under and
// over its direct-read size, past the end) and seeks (from the start, the end, the reader's
// place; tellg between) give the file's bytes, with its pages given back behind the reader and
// without; a file past the threshold gives back every 64 MiB it has read.
TEST_F(FileSystemTest, TheOsReaderReadsAndSeeksAsAFileStreamDoes) {
  char name[] = "/tmp/parasol-fs-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  const std::string path = std::string(name) + "/f";
  std::string bytes(70u << 20, '\0');  // past one 64 MiB drop
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t v = rng_();
    std::memcpy(bytes.data() + i, &v, std::min<size_t>(8, bytes.size() - i));
  }
  Write(FileSystem::Real(), path, bytes, true);
  size_t reads = 0, seeks = 0, past_end = 0;
  for (uint64_t drop_above : {uint64_t{0}, uint64_t{1} << 40}) {
    Result<std::unique_ptr<std::istream>> opened = OpenToReadOnce(path, drop_above);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    std::istream& in = **opened;
    std::mt19937_64 rng(drop_above + 3);
    uint64_t at = 0;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 8);
      if (op == 0) {
        // A seek, then where it says it is.
        const int dir = static_cast<int>(rng() % 3);
        const uint64_t target = rng() % (bytes.size() + 1);
        if (dir == 0) in.seekg(static_cast<std::streamoff>(target), std::ios::beg);
        if (dir == 1) in.seekg(static_cast<std::streamoff>(target) - static_cast<std::streamoff>(at), std::ios::cur);
        if (dir == 2) in.seekg(static_cast<std::streamoff>(target) - static_cast<std::streamoff>(bytes.size()), std::ios::end);
        ASSERT_TRUE(in.good()) << step;
        at = target;
        ASSERT_EQ(static_cast<uint64_t>(in.tellg()), at) << step;
        ++seeks;
        continue;
      }
      const size_t n = op == 1 ? 1 : op < 4 ? rng() % 4096 : op < 7 ? rng() % (2u << 20) : 9u << 20;
      std::string got(n, '\0');
      in.read(got.data(), static_cast<std::streamsize>(n));
      const uint64_t expect = std::min<uint64_t>(n, bytes.size() - at);
      ASSERT_EQ(static_cast<uint64_t>(in.gcount()), expect) << step;
      ASSERT_EQ(got.substr(0, expect), bytes.substr(at, expect)) << step << " at " << at;
      at += expect;
      ++reads;
      if (expect < n) {
        ASSERT_TRUE(in.eof());
        ++past_end;
        in.clear();
        in.seekg(0, std::ios::beg);
        at = 0;
      }
    }
    // Front to back in one pass, as a restore reads.
    in.clear();
    in.seekg(0, std::ios::beg);
    std::string whole(bytes.size(), '\0');
    in.read(whole.data(), static_cast<std::streamsize>(whole.size()));
    ASSERT_EQ(static_cast<size_t>(in.gcount()), bytes.size());
    ASSERT_TRUE(whole == bytes);
    struct statfs where {};
    const bool tmpfs = ::statfs(name, &where) == 0 && where.f_type == TMPFS_MAGIC;
    if (drop_above == 0 && !tmpfs) {  // tmpfs's pages are the file: never given back
      // Its first 64 MiB are out of the page cache (they were in it: written just now).
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      const size_t span = 64u << 20;
      void* map = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, 0);
      ASSERT_NE(map, MAP_FAILED);
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> resident(span / page);
      ASSERT_EQ(::mincore(map, span, resident.data()), 0);
      size_t in_cache = 0;
      for (unsigned char r : resident) in_cache += r & 1;
      ::munmap(map, span);
      ::close(fd);
      EXPECT_LT(in_cache, resident.size() / 10) << in_cache << " of " << resident.size();
    }
  }
  EXPECT_GT(reads, 500u);
  EXPECT_GT(seeks, 50u);
  EXPECT_GT(past_end, 0u);
  std::filesystem::remove_all(name);
}

TEST_F(FileSystemTest, AHostCrashKeepsOnlyWhatWasSyncedAndNamesWhoseFolderWasSynced) {
  const std::string d = "/h/shard-0";
  Write(&sim_, d + "/synced", "durable", true);
  ASSERT_TRUE(sim_.SyncDir(d).ok());
  Write(&sim_, d + "/unsynced", "lost", false);
  ASSERT_TRUE(sim_.SyncDir(d).ok());  // its name is durable, its bytes are not
  Write(&sim_, d + "/unnamed", "synced, but its name never was", true);
  Write(&sim_, "/h/shard-1/other", "another host's", false);
  ASSERT_TRUE(sim_.Rename(d + "/synced", d + "/renamed").ok());  // not synced: undone
  sim_.Crash(d + "/");
  EXPECT_EQ(Read(&sim_, d + "/synced"), "durable");
  EXPECT_FALSE(sim_.Exists(d + "/renamed"));
  EXPECT_FALSE(sim_.Exists(d + "/unnamed"));
  ASSERT_TRUE(sim_.Exists(d + "/unsynced"));
  const std::string left = Read(&sim_, d + "/unsynced");
  EXPECT_TRUE(left.empty() || std::string("lost").rfind(left, 0) == 0) << left;  // torn or none
  EXPECT_EQ(Read(&sim_, "/h/shard-1/other"), "another host's");  // its host did not crash
  EXPECT_EQ(sim_.lost_names(), 2u);  // "renamed" and "unnamed"
}

TEST_F(FileSystemTest, AFrozenHostChangesNothingUntilItsKillOrCrash) {
  const std::string d = "/h/shard-0";
  Result<std::unique_ptr<WritableFile>> f = sim_.Create(d + "/x.tmp");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append("ab", 2).ok());
  sim_.Freeze(d + "/");
  EXPECT_FALSE((*f)->Append("cd", 2).ok());
  EXPECT_FALSE((*f)->Sync().ok());
  EXPECT_FALSE(sim_.Rename(d + "/x.tmp", d + "/x").ok());
  EXPECT_FALSE(sim_.Remove(d + "/x.tmp").ok());
  EXPECT_FALSE(sim_.SyncDir(d).ok());
  EXPECT_FALSE(sim_.Create(d + "/y").ok());
  EXPECT_EQ(Read(&sim_, d + "/x.tmp"), "ab");  // what it wrote before stays readable
  EXPECT_TRUE(sim_.Create("/h/shard-1/y").ok());  // other hosts go on
  sim_.Thaw(d + "/");  // a kill of the process: the host keeps its page cache
  EXPECT_EQ(Read(&sim_, d + "/x.tmp"), "ab");
  EXPECT_TRUE(sim_.Remove(d + "/x.tmp").ok());
}

// A checkpoint is durable once WriteCheckpointFile returns; one whose host crashed between its
// write and its folder's sync is not there at all (never a damaged file under its name).
TEST_F(FileSystemTest, ACheckpointSurvivesACrashOnceWrittenAndIsAbsentIfTheHostDiedBefore) {
  struct Points final : Env {
    SimFileSystem* fs;
    std::string freeze_at;
    explicit Points(SimFileSystem* f) : fs(f) {}
    Clock::time_point Now() override { return {}; }
    uint64_t Random64() override { return 4; }
    Result<std::unique_ptr<ShardLinks>> LinkShards(const Manifest&, uint32_t,
                                                   const CurveKeyPair*,
                                                   const std::vector<std::string>&) override {
      return FailedPrecondition("none");
    }
    FileSystem* Files() override { return fs; }
    Fault Hit(std::string_view point) override {
      if (point == freeze_at) fs->Freeze("/c/shard-0/");
      return Fault::kNone;
    }
  } env(&sim_);
  CheckpointHeader h;
  h.sequence = 1;
  CheckpointBlock b;
  b.kind = 3;
  b.count = 2;
  b.bytes.assign(16, 'c');
  const std::string one = CheckpointPath("/c", 0, 1);
  ASSERT_TRUE(WriteCheckpointFile(one, h, {b}, &env).ok());
  for (const char* point : {"checkpoint.write", "checkpoint.rename"}) {
    SCOPED_TRACE(point);
    env.freeze_at = point;
    h.sequence = 2;
    const Status st = WriteCheckpointFile(CheckpointPath("/c", 0, 2), h, {b}, &env);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("host is down"), std::string::npos) << st.ToString();
    sim_.Crash("/c/shard-0/");
    EXPECT_EQ(ListCheckpoints("/c", 0, &sim_), std::vector<std::string>{one});
    Result<CheckpointHeader> read = ReadCheckpointHeader(one, &sim_);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->sequence, 1u);
    CheckpointHeader whole;
    int blocks = 0;
    EXPECT_TRUE(ReadCheckpointFile(one, &whole, [&](CheckpointBlock&) {
                  ++blocks;
                  return Status::Ok();
                }, {}, &sim_).ok());
    EXPECT_EQ(blocks, 1);
  }
  // A rollback mark is written the same way.
  RollbackMark mark;
  mark.generation = 1;
  mark.clock = 4;
  mark.sequence = 1;
  mark.first_new = 3;
  ASSERT_TRUE(WriteRollbackMark("/c", 0, mark, &sim_).ok());
  sim_.Crash("/c/shard-0/");
  Result<std::optional<RollbackMark>> again = ReadRollbackMark("/c", 0, &sim_);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->first_new, 3u);
}

// A read the OS refuses is not the end of the file: the OS's reader sets badbit, and a
// checkpoint read through it says the disk refused a read, not that the file is damaged (a
// folder opened as a file: read() fails with EISDIR, as a failing disk's would with EIO).
TEST_F(FileSystemTest, AReadTheOsRefusesIsNotTheEndOfTheFile) {
  char name[] = "/tmp/parasol-fs-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  Result<std::unique_ptr<std::istream>> opened = OpenToReadOnce(name, UINT64_MAX);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  char buf[16];
  EXPECT_FALSE((*opened)->read(buf, sizeof(buf)));
  EXPECT_TRUE((*opened)->bad()) << "a refused read looked like the end of the file";
  std::filesystem::remove(name);
  // A 4 KiB file whose every read fails, against one cut short.
  class RefusingBuf final : public std::streambuf {
   protected:
    int_type underflow() override { throw std::ios_base::failure("read: Input/output error"); }
    pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
      at_ = dir == std::ios_base::beg ? off : dir == std::ios_base::end ? 4096 + off : at_ + off;
      return pos_type(at_);
    }
    pos_type seekpos(pos_type p, std::ios_base::openmode m) override {
      return seekoff(off_type(p), std::ios_base::beg, m);
    }

   private:
    off_type at_ = 0;
  };
  RefusingBuf refusing;
  std::istream failing(&refusing);
  std::istringstream cut(std::string("PSOLCKPT", 8));
  CheckpointHeader h;
  auto read = [&](std::istream& in) {
    return ReadCheckpoint(in, "c", &h, [](CheckpointBlock&) { return Status::Ok(); }, {});
  };
  const Status refused = read(failing);
  EXPECT_NE(refused.message().find("the disk refused a read at byte 0"), std::string::npos)
      << refused.ToString();
  const Status short_file = read(cut);
  EXPECT_NE(short_file.message().find("is damaged"), std::string::npos) << short_file.ToString();
}

// Shard 0's named clocks (server/checkpoint.hpp): kept across a crash once written, and a file
// that is damaged, cut short or of another manifest is an error naming it, never a membership.
TEST_F(FileSystemTest, NamedClocksSurviveACrashAndADamagedFileIsAnErrorNamingIt) {
  Result<std::optional<std::vector<MemberEntry>>> none = ReadNamedClocks("/c", 0, 77, &sim_);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  const std::vector<MemberEntry> named = {{0, 0, -1}, {1, 0, 6}, {2, 4, -1}};
  ASSERT_TRUE(WriteNamedClocks("/c", 0, 77, named, &sim_).ok());
  sim_.Crash("/c/shard-0/");
  Result<std::optional<std::vector<MemberEntry>>> again = ReadNamedClocks("/c", 0, 77, &sim_);
  ASSERT_TRUE(again.ok() && again->has_value()) << again.status().ToString();
  EXPECT_EQ(**again, named);
  const std::string path = "/c/shard-0/named";
  const std::string good = Read(&sim_, path);
  ASSERT_NE(good.find("\n1 0 6\n"), std::string::npos) << good;
  std::string changed = good;
  changed[changed.find("\n1 0 6\n") + 5] = '7';  // worker 1 leaves at 7: the sum says no
  std::string cut = good.substr(0, good.size() - 3);
  for (const std::string& text : {changed, cut, std::string("parasol-named 1 77\n"),
                                  std::string("garbage\n"), good + "3 5 -1\n"}) {
    SCOPED_TRACE(text);
    Write(&sim_, path, text, true);
    Result<std::optional<std::vector<MemberEntry>>> read = ReadNamedClocks("/c", 0, 77, &sim_);
    ASSERT_FALSE(read.ok());
    EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status().ToString();
    EXPECT_NE(read.status().message().find("damaged"), std::string::npos)
        << read.status().ToString();
  }
  Write(&sim_, path, good, true);
  Result<std::optional<std::vector<MemberEntry>>> other = ReadNamedClocks("/c", 0, 78, &sim_);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("another manifest"), std::string::npos)
      << other.status().ToString();
}

}  // namespace
}  // namespace parasol
