// libFuzzer target for checkpoint loading: the bytes are a checkpoint file of the shard in
// tests/support/small_shard.hpp, loaded by ShardState::Load into real tables (the reader, then
// the code that applies the decoded blocks). Each input is tried twice: as it is, and
// "resealed", its checksums recomputed wherever the sizes in it allow, so mutations reach the
// checks behind the checksums (sizes, tables, clocks, push record, pending BSP sums, a delta's
// links and removed rows) and the tables and sums themselves, both in the two passes of a
// check-first load and in the one pass of a restarting shard.
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

#include "server/checkpoint.hpp"
#include "tests/support/small_shard.hpp"

namespace {

using parasol::Checksum64;
using parasol::kCheckpointBlockHeaderBytes;
using parasol::kCheckpointFooterBytes;
using parasol::kCheckpointHeaderBytes;

uint64_t Get64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

void Put64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

// Recomputes the header, block and footer checksums (server/checkpoint.hpp's layout), walking
// the blocks as far as their sizes stay inside the file.
std::string Reseal(std::string f) {
  if (f.size() < kCheckpointHeaderBytes) return f;
  Put64(f, 56, Checksum64(f.data(), 56));
  const uint64_t blocks = Get64(f, 48);
  size_t pos = kCheckpointHeaderBytes;
  uint64_t all = 0;
  for (uint64_t i = 0; i < blocks && pos + kCheckpointBlockHeaderBytes <= f.size(); ++i) {
    const uint64_t bytes = Get64(f, pos + 16);
    const size_t payload = pos + kCheckpointBlockHeaderBytes;
    const bool fits = bytes <= f.size() - payload;
    uint32_t version;
    std::memcpy(&version, f.data() + 8, 4);
    if (fits) Put64(f, pos + 24, parasol::PayloadChecksum(f.data() + payload, bytes, version));
    Put64(f, pos + 32, Checksum64(f.data() + pos, 32, i));
    const uint64_t payload_checksum = Get64(f, pos + 24);
    all = Checksum64(&payload_checksum, 8, all);
    if (!fits) return f;
    pos = payload + bytes;
  }
  if (pos + kCheckpointFooterBytes <= f.size()) {
    Put64(f, pos + 8, blocks);
    Put64(f, pos + 16, all);
  }
  return f;
}

// Loads `file` (checked whole first, or in one pass as a restarting shard does, onto the
// checkpoint `onto` when it says it is a delta); when it is accepted, uses what was restored as
// a shard would.
void Load(parasol::testing::SmallShard& shard, const std::string& file, bool check_first,
          uint64_t onto) {
  shard.Reset();
  std::istringstream in(file);
  parasol::CheckpointHeader header;
  if (!shard.state().Load(in, "fuzz", &header, check_first, onto).ok()) return;
  for (uint32_t t : {0u, 1u}) {
    parasol::SparseTable& table = shard.sparse(t);
    for (uint32_t e = 0; e < table.engines(); ++e) {
      volatile float sink = 0;
      (void)table.partition(e).ForEachRow([&](uint64_t, const float* row) {
        for (uint32_t i = 0; i < table.partition(e).stored_floats(); ++i) sink = sink + row[i];
      });
      table.partition(e).Sweep(1 << 10, static_cast<uint32_t>(shard.controller().MaxClock()));
    }
  }
  for (const auto& [clock, agg] : shard.pending()) {
    volatile float sink = static_cast<float>(clock);
    for (const auto& [worker, part] : agg->parts()) {
      for (uint32_t t : {0u, 1u}) {
        for (uint32_t e = 0; e < shard.manifest().server.engine_threads; ++e) {
          part.ForEachSparse(t, e, shard.sparse(t).dim(), [&](uint64_t, const float* sum) {
            for (uint32_t d = 0; d < shard.sparse(t).dim(); ++d) sink = sink + sum[d];
          });
        }
      }
      for (uint32_t t : {2u, 3u}) {
        if (const float* sum = part.DenseSumIfAny(t)) {
          for (uint64_t i = 0; i < shard.dense(t).slice().size(); ++i) sink = sink + sum[i];
        }
      }
    }
    // The clock applied as a shard would: the parts folded in rank order.
    agg->PrepareCombine();
    for (uint32_t e = 0; e < shard.manifest().server.engine_threads; ++e) agg->CombineOn(e);
    agg->EndCombine();
  }
  (void)shard.controller().MinClock();
  (void)shard.record().Check(0, 1, 2);
  (void)shard.state().Save();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static parasol::testing::SmallShard* shard = new parasol::testing::SmallShard();
  const std::string file(reinterpret_cast<const char*>(data), size);
  Load(*shard, file, /*check_first=*/true, 0);
  const std::string resealed = Reseal(file);
  Load(*shard, resealed, true, 0);
  // The one pass a restarting shard makes, onto the checkpoint before the file's sequence (a
  // delta's), or onto none.
  const uint64_t sequence = resealed.size() >= 48 ? Get64(resealed, 40) : 0;
  Load(*shard, resealed, /*check_first=*/false, sequence > 0 ? sequence - 1 : 0);
  Load(*shard, resealed, /*check_first=*/false, 0);
  return 0;
}
