// Checkpoint files of one shard: its tables with their optimizer state, and its clocks.
//
// Layout (little-endian):
//   header   magic "PSOLCKPT", u32 version, u32 shard, u32 shards, u32 flags (bit 0: final,
//            bit 1: a delta, holding only what changed since the checkpoint before it),
//            u64 manifest fingerprint, i64 clock, u64 sequence, u64 blocks, u64 checksum
//   blocks   each: u32 kind, u32 table, u64 count, u64 bytes, u64 payload checksum,
//            u64 header checksum (of the 32 bytes before it, seeded with the block's index),
//            then `bytes` bytes of payload
//            kind 1 sparse rows: count x (u64 key, u32 last clock, row floats x f32)
//            kind 2 dense slice: count elements x (1 + state arrays) f32, value array first
//            kind 3 clocks:      count workers x i64 clock
//            kind 4 push record: PushRecord::Save()
//            kind 5 pending sparse sums (BSP): i64 clock, then count x (u64 key, dim x f32)
//            kind 6 pending dense sums (BSP):  i64 clock, then count elements x f32 (the slice)
//            Kinds 5 and 6 come after the clocks, at most one per (clock, table).
//   footer   magic "PSOLEND!", u64 blocks, u64 checksum of the payload checksums
// A file is written to NAME.tmp, fsynced and renamed, then its folder is fsynced. A reader
// checks every checksum, and every size against the bytes the file has left before it
// allocates anything, and refuses a damaged or truncated file naming the file, what is wrong
// and the byte offset where it is.
//
// Version 2 added the block header checksum: in version 1 a flipped bit in a block's size or
// table id went unnoticed. Version 3 added kinds 5 and 6: under BSP the pushes summed for a
// clock not yet applied are in the push record, and a version 2 file without their sums lost
// them (their resends after a restart were answered as duplicates). Files of other versions are
// refused (kVersionMismatch). Version 4 changed the push record: pushes are identified by
// (worker, clock, index within the clock), so a restarted worker's recomputed step is
// recognised (server/push_record.hpp). Version 5 added deltas (flag bit 1, and the block kinds
// ShardState names for them); a version 4 file reads as a full checkpoint of version 5.
// Version 6 checksums each block's payload with XXH3-64 (libxxhash) instead of Checksum64: a
// restore spent a fifth of its time in Checksum64's serial multiply chain (3 GB/s here). Files
// of versions 4 and 5 are read with Checksum64 as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <istream>
#include <optional>
#include <string>
#include <vector>

#include "common/env.hpp"
#include "common/file_system.hpp"
#include "common/membership.hpp"
#include "common/status.hpp"

namespace parasol {

inline constexpr uint32_t kCheckpointVersion = 6;
inline constexpr uint32_t kOldestCheckpointVersion = 4;  // the oldest this build reads
// Sizes of the file header and of a block header, in bytes (see the layout above).
inline constexpr size_t kCheckpointHeaderBytes = 64;
inline constexpr size_t kCheckpointBlockHeaderBytes = 40;
inline constexpr size_t kCheckpointFooterBytes = 24;

struct CheckpointBlock {
  uint32_t kind = 0;
  uint32_t table = 0;
  uint64_t count = 0;
  std::vector<char> bytes;
};

// A block's header as read from a file (its checksum verified), before its payload is read.
struct CheckpointBlockHeader {
  uint32_t kind = 0;
  uint32_t table = 0;
  uint64_t count = 0;
  uint64_t bytes = 0;  // payload size, at most what the file has left
};

// The largest checkpoint sequence: file names hold it in 10 zero-padded digits
// (ckpt-0000000042.bin), which sort in sequence order only while they stay 10 digits. A
// header or file name beyond it is refused, and so is writing one (rather than wrapping or
// sorting an 11-digit name before the older ones).
inline constexpr uint64_t kMaxCheckpointSequence = 9999999999ull;
// Why `sequence` cannot be a checkpoint's (empty: it can), naming `what` holds it.
std::string CheckpointSequenceProblem(uint64_t sequence, const std::string& what);
// The sequence in a checkpoint file's name (dir/shard-N/ckpt-SEQUENCE.bin), or an error naming
// the file when it is not one or is beyond kMaxCheckpointSequence.
Result<uint64_t> CheckpointSequenceOfName(const std::string& path);

struct CheckpointHeader {
  uint32_t shard = 0;
  uint32_t shards = 0;
  uint64_t fingerprint = 0;
  int64_t clock = 0;
  uint64_t sequence = 0;
  // Written as the shard stopped cleanly: nothing was applied after it, so no worker has
  // anything to replay to a shard that starts from it.
  bool final = false;
  // Holds only what changed since checkpoint sequence - 1 (which it is applied onto): the rows
  // updated or removed since, and the whole of everything else.
  bool delta = false;
};

// Refuses a block before its payload is read (say, a size that does not match its table).
using CheckpointBlockCheck = std::function<Status(const CheckpointBlockHeader&)>;
// The block may be changed (its bytes taken, say): the reader refills it for the next one.
using CheckpointBlockFn = std::function<Status(CheckpointBlock&)>;

// FileSystem::Open's error ("cannot read 'P': why") as a checkpoint's ("cannot read checkpoint
// 'P': why").
Status CheckpointNotReadable(const Status& st);

// 64-bit checksum of `n` bytes (word-wise multiply-mix; detects flipped bits and truncation).
// What headers, the footer and (before version 6) payloads are checked with.
uint64_t Checksum64(const void* data, size_t n, uint64_t seed = 0);
// The checksum of a block's payload in a file of format `version`: XXH3-64 from version 6,
// Checksum64 before.
uint64_t PayloadChecksum(const void* data, size_t n, uint32_t version = kCheckpointVersion);

// The functions below take the files from `env` or `fs` (Env::Real() and FileSystem::Real()
// when null): a simulated shard's are in memory (common/file_system.hpp).

// Writes `blocks` under `path` atomically (tmp + fsync + rename + fsync of the folder). The
// fault points checkpoint.write and checkpoint.rename are `env`'s.
Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                           const std::vector<CheckpointBlock>& blocks, Env* env = nullptr);

