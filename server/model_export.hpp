// Model export: the weights of a job's checkpoints in a form a serving process loads without
// Parasol's servers.
//
// `parasol export` writes into DIR:
//   model.json     {"fingerprint", "tables_fingerprint", "incremental", "since", "tables":
//                   [{"name", "kind", "dim" or "shape", "file", "rows"}]}
//   NAME.rows      sparse table: u64 count, u32 dim, then count x (u64 key, dim x f32), keys
//                  ascending (optimizer state left out)
//   NAME.f32       dense table: the whole tensor, row-major f32
// All little-endian. An incremental export (since an older checkpoint sequence) holds only the
// sparse rows that are new or changed since it, and every dense table. When that checkpoint is
// in the same chains (checkpoint.full_every) as the one exported, only the deltas after it are
// read, and their rows are the rows updated since ("from_deltas": true in model.json); else
// both models are read whole and compared row by row.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"

namespace parasol {

struct ExportOptions {
  std::string checkpoint_dir;  // default: the manifest's checkpoint.dir
  uint64_t sequence = 0;       // 0: each shard's newest checkpoint
  uint64_t since = 0;          // > 0: only rows changed since this sequence
};

Status ExportModel(const Manifest& manifest, const ExportOptions& options,
                   const std::string& out_dir);

// An exported model, loaded: sparse rows by key and dense tensors, by table name.
struct ExportedModel {
  uint64_t tables_fingerprint = 0;  // Manifest::TablesFingerprint() of the job it came from
  std::map<std::string, std::map<uint64_t, std::vector<float>>> sparse;
  std::map<std::string, std::vector<float>> dense;
};

// The most bytes model.json may have (it lists the tables: kilobytes).
inline constexpr uint64_t kMaxModelJsonBytes = uint64_t{16} << 20;

// Reads `file` (a name in the model's folder): its bytes, or an error naming it when it is
// missing, not a regular file, or longer than `max_bytes`.
using ExportFileReader =
    std::function<Result<std::string>(const std::string& file, uint64_t max_bytes)>;

// Loads the model exported into `dir`, checked against `manifest` before it is used:
// model.json is valid JSON of at most kMaxModelJsonBytes, made for these tables
// (tables_fingerprint, or for older exports the manifest's fingerprint) and lists each table
// once with its kind, dim or shape and its own file name; each NAME.rows is exactly as long as
// its row count says, with keys strictly ascending; each NAME.f32 exactly the tensor. Every
// error names the folder and the file.
Result<ExportedModel> LoadExportedModel(const Manifest& manifest, const std::string& dir);
// The same, reading the folder's files with `read` (a fuzzer's or a test's in-memory files).
Result<ExportedModel> LoadExportedModel(const Manifest& manifest, const std::string& dir,
                                        const ExportFileReader& read);

// Refuses to compare models made for different tables (their tables fingerprints differ).
Status CheckComparable(const ExportedModel& a, const std::string& dir_a, const ExportedModel& b,
                       const std::string& dir_b);

// How far model `a` is from model `b`: the largest relative L2 difference ||a - b|| / ||b|| of
// any sparse row or dense tensor (a row only one of them has counts as 1), where it is, and
// how many values differ at all.
struct ModelDifference {
  static constexpr size_t kExamples = 5;
  // The largest relative L2 difference of a row or tensor: infinite where a value that
  // differs is NaN or infinite in either model (a NaN equals nothing, not even a NaN).
  double max_relative = 0;
  std::string where;          // "table[key]" or "table" of the largest difference
  uint64_t differing_values = 0;
  uint64_t nonfinite_values = 0;  // of those, the ones not finite in either model
  uint64_t rows_in_one_only = 0;
  uint64_t values_compared = 0;
  std::vector<std::string> examples;  // the first few differences, each with its place
  std::string ToJson() const;
};
ModelDifference CompareModels(const ExportedModel& a, const ExportedModel& b);

}  // namespace parasol
