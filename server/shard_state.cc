#include "server/shard_state.hpp"

#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "common/optimizer_layout.hpp"
#include "common/sharding.hpp"

namespace parasol {
namespace {

using Kind = CheckpointBlockKind;

template <typename T>
void Append(std::vector<char>& out, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

Kind KindOf(const CheckpointBlockHeader& b) { return static_cast<Kind>(b.kind); }
Kind KindOf(const CheckpointBlock& b) { return static_cast<Kind>(b.kind); }

// Refuses `count` x `unit` bytes that overflow or differ from the block's `bytes`.
Status CheckProduct(uint64_t count, uint64_t unit, uint64_t bytes, const std::string& what) {
  const std::string product = what + ": " + std::to_string(count) + " x " + std::to_string(unit);
  uint64_t want = 0;
  if (__builtin_mul_overflow(count, unit, &want))
    return InvalidArgument(product + " bytes overflow");
  if (want != bytes) {
    return InvalidArgument(product + " bytes do not make the block's " + std::to_string(bytes) +
                           " bytes");
  }
  return Status::Ok();
}

}  // namespace

Status CheckBlockHeader(const Manifest& manifest, uint32_t shard, const CheckpointBlockHeader& b) {
  switch (KindOf(b)) {
    case Kind::kClocks:
      if (b.count != manifest.cluster.workers) {
        return InvalidArgument("clocks of " + std::to_string(b.count) +
                               " workers; the manifest has " +
                               std::to_string(manifest.cluster.workers));
      }
      return CheckProduct(b.count, sizeof(int64_t), b.bytes, "clocks");
    case Kind::kPushRecord:
      return Status::Ok();  // PushDedup::Load() checks its own layout
    case Kind::kSparseRows:
    case Kind::kDenseSlice:
      break;
    default:
      return InvalidArgument("unknown block kind " + std::to_string(b.kind));
  }
  if (b.table >= manifest.tables.size()) {
    return InvalidArgument("table " + std::to_string(b.table) + " is not in the manifest (" +
                           std::to_string(manifest.tables.size()) + " tables)");
  }
  const TableOptions& t = manifest.tables[b.table];
  const std::string name = "table '" + t.name + "'";
  if (KindOf(b) == Kind::kSparseRows) {
    if (t.kind != TableKind::kSparse) return InvalidArgument("sparse rows for dense " + name);
    const uint64_t row_floats = 1 + uint64_t{t.dim} + SparseStateFloats(t.optimizer, t.dim);
    return CheckProduct(b.count, sizeof(uint64_t) + sizeof(float) * row_floats, b.bytes,
                        name + " rows");
  }
  if (t.kind != TableKind::kDense) return InvalidArgument("a dense slice for sparse " + name);
  const uint32_t shards = static_cast<uint32_t>(manifest.cluster.servers.size());
  const uint64_t slice = DenseSlice(t.NumElements(), shard, shards).size();
  if (b.count != slice) {
    return InvalidArgument(name + ": a slice of " + std::to_string(b.count) +
                           " elements; this shard's slice has " + std::to_string(slice));
  }
  return CheckProduct(b.count, sizeof(float) * (1 + uint64_t{DenseStateArrays(t.optimizer)}),
                      b.bytes, name + " slice");
}

ShardState::ShardState(const Manifest& manifest, uint32_t shard,
                       std::vector<std::unique_ptr<SparseTable>>& sparse,
                       std::vector<std::unique_ptr<DenseTable>>& dense,
                       ConsistencyController& controller, PushDedup& dedup)
    : manifest_(manifest),
      shard_(shard),
      fingerprint_(manifest.Fingerprint()),
      sparse_(sparse),
      dense_(dense),
      controller_(controller),
      dedup_(dedup) {}

std::vector<CheckpointBlock> ShardState::Save() const {
  std::vector<CheckpointBlock> blocks;
  for (uint32_t t = 0; t < manifest_.tables.size(); ++t) {
    CheckpointBlock b;
    b.table = t;
    if (sparse_[t]) {
      b.kind = static_cast<uint32_t>(Kind::kSparseRows);
      const SparseTable& table = *sparse_[t];
      for (uint32_t e = 0; e < table.engines(); ++e) {
        const SparseTable::Partition& part = table.partition(e);
        const size_t row_bytes = sizeof(float) * part.stored_floats();
        b.bytes.reserve(b.bytes.size() + part.rows() * (8 + row_bytes));
        part.ForEachRow([&](uint64_t key, const float* row) {
          Append(b.bytes, key);
          const char* p = reinterpret_cast<const char*>(row);
          b.bytes.insert(b.bytes.end(), p, p + row_bytes);
          ++b.count;
        });
      }
    } else {
      b.kind = static_cast<uint32_t>(Kind::kDenseSlice);
      DenseTable& d = *dense_[t];
      const uint64_t n = d.slice().size();
      b.count = n;
      std::shared_ptr<const float[]> values = d.Share();
      const char* v = reinterpret_cast<const char*>(values.get());
      b.bytes.insert(b.bytes.end(), v, v + n * sizeof(float));
      for (uint32_t a = 0; a < d.state_array_count(); ++a) {
        const char* s = reinterpret_cast<const char*>(d.state_arrays()[a]);
        b.bytes.insert(b.bytes.end(), s, s + n * sizeof(float));
      }
    }
    blocks.push_back(std::move(b));
  }
  CheckpointBlock clocks;
  clocks.kind = static_cast<uint32_t>(Kind::kClocks);
  clocks.count = controller_.clocks().size();
  for (int64_t clock : controller_.clocks()) Append(clocks.bytes, clock);
  blocks.push_back(std::move(clocks));
  // Which pushes are in this checkpoint: a push resent after a restart is applied once.
  CheckpointBlock record;
  record.kind = static_cast<uint32_t>(Kind::kPushRecord);
  record.bytes = dedup_.Save();
  blocks.push_back(std::move(record));
  return blocks;
}

Status ShardState::CheckHeader(const CheckpointHeader& h) const {
  const uint32_t shards = static_cast<uint32_t>(manifest_.cluster.servers.size());
  if (h.shard != shard_ || h.shards != shards || h.fingerprint != fingerprint_) {
    return FailedPrecondition("it belongs to shard " + std::to_string(h.shard) + " of " +
                              std::to_string(h.shards) +
                              " of another manifest or layout (this is shard " +
                              std::to_string(shard_) + " of " + std::to_string(shards) + ")");
  }
  if (h.clock < -1 || h.clock > kMaxCheckpointClock) {
    return InvalidArgument("its clock " + std::to_string(h.clock) + " is out of range");
  }
  return Status::Ok();
}

Status ShardState::Load(std::istream& in, const std::string& name, CheckpointHeader* header) {
  try {
    std::vector<int64_t> clocks;
    PushDedup record = dedup_;  // the same window
    PARASOL_RETURN_IF_ERROR(Verify(in, name, header, &clocks, &record));
    in.clear();
    in.seekg(0, std::ios::beg);
    PARASOL_RETURN_IF_ERROR(ApplyTables(in, name));
    for (size_t w = 0; w < clocks.size(); ++w) {
      controller_.SetClock(static_cast<uint32_t>(w), clocks[w]);
    }
    dedup_ = std::move(record);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while loading checkpoint '" + name + "'");
  } catch (const std::exception& e) {
    return Internal("while loading checkpoint '" + name + "': " + e.what());
  }
}

Status ShardState::Verify(std::istream& in, const std::string& name, CheckpointHeader* header,
                          std::vector<int64_t>* clocks, PushDedup* record) const {
  Status identity;
  std::vector<char> table_seen(manifest_.tables.size(), 0);
  bool clocks_seen = false, record_seen = false;
  auto check = [&](const CheckpointBlockHeader& b) -> Status {
    identity = CheckHeader(*header);
    if (!identity.ok()) return identity;
    PARASOL_RETURN_IF_ERROR(CheckBlockHeader(manifest_, shard_, b));
    if (KindOf(b) == Kind::kClocks) {
      if (std::exchange(clocks_seen, true)) return InvalidArgument("a second block of clocks");
    } else if (KindOf(b) == Kind::kPushRecord) {
      if (std::exchange(record_seen, true)) return InvalidArgument("a second push record");
    } else if (std::exchange(table_seen[b.table], 1)) {
      return InvalidArgument("a second block of table '" + manifest_.tables[b.table].name + "'");
    }
    return Status::Ok();
  };
  auto decode = [&](const CheckpointBlock& b) -> Status {
    if (KindOf(b) == Kind::kClocks) {
      clocks->resize(b.count);
      std::memcpy(clocks->data(), b.bytes.data(), b.bytes.size());
      for (size_t w = 0; w < clocks->size(); ++w) {
        if ((*clocks)[w] < 0 || (*clocks)[w] > kMaxCheckpointClock) {
          return InvalidArgument("worker " + std::to_string(w) + "'s clock " +
                                 std::to_string((*clocks)[w]) + " is out of range");
        }
      }
    } else if (KindOf(b) == Kind::kPushRecord && !record->Load(b.bytes)) {
      return InvalidArgument("malformed push record");
    }
    return Status::Ok();
  };
  const Status read = ReadCheckpoint(in, name, header, decode, check);
  if (!identity.ok()) return identity.WithContext("checkpoint '" + name + "'");
  PARASOL_RETURN_IF_ERROR(read);
  PARASOL_RETURN_IF_ERROR(CheckHeader(*header).WithContext("checkpoint '" + name + "'"));
  for (size_t t = 0; t < table_seen.size(); ++t) {
    if (!table_seen[t]) {
      return InvalidArgument("checkpoint '" + name + "' has no block of table '" +
                             manifest_.tables[t].name + "'");
    }
  }
  if (!clocks_seen || !record_seen) {
    return InvalidArgument("checkpoint '" + name + "' has no " +
                           (clocks_seen ? "push record" : "worker clocks"));
  }
  return Status::Ok();
}

// Every size is checked again as it is read: the file is read anew, not trusted.
Status ShardState::ApplyTables(std::istream& in, const std::string& name) {
  CheckpointHeader header;
  return ReadCheckpoint(
      in, name, &header,
      [&](const CheckpointBlock& b) -> Status {
        if (KindOf(b) == Kind::kSparseRows) return ApplySparse(b);
        if (KindOf(b) == Kind::kDenseSlice) return ApplyDense(b);
        return Status::Ok();
      },
      [&](const CheckpointBlockHeader& b) { return CheckBlockHeader(manifest_, shard_, b); });
}

Status ShardState::ApplySparse(const CheckpointBlock& b) {
  if (b.table >= sparse_.size() || !sparse_[b.table]) {
    return Internal("no sparse table " + std::to_string(b.table) + " on this shard");
  }
  SparseTable& t = *sparse_[b.table];
  const size_t row_bytes = sizeof(float) * t.partition(0).stored_floats();
  const size_t stride = sizeof(uint64_t) + row_bytes;
  if (b.bytes.size() / stride != b.count || b.bytes.size() % stride != 0) {
    return Internal("table '" + t.options().name + "' rows do not match the table");
  }
  std::vector<float> row(row_bytes / sizeof(float));
  const uint32_t engines = t.engines();
  for (uint32_t e = 0; e < engines; ++e) {
    t.partition(e).Reserve(b.count / engines + b.count / 20 + 16);
  }
  for (uint64_t i = 0; i < b.count; ++i) {
    const char* p = b.bytes.data() + i * stride;
    uint64_t key;
    std::memcpy(&key, p, sizeof(key));
    std::memcpy(row.data(), p + sizeof(key), row_bytes);
    t.partition(EngineOfKey(key, engines)).RestoreRow(key, row.data());
  }
  return Status::Ok();
}

Status ShardState::ApplyDense(const CheckpointBlock& b) {
  if (b.table >= dense_.size() || !dense_[b.table]) {
    return Internal("no dense table " + std::to_string(b.table) + " on this shard");
  }
  DenseTable& d = *dense_[b.table];
  const uint64_t n = d.slice().size();
  if (b.count != n || b.bytes.size() / sizeof(float) / (1 + d.state_array_count()) != n ||
      b.bytes.size() % (sizeof(float) * (1 + d.state_array_count())) != 0) {
    return Internal("table '" + d.options().name + "' slice does not match the table");
  }
  if (n == 0) return Status::Ok();
  std::memcpy(d.PrepareWrite(), b.bytes.data(), n * sizeof(float));
  for (uint32_t a = 0; a < d.state_array_count(); ++a) {
    std::memcpy(d.state_arrays()[a], b.bytes.data() + (1 + a) * n * sizeof(float),
                n * sizeof(float));
  }
  return Status::Ok();
}

}  // namespace parasol