// The same, streaming: `produce` hands each block to the sink in order, which writes it at
// once, so the file never has to fit in memory (the header's block count and checksum are
// written last). An error of the sink or of `produce` stops the write; nothing is renamed.
using CheckpointBlockSink = std::function<Status(const CheckpointBlock&)>;
using CheckpointBlockProducer = std::function<Status(const CheckpointBlockSink&)>;
Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                           const CheckpointBlockProducer& produce, Env* env = nullptr);

// Reads and verifies a whole checkpoint from `in` (`name` says which in errors). Sets *header
// once the file header is verified, before the first block. For each block in order, calls
// `check` (when given) with its verified header, then reads its payload and calls `block`. An
// error of either stops the read; it comes back naming the file, the block and its offset.
// Never allocates more than the file has bytes left.
Status ReadCheckpoint(std::istream& in, const std::string& name, CheckpointHeader* header,
                      const CheckpointBlockFn& block, const CheckpointBlockCheck& check = {});
// The same for the file at `path`.
Status ReadCheckpointFile(const std::string& path, CheckpointHeader* header,
                          const CheckpointBlockFn& block, const CheckpointBlockCheck& check = {},
                          FileSystem* fs = nullptr);

// The checkpoints of shard `shard` under `dir` (dir/shard-N/ckpt-SEQUENCE.bin), newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir, uint32_t shard,
                                         FileSystem* fs = nullptr);
// The header of the checkpoint at `path` (checked: magic, checksum, version).
Result<CheckpointHeader> ReadCheckpointHeader(const std::string& path, FileSystem* fs = nullptr);
// The files checkpoint `sequence` of the shard is made of, oldest first: the full checkpoint it
// builds on, then each delta after it up to `sequence` (just the file itself when it is full).
// Fails naming the first that is missing or unreadable.
Result<std::vector<std::string>> CheckpointChain(const std::string& dir, uint32_t shard,
                                                 uint64_t sequence, FileSystem* fs = nullptr);
// dir/shard-N/ckpt-SEQUENCE.bin
std::string CheckpointPath(const std::string& dir, uint32_t shard, uint64_t sequence);
// Removes all but the newest `keep` checkpoints of the shard and the files they build on (a
// delta's full checkpoint and the deltas between them): a chain is never broken.
void PruneCheckpoints(const std::string& dir, uint32_t shard, uint32_t keep,
                      FileSystem* fs = nullptr);

// A rollback of the job (protocols/message.fbs, Op.Rollback), as the shard records it before it
// acts: dir/shard-N/rollback, one line "parasol-rollback 1 GENERATION CLOCK SEQUENCE FIRST_NEW".
// The shard went back to checkpoint SEQUENCE (taken at CLOCK) and entered GENERATION; files
// numbered after SEQUENCE and before FIRST_NEW belong to the undone history and are never
// loaded. Written to a temporary file, fsynced, renamed, and the folder fsynced.
struct RollbackMark {
  uint64_t generation = 0;
  int64_t clock = -1;
  uint64_t sequence = 0;
  uint64_t first_new = 0;
  // Whether checkpoint `sequence` belongs to the undone history.
  bool Undone(uint64_t s) const { return s > sequence && s < first_new; }
};
Status WriteRollbackMark(const std::string& dir, uint32_t shard, const RollbackMark& mark,
                         FileSystem* fs = nullptr);
// The mark, or none when the shard never rolled back; a damaged one is an error naming the file.
Result<std::optional<RollbackMark>> ReadRollbackMark(const std::string& dir, uint32_t shard,
                                                    FileSystem* fs = nullptr);

// The clocks shard 0 named (joins, leaves, changes of the shard count: its membership entries),
// kept before the reply that tells them, so that a restart from an older checkpoint names none
// of them again differently: dir/shard-N/named, a line "parasol-named 1 FINGERPRINT COUNT SUM"
// and COUNT lines "WORKER JOIN LEAVE" (SUM: XXH64 of those lines). Written as the rollback mark
// is: to a temporary file, fsynced, renamed, the folder fsynced. A few hundred bytes: the shard
// writes it while it serves, instead of a whole checkpoint.
Status WriteNamedClocks(const std::string& dir, uint32_t shard, uint64_t fingerprint,
                        const std::vector<MemberEntry>& entries, FileSystem* fs = nullptr);
// The entries, or none when nothing was named; a damaged file, or one of another manifest
// (`fingerprint`), is an error naming the file.
Result<std::optional<std::vector<MemberEntry>>> ReadNamedClocks(const std::string& dir,
                                                                uint32_t shard,
                                                                uint64_t fingerprint,
                                                                FileSystem* fs = nullptr);

}  // namespace parasol
