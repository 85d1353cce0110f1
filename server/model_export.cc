#include "server/model_export.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "common/json_text.hpp"
#include "common/optimizer_layout.hpp"
#include "common/sharding.hpp"
#include "server/checkpoint.hpp"
#include "server/shard_state.hpp"

namespace parasol {
namespace {

struct ShardWeights {
  std::map<uint32_t, std::map<uint64_t, std::vector<float>>> sparse;  // table -> key -> values
  std::map<uint32_t, std::vector<float>> dense;  // table -> the values a shard serves, or all
  std::map<uint32_t, uint64_t> dense_begin;      // table -> the first of them (a shard's)
};

std::string CheckpointOf(const std::string& dir, uint32_t shard, uint64_t sequence) {
  if (sequence > 0) return CheckpointPath(dir, shard, sequence);
  const std::vector<std::string> all = ListCheckpoints(dir, shard);
  return all.empty() ? "" : all[0];
}

// Reads one file of a shard's checkpoint into `w` (a delta onto what `w` holds).
Status ReadShardFile(const Manifest& m, uint32_t shard, const std::string& path,
                     ShardWeights& w) {
  CheckpointHeader h;
  const uint32_t shards = static_cast<uint32_t>(m.cluster.servers.size());
  auto ours = [&]() -> Status {
    if (h.fingerprint != m.Fingerprint() || h.shard != shard || h.shards != shards) {
      return FailedPrecondition("checkpoint " + path + " belongs to another manifest or shard");
    }
    return Status::Ok();
  };
  // Sizes are checked against the manifest before a payload is read (CheckBlockHeader).
  auto check = [&](const CheckpointBlockHeader& b) -> Status {
    PARASOL_RETURN_IF_ERROR(ours());
    return CheckBlockHeader(m, shard, b);
  };
  PARASOL_RETURN_IF_ERROR(ReadCheckpointFile(path, &h, [&](const CheckpointBlock& raw) -> Status {
    // Rows written as bf16 (checkpoint.dtype), widened first.
    CheckpointBlock widened;
    const bool narrow = raw.kind == static_cast<uint32_t>(CheckpointBlockKind::kSparseRowsBf16);
    if (narrow) {
      widened = raw;
      PARASOL_RETURN_IF_ERROR(WidenSparseRows(m, &widened));
    }
    const CheckpointBlock& b = narrow ? widened : raw;
    if (b.kind == static_cast<uint32_t>(CheckpointBlockKind::kRemovedRows)) {
      auto& rows = w.sparse[b.table];
      for (uint64_t i = 0; i < b.count; ++i) {
        uint64_t key;
        std::memcpy(&key, b.bytes.data() + 8 * i, 8);
        rows.erase(key);
      }
    } else if (b.kind == static_cast<uint32_t>(CheckpointBlockKind::kSparseRows)) {
      const TableOptions& t = m.tables[b.table];
      const size_t floats = 1 + t.dim + SparseStateFloats(t.optimizer, t.dim);
      auto& rows = w.sparse[b.table];
      for (uint64_t i = 0; i < b.count; ++i) {
        const char* p = b.bytes.data() + i * (8 + 4 * floats);
        uint64_t key;
        std::memcpy(&key, p, 8);
        std::vector<float> v(t.dim);
        std::memcpy(v.data(), p + 8 + 4, 4 * t.dim);  // after the clock word
        rows[key] = std::move(v);
      }
    } else if (b.kind == static_cast<uint32_t>(CheckpointBlockKind::kDenseSlice)) {
      std::vector<float> v(b.count);
      if (b.count > 0) std::memcpy(v.data(), b.bytes.data(), 4 * b.count);
      w.dense[b.table] = std::move(v);
      w.dense_begin[b.table] = DenseSlice(m.tables[b.table].NumElements(), shard, shards).begin;
    } else if (b.kind == static_cast<uint32_t>(CheckpointBlockKind::kDenseRange)) {
      // Only the elements the shard served its workers from (the others were held for a
      // change of the shard count, and other shards serve them).
      PARASOL_RETURN_IF_ERROR(CheckDenseRange(m, b).WithContext("checkpoint " + path));
      const DenseRangeBlock r = ReadDenseRange(b);
      std::vector<float> v(r.live_end - r.live_begin);
      if (!v.empty()) {
        std::memcpy(v.data(), r.arrays + 4 * (r.live_begin - r.begin), 4 * v.size());
      }
      w.dense[b.table] = std::move(v);
      w.dense_begin[b.table] = r.live_begin;
    }
    return Status::Ok();
  }, check));
  return ours();
}

// The files of a shard's chain that checkpoint `sequence` (0: its newest) loads: its full
// checkpoint, then each delta up to it, each with its sequence.
Result<std::vector<std::pair<uint64_t, std::string>>> ChainOf(const std::string& dir,
                                                                uint32_t shard,
                                                                uint64_t sequence) {
  const std::string path = CheckpointOf(dir, shard, sequence);
  if (path.empty()) return NotFound("no checkpoint of shard " + std::to_string(shard) + " in " + dir);
  PARASOL_ASSIGN_OR_RETURN(CheckpointHeader h, ReadCheckpointHeader(path));
  PARASOL_ASSIGN_OR_RETURN(std::vector<std::string> chain, CheckpointChain(dir, shard, h.sequence));
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const std::string& file : chain) {
    PARASOL_ASSIGN_OR_RETURN(CheckpointHeader fh, ReadCheckpointHeader(file));
    out.emplace_back(fh.sequence, file);
  }
  return out;
}

// A shard's weights at checkpoint `sequence` (0: its newest): its full checkpoint, then each
// delta up to it. With `after` > 0, only the deltas after checkpoint `after`, which must be
// in the same chain: their rows are the rows updated since `after` (removed ones left out),
// with their values at `sequence`; their dense tensors are whole.
Result<ShardWeights> ReadShard(const Manifest& m, uint32_t shard, const std::string& dir,
                               uint64_t sequence, uint64_t after = 0) {
  PARASOL_ASSIGN_OR_RETURN(auto chain, ChainOf(dir, shard, sequence));
  ShardWeights w;
  for (const auto& [seq, file] : chain) {
    if (seq > after) PARASOL_RETURN_IF_ERROR(ReadShardFile(m, shard, file, w));
  }
  return w;
}

// Whether every shard's chain to `sequence` holds checkpoint `since` and a delta after it: then
// the deltas after it say which rows changed since.
bool DeltasSince(const Manifest& m, const std::string& dir, uint64_t sequence, uint64_t since) {
  for (uint32_t s = 0; s < m.cluster.servers.size(); ++s) {
    auto chain = ChainOf(dir, s, sequence);
    if (!chain.ok()) return false;
    bool found = false;
    for (const auto& [seq, file] : *chain) found = found || seq == since;
    if (!found || chain->back().first <= since) return false;
  }
  return true;
}

// Every shard's weights of the checkpoints at `sequence`, merged (with `after`: of the deltas
// after it, as ReadShard()).
Result<ShardWeights> ReadAll(const Manifest& m, const std::string& dir, uint64_t sequence,
                             uint64_t after = 0) {
  ShardWeights all;
  const uint32_t shards = static_cast<uint32_t>(m.cluster.servers.size());
  std::map<uint32_t, std::vector<int32_t>> from;  // table -> the shard each element came from
  for (uint32_t s = 0; s < shards; ++s) {
    PARASOL_ASSIGN_OR_RETURN(ShardWeights w, ReadShard(m, s, dir, sequence, after));
    for (auto& [t, rows] : w.sparse) {
      all.sparse[t].merge(rows);
      // What merge() left behind was in an earlier shard's checkpoint too: a key has one shard.
      if (!rows.empty()) {
        return FailedPrecondition("key " + std::to_string(rows.begin()->first) + " of table '" +
                                  m.tables[t].name + "' is in the checkpoints of shard " +
                                  std::to_string(s) + " and of an earlier shard (" +
                                  std::to_string(rows.size()) + " keys are)");
      }
    }
    for (auto& [t, slice] : w.dense) {
      auto& full = all.dense[t];
      full.resize(m.tables[t].NumElements());
      std::vector<int32_t>& owner = from[t];
      owner.resize(full.size(), -1);
      const uint64_t begin = w.dense_begin[t];
      for (uint64_t i = 0; i < slice.size(); ++i) {
        if (owner[begin + i] >= 0) {
          return FailedPrecondition("element " + std::to_string(begin + i) + " of table '" +
                                    m.tables[t].name + "' is served by shard " +
                                    std::to_string(s) + " and by shard " +
                                    std::to_string(owner[begin + i]) + " in these checkpoints");
        }
        owner[begin + i] = static_cast<int32_t>(s);
      }
      std::copy(slice.begin(), slice.end(), full.begin() + begin);
    }
  }
  for (const auto& [t, owner] : from) {
    const auto missing = std::find(owner.begin(), owner.end(), -1);
    if (missing != owner.end()) {
      return FailedPrecondition("element " + std::to_string(missing - owner.begin()) +
                                " of table '" + m.tables[t].name +
                                "' is in no shard's checkpoint");
    }
  }
  return all;
}

}  // namespace

