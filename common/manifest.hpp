// The job manifest: one YAML file that describes a whole job.
//
// LoadManifest() parses it into typed option structs once; everything downstream takes these
// structs, never YAML. Every field has a default (common/manifest_fields.cc, the table that
// docs/manifest.md is generated from; a field read here needs its entry there). An unknown
// key, a wrong type or a bad value is an error naming the file, line, column and key path.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace parasol {

enum class TableKind { kSparse, kDense };
enum class DType { kF32, kBf16, kF16 };

struct InitOptions {
  enum class Kind { kZeros, kConstant, kUniform, kNormal };
  Kind kind = Kind::kUniform;
  double value = 0.0;    // constant: the value
  double scale = 0.01;   // uniform: values in [-scale, scale)
  double mean = 0.0;     // normal: mean
  double stddev = 0.01;  // normal: standard deviation
};

struct OptimizerOptions {
  enum class Kind { kSgd, kAdagrad, kAdagradRowwise, kAdam, kFtrl };
  Kind kind = Kind::kSgd;
  double lr = 0.01;                   // sgd, adagrad, adagrad_rowwise, adam: learning rate
  double weight_decay = 0.0;          // all: L2 coefficient added to the gradient, g + wd * w
  double eps = 1e-8;                  // adagrad, adagrad_rowwise, adam
  double initial_accumulator = 0.0;   // adagrad, adagrad_rowwise
  double beta1 = 0.9;                 // adam
  double beta2 = 0.999;               // adam
  bool bias_correction = true;        // adam
  double alpha = 0.05;                // ftrl: learning rate
  double beta = 1.0;                  // ftrl
  double l1 = 0.0;                    // ftrl
  double l2 = 0.0;                    // ftrl
};

struct AdmissionOptions {
  uint32_t min_count = 1;  // a key's row is created at its min_count-th push (1: at once)
};

struct EvictionOptions {
  uint64_t ttl_clocks = 0;  // remove rows not updated in the last ttl_clocks clocks (0: never)
  uint64_t max_rows = 0;    // per shard; least recently updated rows go first (0: no limit)
};

struct TableOptions {
  std::string name;                 // required, unique
  TableKind kind = TableKind::kSparse;
  uint32_t dim = 8;                 // sparse: floats per row
  std::vector<uint64_t> shape;      // dense: tensor shape (required for dense tables)
  DType dtype = DType::kF32;        // how values are stored (f32, bf16, f16)
  DType state_dtype = DType::kF32;  // how optimizer state is stored
  // How a 16-bit value is rounded when stored: to nearest (even), or stochastically.
  enum class Rounding { kNearest, kStochastic };
  Rounding rounding = Rounding::kNearest;
  // Sparse: memory, or tiered (rows beyond the shard's server.memory_budget on its disk).
  enum class Storage { kMemory, kTiered };
  Storage storage = Storage::kMemory;
  InitOptions init;
  OptimizerOptions optimizer;
  AdmissionOptions admission;       // sparse tables only
  EvictionOptions eviction;         // sparse tables only
  uint64_t seed = 0;                // default: derived from job.seed and the table name
  // Rows keep the shard clock of their last update even when the table evicts nothing (set
  // from checkpoint.full_every > 1: a delta holds the rows updated since a clock).
  bool keep_clock = false;

  // Dense: product of shape. Sparse: dim.
  uint64_t NumElements() const;
};

