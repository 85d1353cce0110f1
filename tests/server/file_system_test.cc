// The file systems a shard keeps its checkpoints in (common/file_system.hpp): the OS's, and the
// simulation's (tests/sim/sim_file_system.hpp), whose host crashes lose what was not synced.
#include "common/file_system.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <random>

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
  if (sync) ASSERT_TRUE((*f)->Sync().ok());
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

}  // namespace
}  // namespace parasol