Status ExportModel(const Manifest& m, const ExportOptions& o, const std::string& out) {
  const std::string dir = o.checkpoint_dir.empty() ? m.checkpoint.dir : o.checkpoint_dir;
  if (dir.empty()) return InvalidArgument("no checkpoint folder: set checkpoint.dir or --checkpoint");
  // Since a checkpoint of the same chains: the rows of the deltas after it, read alone (the
  // rows updated since, whatever their values). Else both models whole, compared row by row.
  const bool from_deltas = o.since > 0 && DeltasSince(m, dir, o.sequence, o.since);
  PARASOL_ASSIGN_OR_RETURN(ShardWeights now,
                           ReadAll(m, dir, o.sequence, from_deltas ? o.since : 0));
  ShardWeights before;
  if (o.since > 0 && !from_deltas) {
    PARASOL_ASSIGN_OR_RETURN(before, ReadAll(m, dir, o.since));
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  Json json;
  json["fingerprint"] = m.Fingerprint();
  json["tables_fingerprint"] = m.TablesFingerprint();
  json["incremental"] = o.since > 0;
  json["since"] = o.since;
  json["from_deltas"] = from_deltas;
  Json& tables = json["tables"] = Json::array();
  for (uint32_t t = 0; t < m.tables.size(); ++t) {
    const TableOptions& table = m.tables[t];
    Json entry;
    entry["name"] = table.name;
    if (table.kind == TableKind::kSparse) {
      std::vector<std::pair<uint64_t, const std::vector<float>*>> rows;
      for (const auto& [key, v] : now.sparse[t]) {
        auto old = before.sparse[t].find(key);
        if (o.since == 0 || from_deltas || old == before.sparse[t].end() || old->second != v) {
          rows.emplace_back(key, &v);
        }
      }
      const std::string file = table.name + ".rows";
      std::ofstream f(out + "/" + file, std::ios::binary);
      const uint64_t count = rows.size();
      const uint32_t dim = table.dim;
      f.write(reinterpret_cast<const char*>(&count), 8);
      f.write(reinterpret_cast<const char*>(&dim), 4);
      for (const auto& [key, v] : rows) {
        f.write(reinterpret_cast<const char*>(&key), 8);
        f.write(reinterpret_cast<const char*>(v->data()), 4 * dim);
      }
      if (!f) return IoError("cannot write " + out + "/" + file);
      entry["kind"] = "sparse";
      entry["dim"] = dim;
      entry["file"] = file;
      entry["rows"] = count;
    } else {
      const std::string file = table.name + ".f32";
      std::ofstream f(out + "/" + file, std::ios::binary);
      const auto& v = now.dense[t];
      f.write(reinterpret_cast<const char*>(v.data()), 4 * v.size());
      if (!f) return IoError("cannot write " + out + "/" + file);
      entry["kind"] = "dense";
      entry["shape"] = table.shape;
      entry["file"] = file;
    }
    tables.push_back(std::move(entry));
  }
  std::ofstream f(out + "/model.json");
  f << SpacedJson(json) << "\n";
  f.close();
  if (!f) return IoError("cannot write " + out + "/model.json");
  return Status::Ok();
}

namespace {

// Reads `dir`/`file` from disk for LoadExportedModel: refuses what is not a regular file (a
// device or FIFO would be read without end, or block) and what is longer than `max_bytes`,
// before reading it.
Result<std::string> ReadExportFile(const std::string& dir, const std::string& file,
                                   uint64_t max_bytes) {
  const std::string path = dir + "/" + file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NotFound("cannot read " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError("cannot read " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + " is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return InvalidArgument(path + " has " + std::to_string(size) + " bytes, more than the " +
                           std::to_string(max_bytes) + " it may have");
  }
  std::string bytes(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read " + path + ": " + std::strerror(errno));
    if (n == 0) break;  // shrank while read: the length check below names it
    done += static_cast<uint64_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// The bytes of NAME.rows: u64 count, u32 dim, then count x (u64 key, dim x f32).
constexpr uint64_t kRowsHeaderBytes = 12;

// What model.json says of one table, checked against the manifest's.
struct ListedTable {
  const TableOptions* table = nullptr;
  uint64_t rows = 0;  // sparse: the row count
};

Result<std::vector<ListedTable>> CheckModelJson(const Manifest& m, const std::string& where,
                                                const std::string& text, uint64_t* tables_fp) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(where + ": not valid JSON");
  if (!j.is_object()) return InvalidArgument(where + ": expected a JSON object");
  auto unsigned_field = [&](const Json& o, const char* key, const std::string& at,
                            uint64_t* out) -> Status {
    const auto it = o.find(key);
    if (it == o.end() || !it->is_number_unsigned()) {
      return InvalidArgument(where + ": " + at + "\"" + key + "\" must be an unsigned integer");
    }
    *out = it->get<uint64_t>();
    return Status::Ok();
  };
  uint64_t fingerprint = 0;
  PARASOL_RETURN_IF_ERROR(unsigned_field(j, "fingerprint", "", &fingerprint));
  if (j.contains("tables_fingerprint")) {
    PARASOL_RETURN_IF_ERROR(unsigned_field(j, "tables_fingerprint", "", tables_fp));
    if (*tables_fp != m.TablesFingerprint()) {
      return FailedPrecondition(where + ": made for other tables (tables_fingerprint " +
                                std::to_string(*tables_fp) + "; " + m.source + "'s tables have " +
                                std::to_string(m.TablesFingerprint()) + ")");
    }
  } else if (fingerprint != m.Fingerprint()) {
    // Exports before tables_fingerprint: only the job's own manifest can vouch for them.
    return FailedPrecondition(where + ": made by another job (fingerprint " +
                              std::to_string(fingerprint) + "; " + m.source + "'s is " +
                              std::to_string(m.Fingerprint()) + ")");
  } else {
    *tables_fp = m.TablesFingerprint();
  }
  const auto tables = j.find("tables");
  if (tables == j.end() || !tables->is_array()) {
    return InvalidArgument(where + ": \"tables\" must be a list");
  }
  std::vector<ListedTable> listed(m.tables.size());
  for (size_t i = 0; i < tables->size(); ++i) {
    const Json& e = (*tables)[i];
    const std::string at = "tables[" + std::to_string(i) + "].";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) {
      return InvalidArgument(where + ": " + at + "\"name\" must be a string");
    }
    const std::string name = e["name"].get<std::string>();
    const int t = m.FindTable(name);
    if (t < 0) {
      return InvalidArgument(where + ": " + at + "name: " + m.source + " has no table '" +
                             CompactJson(Json(name)) + "'");
    }
    if (listed[t].table != nullptr) {
      return InvalidArgument(where + ": " + at + "name: table '" + name + "' is listed twice");
    }
    const TableOptions& table = m.tables[t];
    const bool sparse = table.kind == TableKind::kSparse;
    const std::string kind = sparse ? "sparse" : "dense";
    const std::string file = table.name + (sparse ? ".rows" : ".f32");
    if (!e.contains("kind") || e["kind"] != kind) {
      return InvalidArgument(where + ": " + at + "kind: table '" + name + "' is " + kind);
    }
    // The file is the table's own: a name from the JSON (../x, /dev/zero) is never opened.
    if (!e.contains("file") || e["file"] != file) {
      return InvalidArgument(where + ": " + at + "file: table '" + name + "' is in " + file);
    }
    ListedTable& l = listed[t];
    l.table = &table;
    if (sparse) {
      if (!e.contains("dim") || e["dim"] != table.dim) {
        return InvalidArgument(where + ": " + at + "dim: table '" + name + "' has dim " +
                               std::to_string(table.dim));
      }
      PARASOL_RETURN_IF_ERROR(unsigned_field(e, "rows", at, &l.rows));
    } else if (!e.contains("shape") || e["shape"] != Json(table.shape)) {
      return InvalidArgument(where + ": " + at + "shape: table '" + name + "' has shape " +
                             CompactJson(Json(table.shape)));
    }
  }
  for (size_t t = 0; t < listed.size(); ++t) {
    if (listed[t].table == nullptr) {
      return InvalidArgument(where + ": table '" + m.tables[t].name + "' is not listed");
    }
  }
  return listed;
}

// NAME.rows, exactly `rows` rows of `dim` floats with keys strictly ascending, into `out`.
Status ParseRows(const std::string& where, const std::string& bytes, uint64_t rows, uint32_t dim,
                 std::map<uint64_t, std::vector<float>>* out) {
  const uint64_t row_bytes = 8 + 4 * uint64_t{dim};
  if (bytes.size() < kRowsHeaderBytes) {
    return InvalidArgument(where + ": " + std::to_string(bytes.size()) +
                           " bytes, shorter than its 12-byte header");
  }
  uint64_t count = 0;
  uint32_t file_dim = 0;
  std::memcpy(&count, bytes.data(), 8);
  std::memcpy(&file_dim, bytes.data() + 8, 4);
  if (count != rows) {
    return InvalidArgument(where + ": holds " + std::to_string(count) + " rows; model.json says " +
                           std::to_string(rows));
  }
  if (file_dim != dim) {
    return InvalidArgument(where + ": has dim " + std::to_string(file_dim) + ", the table " +
                           std::to_string(dim));
  }
  // The length was bounded before the read; a count that does not match it is refused here.
  if ((bytes.size() - kRowsHeaderBytes) / row_bytes != count ||
      (bytes.size() - kRowsHeaderBytes) % row_bytes != 0) {
    return InvalidArgument(where + ": " + std::to_string(bytes.size()) + " bytes; " +
                           std::to_string(count) + " rows of dim " + std::to_string(dim) +
                           " take " + std::to_string(kRowsHeaderBytes) + " + " +
                           std::to_string(count) + " x " + std::to_string(row_bytes));
  }
  const char* p = bytes.data() + kRowsHeaderBytes;
  for (uint64_t i = 0; i < count; ++i, p += row_bytes) {
    uint64_t key;
    std::memcpy(&key, p, 8);
    if (!out->empty() && key <= out->rbegin()->first) {
      return InvalidArgument(where + ": row " + std::to_string(i) + " has key " +
                             std::to_string(key) + ", not above the key before it (" +
                             std::to_string(out->rbegin()->first) + ")");
    }
    std::vector<float> v(dim);
    std::memcpy(v.data(), p + 8, 4 * uint64_t{dim});
    out->emplace_hint(out->end(), key, std::move(v));
  }
  return Status::Ok();
}

}  // namespace

Result<ExportedModel> LoadExportedModel(const Manifest& m, const std::string& dir,
                                        const ExportFileReader& read) {
  const std::string folder = "exported model " + dir;
  ExportedModel model;
  PARASOL_ASSIGN_OR_RETURN(const std::string json, read("model.json", kMaxModelJsonBytes));
  PARASOL_ASSIGN_OR_RETURN(
      const std::vector<ListedTable> listed,
      CheckModelJson(m, folder + ": model.json", json, &model.tables_fingerprint));
  for (const ListedTable& l : listed) {
    const TableOptions& t = *l.table;
    if (t.kind == TableKind::kSparse) {
      const std::string file = t.name + ".rows";
      const uint64_t row_bytes = 8 + 4 * uint64_t{t.dim};
      // The length model.json's row count implies, bounded before anything is read: a count
      // that would take more than 2^50 bytes is no export of ours.
      if (l.rows > ((uint64_t{1} << 50) - kRowsHeaderBytes) / row_bytes) {
        return InvalidArgument(folder + ": model.json: table '" + t.name + "' lists " +
                               std::to_string(l.rows) + " rows, more than a file may hold");
      }
      PARASOL_ASSIGN_OR_RETURN(const std::string bytes,
                               read(file, kRowsHeaderBytes + l.rows * row_bytes));
      PARASOL_RETURN_IF_ERROR(
          ParseRows(folder + ": " + file, bytes, l.rows, t.dim, &model.sparse[t.name]));
    } else {
      const std::string file = t.name + ".f32";
      const uint64_t want = 4 * t.NumElements();
      PARASOL_ASSIGN_OR_RETURN(const std::string bytes, read(file, want));
      if (bytes.size() != want) {
        return InvalidArgument(folder + ": " + file + ": " + std::to_string(bytes.size()) +
                               " bytes; the table's " + std::to_string(t.NumElements()) +
                               " floats take " + std::to_string(want));
      }
      std::vector<float> v(t.NumElements());
      if (want > 0) std::memcpy(v.data(), bytes.data(), want);
      model.dense[t.name] = std::move(v);
    }
  }
  return model;
}

Result<ExportedModel> LoadExportedModel(const Manifest& m, const std::string& dir) {
  return LoadExportedModel(m, dir, [&](const std::string& file, uint64_t max_bytes) {
    Result<std::string> bytes = ReadExportFile(dir, file, max_bytes);
    if (!bytes.ok()) {
      return Result<std::string>(
          Status(bytes.status().code(), "exported model " + dir + ": " + bytes.status().message()));
    }
    return bytes;
  });
}

Status CheckComparable(const ExportedModel& a, const std::string& dir_a, const ExportedModel& b,
                       const std::string& dir_b) {
  if (a.tables_fingerprint == b.tables_fingerprint) return Status::Ok();
  return FailedPrecondition("exported models " + dir_a + " and " + dir_b +
                            " were made for different tables (tables fingerprints " +
                            std::to_string(a.tables_fingerprint) + " and " +
                            std::to_string(b.tables_fingerprint) + ")");
}

namespace {

// ||a - b|| / ||b|| (with ||b|| at least 1e-12), infinite when a value that differs is not
// finite in either (a NaN is never equal, not even to a NaN); notes the values that differ.
// `where`: the row's or tensor's name, for the examples.
double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b,
                          const std::string& where, ModelDifference* out) {
  if (a.size() != b.size()) {
    out->differing_values += std::max(a.size(), b.size());
    if (out->examples.size() < ModelDifference::kExamples) {
      out->examples.push_back(where + ": " + std::to_string(a.size()) + " values against " +
                              std::to_string(b.size()));
    }
    return 1.0;
  }
  double diff = 0, norm = 0;
  bool nonfinite = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == b[i])) {
      ++out->differing_values;
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
        ++out->nonfinite_values;
        nonfinite = true;
      }
      if (out->examples.size() < ModelDifference::kExamples) {
        char text[96];
        std::snprintf(text, sizeof(text), "[%zu]: %.9g against %.9g", i, a[i], b[i]);
        out->examples.push_back(where + text);
      }
    }
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    const double d = double{a[i]} - double{b[i]};
    diff += d * d;
    norm += double{b[i]} * double{b[i]};
  }
  if (nonfinite) return std::numeric_limits<double>::infinity();
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12);
}

}  // namespace