struct ServerAddress {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// The most shards a job may list (each header's membership MACs are bounded by it).
inline constexpr size_t kMaxShards = 4096;

struct ClusterOptions {
  std::vector<ServerAddress> servers;  // required: one entry per shard, "host:port"
  // How many of the listed shards hold keys at the start: the rest run from the start holding
  // nothing until `parasol scale --servers` grows the job onto them (common/placement.hpp).
  // Default: every listed shard.
  uint32_t initial_servers = 0;
  uint32_t InitialServers() const {
    const auto listed = static_cast<uint32_t>(servers.size());
    return initial_servers == 0 || initial_servers > listed ? listed : initial_servers;
  }
  uint32_t workers = 1;                // number of worker processes at the start
  // The most worker ranks the job may ever have: ranks workers .. max_workers - 1 join a running
  // job (common/membership.hpp). Default: workers (no joins).
  uint32_t max_workers = 0;
  std::vector<std::string> worker_hosts;  // optional: where each worker runs (informational)
  std::string bind;                    // servers bind this host instead of their own (e.g. 0.0.0.0)
  int64_t connect_timeout_ms = 30000;  // how long a worker waits for its servers to answer
  int64_t request_timeout_ms = 30000;  // a request with no reply by then is resent
  uint32_t request_retries = 2;        // resends before a request fails
  // How long a worker waits for a shard that is loading its checkpoint (and moving), counted
  // from the first time it said so: a shard that restarts again and again while loading moves
  // each time, and is given up on after this.
  int64_t restore_timeout_ms = 3600000;
  bool restart_servers = false;        // launch: start a server again when it dies
  bool restart_workers = false;        // launch: start a worker again when it dies
};

struct ServerOptions {
  uint32_t engine_threads = 2;               // threads per shard that own disjoint key sets
  // bsp: whether the rows of a clock that the tick's pulls do not read are applied after the
  // reply, on an idle-priority background thread (kAuto: where the shard's process has more
  // cores than engine threads; ApplyAfterReply() in server/shard_server.hpp decides).
  enum class ApplyAfterReply { kAuto, kAlways, kNever };
  ApplyAfterReply apply_after_reply = ApplyAfterReply::kAuto;
  uint64_t max_request_bytes = 1ull << 30;   // payload bytes one request may carry
  uint64_t frame_bytes = 1ull << 20;         // values travel in frames (and dense requests in chunks) of at most this size
  // What any client can make a shard keep (README, "Hostile input"); a request over a limit
  // is refused with an error naming it.
  uint32_t max_held_pulls = 1024;            // pulls held for the read bound at once
  uint64_t max_held_bytes = 256ull << 20;    // their request bytes
  uint32_t max_pending_clocks = 4;           // bsp: clocks whose pushes are being summed
  uint64_t max_pending_bytes = 2ull << 30;   // bsp: bytes of those sums
  uint32_t socket_hwm = 1000;                // messages queued per peer and direction
  uint64_t max_queued_reply_bytes = 1ull << 30;  // replies sent but not yet taken by their peers
  // Connections open at once (also at most the open-file limit less what a shard keeps for
  // its own files); at the cap, the one quiet longest that is no worker's makes room.
  uint32_t max_connections = 8192;
  // A connection that is not a job worker's and sends nothing for this long is shut (-1 until
  // the manifest is read: then at least a minute, and twice cluster.request_timeout).
  int64_t idle_timeout_ms = -1;
  // Tiered tables (tables[].storage: tiered): the bytes their memory tier may hold, per shard
  // (shared equally among them), and where the disk tier lives (a folder per shard in it;
  // empty: one under the system's temporary folder, removed when the shard stops).
  uint64_t memory_budget = 1ull << 30;
  std::string disk_dir;
};

struct TrainingOptions {
  enum class Consistency { kBsp, kSsp, kAsp };
  enum class OnWorkerLoss { kFail, kContinue };
  Consistency consistency = Consistency::kBsp;
  uint32_t staleness = 0;                 // ssp: a worker at clock c reads once every worker is at >= c - staleness
  int64_t worker_timeout_ms = 120000;     // a worker silent this long (and not waiting on the servers) is lost
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kFail;
  uint32_t batch_size = 256;              // samples per worker per step
  uint32_t epochs = 1;                    // passes over data.train
  uint64_t max_steps = 0;                 // stop after this many steps per worker (0: no limit)
  uint64_t eval_every = 0;                // evaluate every this many steps (0: only at the end)
  bool prefetch = true;                   // ssp/asp: pull the next batch's rows during compute
  // ssp/asp with prefetch: how many steps ahead rows are pulled (each pull carries the clock of
  // the step it is for); at most staleness under ssp.
  uint32_t prefetch_depth = 1;
  uint32_t accumulate = 1;                // micro-batches of batch_size per push and per clock
  int64_t progress_ms = 5000;             // a progress line this often
  // A step whose loss or gradients are not finite: fail stops the worker with an error naming
  // the step and table; skip pushes nothing for it and counts it (as loss scaling does).
  enum class OnNonfinite { kFail, kSkip };
  OnNonfinite on_nonfinite = OnNonfinite::kFail;
  // Two failures that overlap so that updates are lost (a worker and a shard it pushed to die
  // together, or a worker dies between its ticks to two shards): rollback returns every shard
  // to the newest checkpoint they all hold and every worker redoes its steps from there (BSP
  // with checkpoint.every_steps; the default there); fail stops the job with an error naming
  // what was lost (the default elsewhere). Manifest::RollsBack() says which applies.
  enum class OnOverlappingFailure { kDefault, kRollback, kFail };
  OnOverlappingFailure on_overlapping_failure = OnOverlappingFailure::kDefault;
};

struct ModelOptions {
  enum class Kind { kNone, kLr, kDlrm };
  Kind kind = Kind::kNone;                // none: the job serves tables for external workers
  uint32_t embedding_dim = 16;            // dlrm: d
  std::vector<uint32_t> bottom = {64, 16};  // dlrm: widths after the 13 inputs; last == d
  std::vector<uint32_t> top = {64, 1};      // dlrm: widths after the interaction; last == 1
  double embedding_init_scale = 0.05;     // embeddings start uniform in [-scale, scale)
  OptimizerOptions sparse_optimizer;      // of the embedding (dlrm) or weight (lr) table
  OptimizerOptions dense_optimizer;       // of every dense layer
  TableOptions::Storage sparse_storage = TableOptions::Storage::kMemory;  // of the sparse table
  DType sparse_dtype = DType::kF32;        // of the sparse table's values
  DType sparse_state_dtype = DType::kF32;  // of its optimizer state
  DType dense_dtype = DType::kF32;         // of every dense layer's values
  DType dense_state_dtype = DType::kF32;   // of their optimizer state
  ModelOptions() {
    sparse_optimizer.kind = OptimizerOptions::Kind::kAdagrad;
    sparse_optimizer.lr = 0.05;
    dense_optimizer.kind = OptimizerOptions::Kind::kAdam;
    dense_optimizer.lr = 0.001;
  }
};

struct SecurityOptions {
  bool curve = false;                        // authenticate and encrypt with ZeroMQ CURVE
  std::vector<std::string> server_keys;      // per server: key pair PATH (PATH.key, PATH.pub)
  std::string client_key;                    // tools' key pair PATH; workers' without worker_keys
  std::vector<std::string> allowed_clients;  // public key files the servers admit
  // Per worker rank: key pair PATH. Empty (default): any admitted key may act as any worker.
  // Set: worker r connects with worker_keys[r], the servers admit these keys too, and a request
  // naming worker r is served only from worker r's key; allowed_clients keys act only as tools.
  std::vector<std::string> worker_keys;
  // Key pair PATHs of the operators' tools (checkpoint, scale, migrate, shutdown, export): with
  // curve, only these keys may send the operator's requests.
  std::vector<std::string> operator_keys;
  // Without curve a shard bound to an address other than loopback starts only with insecure,
  // stated: anyone who reaches its port then controls the job.
  enum class Mode { kDefault, kInsecure };
  Mode mode = Mode::kDefault;
};

struct MetricsOptions {
  bool enabled = false;     // serve /metrics and /healthz over HTTP
  std::string host = "127.0.0.1";
  uint32_t port = 9400;         // servers: port + rank
  uint32_t worker_port = 9500;  // workers: worker_port + rank
};

struct CheckpointOptions {
  std::string dir;             // where shards write checkpoints; empty: no checkpoints
  uint64_t every_steps = 0;    // when the slowest worker's clock reaches a multiple (0: never)
  int64_t every_seconds = 0;   // and/or this often (0: never)
  uint32_t keep = 3;           // newest checkpoints kept per shard
  bool restore = true;         // a starting shard loads its newest good checkpoint
  // Periodic and requested checkpoints are written in the background while the shard goes on
  // serving (false: on the request thread, which stops serving meanwhile). Shards with a
  // tiered table always write in the foreground.
  bool background = true;
  // In the background, a state whose tables take at most this many bytes is copied at the
  // checkpoint's moment and written by a thread; a larger one by a forked copy of the shard
  // (its pages shared copy-on-write). A fork costs its page tables and a page copied at each
  // first write while the child lives: more than copying a small state whole. 0: always fork.
  uint64_t copy_below = 32ull << 20;
  // Every full_every-th checkpoint is full; those between are deltas: the rows updated or
  // removed since the checkpoint before, and the whole of everything else (1: all full).
  uint32_t full_every = 1;
  // A worker's push log (what it must replay to a restarted shard) stays below this: a shard
  // also checkpoints whenever one worker has pushed max_log_bytes / (2 x shards) bytes to it
  // since its last checkpoint.
  uint64_t max_log_bytes = 2ull << 30;
  // Forced checkpoints (a Checkpoint request, a restarted worker) begin at most once per this
  // many ms; those asked sooner wait for it. Unset (-1): 1 s, or half of
  // cluster.request_timeout if that is less.
  int64_t min_interval_ms = -1;
  // How sparse rows' values and optimizer state are written (fulls and deltas alike): f32 as
  // held, or bf16 (rounded to nearest; widened when restored: a restart is then no longer bit
  // for bit). A row's clock word, dense slices and BSP's pending sums stay exact.
  bool bf16 = false;
};

struct WorkerOptions {
  std::string device = "cpu";  // cpu, cuda (device 0) or cuda:N
  bool tf32 = false;           // cuda: let cuBLAS use TF32 tensor cores for fp32 products
  // model: the step computes the model. none (benchmarks only): it computes nothing, and its
  // gradients are a fixed pattern of the model's shapes; every pull, push and tick is made as
  // with the model, so the rate is what the data and parameter-server path can feed a device.
  enum class Compute { kModel, kNone };
  Compute compute = Compute::kModel;
  uint32_t blas_threads = 1;   // OpenBLAS threads of a CPU worker
  // Threads a CPU worker splits each kernel over (a product's rows, a kernel's samples).
  uint32_t compute_threads = 1;
  bool pin_compute_threads = false;  // each compute thread kept to a core of its own
  uint64_t cache_rows = 0;     // ssp: sparse rows kept and reused within the staleness (0: off)
  // A step's pulls travel in one message per shard, and its pushes with the tick in another
  // (false: one message per request, the tick once the pushes are acknowledged).
  bool fuse_requests = true;
  // A worker role runs this program (and arguments) instead of the built-in trainer, in the
  // manifest's folder, with PARASOL_MANIFEST, PARASOL_WORKER and PARASOL_SUMMARY set (README,
  // "From Python"). Empty: the built-in trainer of `model`.
  std::vector<std::string> command;
  // Where the command runs: worker.command_dir (relative to the manifest's folder), by
  // default the manifest's folder. The renderings set it to the original manifest's folder.
  std::string command_dir;
};

// How values travel between workers and shards: f32, or 16-bit (pulled rows and dense weights
// without state, pushed gradients; rounded to nearest even; f16 scaled per message by a power of
// two so small gradients keep their bits). The shards apply every update in f32.
struct WireOptions {
  enum class Compression { kNone, kBf16, kF16 };
  Compression compression = Compression::kNone;
};

struct DataOptions {
  enum class Format { kCriteo, kLibsvm };
  enum class OnBadRow { kSkip, kFail };
  Format format = Format::kCriteo;
  std::vector<std::string> train;         // files; relative paths are from the manifest's folder
  std::string eval;                       // one file; empty: no evaluation
  OnBadRow on_bad_row = OnBadRow::kSkip;  // skip (and count) malformed rows, or stop on the first
  uint32_t queue_batches = 8;             // batches the reader thread prepares ahead
  uint32_t reader_threads = 1;            // threads that parse text rows
};

struct JobOptions {
  std::string name = "parasol";
  uint64_t seed = 2026;
};

struct Manifest {
  std::string source;  // file path, or a name for in-memory text
  JobOptions job;
  ClusterOptions cluster;
  ServerOptions server;
  TrainingOptions training;
  ModelOptions model;
  DataOptions data;
  WorkerOptions worker;
  WireOptions wire;
  SecurityOptions security;
  MetricsOptions metrics;
  CheckpointOptions checkpoint;
  // The tables listed in the manifest, then those the model needs (named "model.*").
  std::vector<TableOptions> tables;

