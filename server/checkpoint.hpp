// Checkpoint files of one shard: its tables with their optimizer state, and its clocks.
//
// Layout (little-endian):
//   header   magic "PSOLCKPT", u32 version, u32 shard, u32 shards, u32 reserved,
//            u64 manifest fingerprint, i64 clock, u64 sequence, u64 blocks, u64 checksum
//   blocks   each: u32 kind, u32 table, u64 count, u64 bytes, u64 checksum, then `bytes` bytes
//            kind 1 sparse rows: count x (u64 key, u32 last clock, row floats x f32)
//            kind 2 dense slice: count elements x (1 + state arrays) f32, value array first
//            kind 3 clocks:      count workers x i64 clock
//   footer   magic "PSOLEND!", u64 blocks, u64 checksum of the block checksums
// A file is written to NAME.tmp, fsynced and renamed, then its folder is fsynced; a reader
// checks every checksum and refuses a damaged or truncated file naming what is wrong and where.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace parasol {

inline constexpr uint32_t kCheckpointVersion = 1;

struct CheckpointBlock {
  uint32_t kind = 0;
  uint32_t table = 0;
  uint64_t count = 0;
  std::vector<char> bytes;
};

struct CheckpointHeader {
  uint32_t shard = 0;
  uint32_t shards = 0;
  uint64_t fingerprint = 0;
  int64_t clock = 0;
  uint64_t sequence = 0;
};

// 64-bit checksum of `n` bytes (word-wise multiply-mix; detects flipped bits and truncation).
uint64_t Checksum64(const void* data, size_t n, uint64_t seed = 0);

// Writes `blocks` under `path` atomically (tmp + fsync + rename + fsync of the folder).
Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                           const std::vector<CheckpointBlock>& blocks);

// Reads and verifies a whole file; calls `block` for each block in order.
Status ReadCheckpointFile(const std::string& path, CheckpointHeader* header,
                          const std::function<Status(const CheckpointBlock&)>& block);

// The checkpoints of shard `shard` under `dir` (dir/shard-N/ckpt-SEQUENCE.bin), newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir, uint32_t shard);
// dir/shard-N/ckpt-SEQUENCE.bin
std::string CheckpointPath(const std::string& dir, uint32_t shard, uint64_t sequence);
// Removes all but the newest `keep` checkpoints of the shard.
void PruneCheckpoints(const std::string& dir, uint32_t shard, uint32_t keep);

}  // namespace parasol