ModelDifference CompareModels(const ExportedModel& a, const ExportedModel& b) {
  ModelDifference out;
  auto note = [&](double rel, const std::string& where) {
    if (rel > out.max_relative) {
      out.max_relative = rel;
      out.where = where;
    }
  };
  auto one_only = [&](const std::string& where, const char* model) {
    ++out.rows_in_one_only;
    if (out.examples.size() < ModelDifference::kExamples) {
      out.examples.push_back(where + ": only in model " + model);
    }
    note(1.0, where);
  };
  std::set<std::string> sparse_names, dense_names;
  for (const auto& [name, rows] : a.sparse) sparse_names.insert(name);
  for (const auto& [name, rows] : b.sparse) sparse_names.insert(name);
  for (const auto& [name, t] : a.dense) dense_names.insert(name);
  for (const auto& [name, t] : b.dense) dense_names.insert(name);
  static const std::map<uint64_t, std::vector<float>> kNoRows;
  for (const std::string& name : sparse_names) {
    const auto ia = a.sparse.find(name), ib = b.sparse.find(name);
    const auto& ra = ia == a.sparse.end() ? kNoRows : ia->second;
    const auto& rb = ib == b.sparse.end() ? kNoRows : ib->second;
    for (const auto& [key, row] : ra) {
      const std::string where = name + "[" + std::to_string(key) + "]";
      auto other = rb.find(key);
      if (other == rb.end()) {
        one_only(where, "A");
        continue;
      }
      out.values_compared += row.size();
      note(RelativeDifference(row, other->second, where, &out), where);
    }
    for (const auto& [key, row] : rb) {
      if (!ra.count(key)) one_only(name + "[" + std::to_string(key) + "]", "B");
    }
  }
  for (const std::string& name : dense_names) {
    const auto ia = a.dense.find(name), ib = b.dense.find(name);
    if (ia == a.dense.end() || ib == b.dense.end()) {
      if (out.examples.size() < ModelDifference::kExamples) {
        out.examples.push_back(name + ": only in model " + (ia == a.dense.end() ? "B" : "A"));
      }
      note(1.0, name);
      continue;
    }
    out.values_compared += ib->second.size();
    note(RelativeDifference(ia->second, ib->second, name, &out), name);
  }
  return out;
}

std::string ModelDifference::ToJson() const {
  Json j;
  // JSON has no infinity: a difference at a value that is not finite is written as a string.
  if (std::isfinite(max_relative)) {
    j["max_relative_difference"] = max_relative;
  } else {
    j["max_relative_difference"] = "inf";
  }
  j["where"] = where;
  j["differing_values"] = differing_values;
  j["nonfinite_values"] = nonfinite_values;
  j["rows_in_one_only"] = rows_in_one_only;
  j["values_compared"] = values_compared;
  j["examples"] = examples;
  return SpacedJson(j);
}

}  // namespace parasol