  // Index of the table called `name`, or -1.
  int FindTable(const std::string& name) const;

  // Hash of the job-defining fields (cluster layout and tables; not bind or timeouts). A
  // worker and a shard talk only when their fingerprints agree.
  uint64_t Fingerprint() const;
  // Hash of the tables' definitions alone (the part of Fingerprint() that decides their
  // values): the same for jobs that differ only in where they run, so that their exported
  // models can be compared.
  uint64_t TablesFingerprint() const;
  // Whether overlapping failures roll the job back (training.on_overlapping_failure).
  bool RollsBack() const;
};

// The largest manifest file LoadManifest() reads; a larger one (or a device such as
// /dev/zero) is refused after at most this many bytes and one more.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;
// Table names: letters, digits, '_', '.' and '-', starting with a letter or '_', no "..", at
// most this long (they name the files of an export).
inline constexpr size_t kMaxTableNameLength = 128;

Result<Manifest> LoadManifest(const std::string& path);
Result<Manifest> ParseManifest(const std::string& text, const std::string& source);
// ParseManifest, adding to *asked the path of every key the parser asked for, present in the
// text or not ("tables[].optimizer.lr": list elements as "[]"). For tests: what they compare
// with the field table (common/manifest_fields.hpp). Recorded per thread.
Result<Manifest> ParseManifestRecordingKeys(const std::string& text, const std::string& source,
                                            std::set<std::string>* asked);

// "30s", "250ms", "2m", "1h" or a bare number of seconds. Returns milliseconds.
Result<int64_t> ParseDurationMs(const std::string& text);
// "4MiB", "1GiB", "512KiB", "1000" (bytes). Returns bytes.
Result<uint64_t> ParseBytes(const std::string& text);

}  // namespace parasol
