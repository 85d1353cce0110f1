#include "common/manifest_fields.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

namespace parasol {
namespace {

// The reference's text before the per-section tables (docs/manifest.md is generated whole:
// what is said once for every field lives here).
constexpr const char* kReferenceIntroduction = R"(# Manifest reference

One YAML file describes a whole job; every server, worker and tool of the job loads the same
one. `examples/manifest.yaml` is a commented manifest of two shards, a sparse and a dense
table, that names every field; `examples/criteo-dlrm.yaml` trains dlrm-small,
`examples/pushpull.yaml` runs the checked push/pull workload and `examples/torch-dlrm.yaml` a
Python worker.

This page and `examples/manifest.yaml` are generated from the table of fields in
`common/manifest_fields.cc` (`parasol manifest reference > docs/manifest.md`,
`parasol manifest example > examples/manifest.yaml`); `parasol manifest explain FIELD` prints
one entry (`parasol manifest explain training.batch_size`, `parasol manifest explain
tables.optimizer.lr`), or the fields of a section (`parasol manifest explain training`).

## Rules

- **Errors.** An unknown key, a wrong type or a bad value stops the program with
  `FILE:LINE:COLUMN: key 'a.b.c': what is wrong`, ended for a known key by the command that
  explains it (`(parasol manifest explain a.b.c)`); an unknown key that is a typo of a known
  one of its section says which (`unknown key (did you mean 'workers'?)`).
- **Durations** take `ms`, `s`, `m`, `h` (a bare number is seconds); **sizes** take `B`, `KiB`,
  `MiB`, `GiB` (a bare number is bytes).
- **Paths** (data files, `checkpoint.dir`, `server.disk_dir`, key files, `worker.command_dir`)
  are relative to the manifest's folder.
- **Optimizer fields.** A field that the chosen optimizer does not read is an error, as is
  `adagrad_rowwise` on a dense table or `admission`/`eviction` on a dense table.
- **One job, one manifest.** On connect, workers and shards compare the fingerprint of the
  job-defining fields (servers, workers, consistency, tables, model, `training.prefetch_depth`
  and `security.curve`); a mismatch is an error on both sides.
- **Defaults.** A field left out takes the default of its row; a default in code font is the
  YAML text that means the same as leaving the field out.
)";

// The example's dense table, after the sparse one that names every table field: the tour's
// second table, kept from before the example was generated.
constexpr const char* kExampleDenseTable =
    R"(  # A dense table: a tensor cut into contiguous slices across the shards.
  - name: mlp_top
    kind: dense
    shape: [64, 367]
    init: {kind: normal, mean: 0.0, stddev: 0.05}
    optimizer: {kind: sgd, lr: 0.01}
)";

class TableBuilder {
 public:
  void Section(std::string path, std::string type, std::string meaning) {
    ManifestField f;
    f.path = std::move(path);
    f.section = true;
    f.type = std::move(type);
    f.meaning = std::move(meaning);
    fields_.push_back(std::move(f));
  }
  // `example`: the example manifest's value when not the default ("# V": written commented).
  void Field(std::string path, std::string type, std::string default_value, std::string meaning,
             std::string example = "", std::string default_note = "") {
    ManifestField f;
    f.path = std::move(path);
    f.type = std::move(type);
    f.default_value = std::move(default_value);
    f.default_note = std::move(default_note);
    f.meaning = std::move(meaning);
    f.example = std::move(example);
    fields_.push_back(std::move(f));
  }

  // The fields of an optimizer at `prefix` (tables[].optimizer, model.sparse_optimizer, ...).
  // `example_kind` is the kind the example gives it: the fields that kind does not read are
  // written commented (the parser refuses them).
  void Optimizer(const std::string& prefix, const std::string& meaning,
                 const std::string& default_kind, const std::string& default_lr,
                 const std::string& example_kind, const std::string& example_lr,
                 const std::string& kind_note) {
    Section(prefix, "mapping", meaning);
    const std::map<std::string, std::vector<std::string>> reads = {
        {"sgd", {"lr", "weight_decay"}},
        {"adagrad", {"lr", "weight_decay", "eps", "initial_accumulator"}},
        {"adagrad_rowwise", {"lr", "weight_decay", "eps", "initial_accumulator"}},
        {"adam", {"lr", "weight_decay", "eps", "beta1", "beta2", "bias_correction"}},
        {"ftrl", {"weight_decay", "alpha", "beta", "l1", "l2"}},
    };
    const std::vector<std::string>& active = reads.at(example_kind);
    const auto example = [&](const std::string& key, const std::string& value,
                             const std::string& fallback) {
      const bool read = std::find(active.begin(), active.end(), key) != active.end();
      if (!read) return "# " + fallback;
      return value;
    };
    Field(prefix + ".kind", "one of sgd|adagrad|adagrad_rowwise|adam|ftrl", default_kind,
          "The update rule: `sgd`, `adagrad`, `adagrad_rowwise` (one accumulator per row: sparse "
          "tables only), `adam` or `ftrl`; each reads only its own fields." +
              kind_note,
          example_kind == default_kind ? "" : example_kind);
    Field(prefix + ".lr", "number, 0 to 1e6", default_lr,
          "The learning rate of `sgd`, `adagrad`, `adagrad_rowwise` and `adam`.",
          example("lr", example_lr == default_lr ? "" : example_lr, default_lr));
    Field(prefix + ".weight_decay", "number, 0 to 1e6", "0",
          "Every optimizer: the L2 coefficient, `g + weight_decay * w` is the gradient used.",
          example("weight_decay", "", "0"));
    Field(prefix + ".eps", "number, 1e-30 to 1", "1e-8",
          "`adagrad`, `adagrad_rowwise`, `adam`: added to the denominator.",
          example("eps", "", "1e-8"));
    Field(prefix + ".initial_accumulator", "number, 0 to 1e6", "0",
          "`adagrad`, `adagrad_rowwise`: the accumulator's starting value.",
          example("initial_accumulator", "", "0"));
    Field(prefix + ".beta1", "number, 0 to 0.999999", "0.9", "`adam`: decay of the first moment.",
          example("beta1", "", "0.9"));
    Field(prefix + ".beta2", "number, 0 to 0.999999999", "0.999",
          "`adam`: decay of the second moment.", example("beta2", "", "0.999"));
    Field(prefix + ".bias_correction", "true or false", "true",
          "`adam`: correct the moments' bias towards zero in the first steps.",
          example("bias_correction", "", "true"));
    Field(prefix + ".alpha", "number, 1e-12 to 1e6", "0.05", "`ftrl`: the learning rate.",
          example("alpha", "", "0.05"));
    Field(prefix + ".beta", "number, 0 to 1e6", "1.0",
          "`ftrl`: the learning rate's smoothing term.", example("beta", "", "1.0"));
    Field(prefix + ".l1", "number, 0 to 1e6", "0", "`ftrl`: L1 regularisation.",
          example("l1", "", "0"));
    Field(prefix + ".l2", "number, 0 to 1e6", "0", "`ftrl`: L2 regularisation.",
          example("l2", "", "0"));
  }

  std::vector<ManifestField> Take() { return std::move(fields_); }

 private:
  std::vector<ManifestField> fields_;
};

const char* const kDtypes = "one of f32|bf16|f16";

std::vector<ManifestField> BuildTable() {
  TableBuilder t;

  t.Section("job", "mapping", "The job as a whole.");
  t.Field("job.name", "string", "parasol", "A name for logs.", "ctr-example");
  t.Field("job.seed", "unsigned integer, 0 to 2^63-1", "2026",
          "Tables derive their seed from it and their name.");

  t.Section("cluster", "mapping",
            "Where the shards and workers are, and how long they wait for each other.");
  t.Field("cluster.servers", "list of host:port, 1 to 4096 entries", "required",
          "One `host:port` per shard, in rank order; shard I is started with `parasol server "
          "--manifest M --rank I`.",
          "[127.0.0.1:47400, 127.0.0.1:47401]");
  t.Field("cluster.initial_servers", "unsigned integer, 1 to the number of cluster.servers", "",
          "How many of `cluster.servers` hold keys at the start; the rest run holding none until "
          "`parasol scale --servers` adds them (a job whose shard count changes lists at most 256 "
          "shards).",
          "2", "every listed shard");
  t.Field("cluster.workers", "unsigned integer, 1 to 1048576", "1",
          "Number of worker processes at the start (ids `0..workers-1`).", "2");
  t.Field("cluster.max_workers", "unsigned integer, cluster.workers to 1048576", "",
          "Worker ranks the job may ever have: ranks from `workers` up join the running job (at "
          "most 2048 when above `workers`).",
          "2", "cluster.workers");
  t.Field("cluster.worker_hosts", "list of hosts, one per worker", "",
          "Where each worker runs, one host per worker (`cluster.workers` of them); "
          "informational.",
          "# [127.0.0.1, 127.0.0.1]", "none");
  t.Field("cluster.bind", "string", "\"\"",
          "Servers bind this host instead of their own (e.g. `0.0.0.0`); empty: each binds the "
          "host of its `cluster.servers` entry.");
  t.Field("cluster.connect_timeout", "duration (e.g. 30s)", "30s",
          "How long a worker waits for its servers to answer.");
  t.Field("cluster.request_timeout", "duration (e.g. 30s)", "30s",
          "A request with no reply by then is resent.");
  t.Field("cluster.restore_timeout", "duration (e.g. 30s)", "1h",
          "How long workers wait for a shard loading its checkpoint (while it moves), from the "
          "first time it says so.");
  t.Field("cluster.request_retries", "unsigned integer, 0 to 1000", "2",
          "Resends before a request fails.");
  t.Field("cluster.restart_servers", "true or false", "false",
          "`parasol launch` restarts a server that dies; needs `checkpoint.dir` with "
          "`checkpoint.restore: true` (a restarted server would come back empty).");
  t.Field("cluster.restart_workers", "true or false", "false",
          "`parasol launch` restarts a worker that dies.");

  t.Section("server", "mapping",
            "Each shard: its threads, its limits (what any client can make it keep; a request "
            "over one is refused with an error naming it, see "
            "[Hostile input](operations.md#hostile-input)) and the disk tier of tiered tables.");
  t.Field("server.engine_threads", "unsigned integer, 1 to 256", "2",
          "Engines per shard, each owning a disjoint key set, and as many threads: the request "
          "thread runs the first's part of each request, the others' parts go to the engine "
          "threads, and any part none of them has begun when the request thread is done with "
          "its own, the request thread runs too.");
  t.Field("server.apply_after_reply", "one of auto|always|never", "auto",
          "bsp: when a tick completes a clock, the shard applies the rows that the pulls it is "
          "about to answer read, answers them, and applies the clock's other rows after the "
          "reply, on a background thread of the lowest priority (`always`), or applies the whole "
          "clock before the reply (`never`). `auto`: `always` where the shard's process may keep "
          "more cores busy than `server.engine_threads` (its CPU affinity, within its cgroup's "
          "CPU quota), else `never`: without a core of its own the background pass takes the "
          "engines' time. On a host shared with workers that compute on its cores, it takes "
          "theirs, and `never` may be faster (see [How it works](internals.md#how-it-works), \"Answering a step's pulls "
          "first\"). Tables that evict rows or are tiered are applied whole either way. The model "
          "is the same, bit for bit.");
  t.Field("server.max_request_bytes", "size (e.g. 4MiB), at least 1KiB", "1GiB",
          "Payload one request may carry, and of the reply to one pull; larger is refused before "
          "any allocation.");
  t.Field("server.frame_bytes", "size (e.g. 4MiB), at least 4KiB", "1MiB",
          "Values travel in frames (dense requests in chunks) of at most this size.");
  t.Field("server.memory_budget", "size (e.g. 4MiB), at least 1KiB", "1GiB",
          "Per shard: what the memory tier of its tiered tables (`tables[].storage: tiered`) may "
          "hold, shared equally among them.");
  t.Field("server.disk_dir", "path", "\"\"",
          "Where each shard keeps the disk tier of its tiered tables (`DIR/shard-R`); relative "
          "to the manifest's folder.",
          "", "a folder under the system's temporary folder, removed when the shard stops");
  t.Field("server.max_held_pulls", "unsigned integer, 1 to 16777216", "1024",
          "Pulls of one worker held for the read bound at once.");
  t.Field("server.max_held_bytes", "size (e.g. 4MiB), at least 1KiB", "256MiB",
          "Request bytes of one worker's held pulls.");
  t.Field("server.max_pending_clocks", "unsigned integer, 2 to 65536", "4",
          "bsp: clocks whose pushes are being summed (a job needs 2).");
  t.Field("server.max_pending_bytes", "size (e.g. 4MiB), at least 1KiB", "2GiB",
          "bsp: memory of those sums (each worker's sums of a clock are held apart until the "
          "clock is applied, so a dense slice counts once per worker that pushed to it), "
          "counted as the sums need it: a part that grows past its first push may hold up to "
          "twice its sums. Applied clocks' sum buffers, kept for the next clocks, take at most "
          "a quarter of this on top.");
  t.Field("server.socket_hwm", "unsigned integer, 16 to 16777216", "1000",
          "Messages queued per peer and direction (ZeroMQ high-water marks).");
  t.Field("server.max_queued_reply_bytes",
          "size (e.g. 4MiB), at least 1MiB and server.max_request_bytes", "1GiB",
          "Replies sent but not yet taken by their peers, with the dense buffers they keep "
          "alive; the job's workers 11/16 (an equal part each), other peers a quarter (a "
          "sixteenth each).");
  t.Field("server.idle_timeout", "duration (e.g. 30s), above cluster.request_timeout, at most 24h",
          "",
          "How long a connection that is no worker's may send no well-formed request before it "
          "is shut.",
          "1m", "1m, or twice cluster.request_timeout if more");
  t.Field("server.max_connections", "unsigned integer, 16 to 1048576", "8192",
          "Connections open at once (and at most the open-file limit less an eighth, at least "
          "256); at the cap a newcomer takes the room of one that is no worker's.");

  t.Section("tables", "list of mappings, one per table",
            "One entry per table, for jobs that list their tables (a `model` section derives "
            "its own).");
  t.Field("tables[].name", "string: letters, digits, '_', '.' and '-', at most 128", "required",
          "The table's unique name; it starts with a letter or '_' and has no '..' (names "
          "become file names in an export; `model.*` is reserved for the model's tables).",
          "embeddings");
  t.Field("tables[].kind", "one of sparse|dense", "sparse",
          "`sparse` (rows created on first touch) or `dense` (a tensor).");
  t.Field("tables[].dim", "unsigned integer, 1 to 65536", "8", "Sparse tables: floats per row.",
          "16");
  t.Field("tables[].shape", "list of unsigned integers, at most 2^34 elements in all", "",
          "Dense tables: the tensor's shape, cut into contiguous slices across the shards.",
          "# [64, 367]", "required for dense tables");
  t.Field("tables[].dtype", kDtypes, "f32",
          "How values (sparse rows, dense elements) are stored; updates are computed in f32 and "
          "rounded when stored.");
  t.Field("tables[].state_dtype", kDtypes, "f32",
          "How optimizer state is stored (adam's step count stays 32-bit).");
  t.Field("tables[].rounding", "one of nearest|stochastic", "nearest",
          "How a 16-bit value is rounded when stored: `nearest` (ties to even) or `stochastic` "
          "(up with probability equal to the distance from the lower neighbour: small updates add "
          "up in expectation); initial and restored values always round to nearest. Each "
          "element's or row's draw depends on the table's seed, the write (a BSP clock's apply, "
          "or one push, named as exactly-once names it) and the element or key only, so under "
          "BSP a run and its restart round alike, whatever `engine_threads`; under SSP and ASP "
          "pushes are applied in the order they arrive, which varies.");
  t.Field("tables[].storage", "one of memory|tiered", "memory",
          "Sparse tables: `memory`, or `tiered` (rows beyond `server.memory_budget` on the "
          "shard's disk; see [Tables bigger than memory]"
          "(concepts.md#tables-bigger-than-memory)).");
  t.Field("tables[].seed", "unsigned integer, 0 to 2^63-1", "",
          "Initial values depend only on (seed, key) or (seed, element).", "17",
          "from job.seed and the table's name");
  t.Section("tables[].init", "mapping", "How the table's values start.");
  t.Field("tables[].init.kind", "one of zeros|constant|uniform|normal", "uniform",
          "`zeros`, `constant` (`value`), `uniform` (`scale`) or `normal` (`mean`, `stddev`).");
  t.Field("tables[].init.value", "number", "0", "`constant`: the value.");
  t.Field("tables[].init.scale", "number, at least 0", "0.01",
          "`uniform`: values in [-scale, scale).");
  t.Field("tables[].init.mean", "number", "0", "`normal`: the mean.");
  t.Field("tables[].init.stddev", "number, at least 0", "0.01",
          "`normal`: the standard deviation.");
  t.Optimizer("tables[].optimizer", "How the shards apply the table's gradients.", "sgd", "0.01",
              "sgd", "0.05", "");
  t.Section("tables[].admission", "mapping", "Sparse tables only: when a key's row is created.");
  t.Field("tables[].admission.min_count", "unsigned integer, 1 to 65535", "1",
          "A key's row is created at its n-th push; until then pulls return the initial value "
          "and pushes are only counted (1: rows are created on first touch, pull or push).");
  t.Section("tables[].eviction", "mapping", "Sparse tables only: when rows are removed.");
  t.Field("tables[].eviction.ttl_clocks", "unsigned integer, 0 to 2^40", "0",
          "Rows not updated in the last this many clocks are removed (0: never).", "", "off");
  t.Field("tables[].eviction.max_rows", "unsigned integer, 0 to 2^40", "0",
          "Per shard: the least recently updated rows are removed beyond this many (0: no "
          "limit).",
          "", "off");

  t.Section("model", "mapping",
            "The model a worker trains; its tables are derived from this section (servers and "
            "workers agree without listing them).");
  t.Field("model.kind", "one of none|lr|dlrm", "none",
          "`none` (the job serves tables for external workers), `lr` (logistic regression) or "
          "`dlrm`.");
  t.Field("model.embedding_dim", "unsigned integer, 1 to 4096", "16",
          "dlrm: d, the embeddings' width.");
  t.Field("model.bottom", "list of unsigned integers, 1 to 65536", "[64, 16]",
          "dlrm: the bottom layers' widths after the 13 dense inputs; the last is "
          "`embedding_dim`.");
  t.Field("model.top", "list of unsigned integers, 1 to 65536", "[64, 1]",
          "dlrm: the top layers' widths after the interaction; the last is 1 (the logit).");
  t.Field("model.embedding_init_scale", "number, 0 to 1000", "0.05",
          "Embeddings start uniform in [-scale, scale) (lr weights start at 0).");
  t.Optimizer("model.sparse_optimizer",
              "The optimizer of the sparse table: the embeddings (dlrm) or the weights (lr).",
              "adagrad", "0.05", "adagrad", "0.05",
              " Here the default is `adagrad` with `lr` 0.05.");
  t.Optimizer("model.dense_optimizer", "The optimizer of every dense layer.", "adam", "0.001",
              "adam", "0.001",
              " Here the default is `adam` with `lr` 0.001; not `adagrad_rowwise`.");
  t.Field("model.sparse_storage", "one of memory|tiered", "memory",
          "Storage of the sparse table (as `tables[].storage`).");
  t.Field("model.sparse_dtype", kDtypes, "f32",
          "How the sparse table's values are stored (as `tables[].dtype`).");
  t.Field("model.sparse_state_dtype", kDtypes, "f32",
          "How the sparse table's optimizer state is stored (as `tables[].state_dtype`).");
  t.Field("model.dense_dtype", kDtypes, "f32",
          "How the dense layers' values are stored (as `tables[].dtype`).");
  t.Field("model.dense_state_dtype", kDtypes, "f32",
          "How the dense layers' optimizer state is stored (as `tables[].state_dtype`).");

  t.Section("data", "mapping", "What the built-in trainer reads.");
  t.Field("data.format", "one of criteo|libsvm", "criteo", "The text format of the data files.");
  t.Field("data.train", "path, or non-empty list of paths", "",
          "The training files, relative to the manifest's folder; each is Criteo or libsvm "
          "text, or Criteo binary data from `parasol convert` (told by its first bytes).",
          "# [data/train.txt]", "none (required to train a model)");
  t.Field("data.eval", "path", "\"\"", "One file, evaluated by worker 0.", "", "none");
  t.Field("data.on_bad_row", "one of skip|fail", "skip",
          "A malformed row: `skip` (and count) it, or `fail` on the first.");
  t.Field("data.queue_batches", "unsigned integer, 1 to 1024", "8",
          "Batches the reader thread prepares ahead.");
  t.Field("data.reader_threads", "unsigned integer, 1 to 64", "1",
          "Threads that parse text rows: with more than one, one thread reads the lines and "
          "these parse whole batches at once; the batches are the same, in the same order, "
          "with any count. A binary file (`parasol convert`) needs no parsing.");

  t.Section("training", "mapping", "Steps, consistency and what happens when something fails.");
  t.Field("training.consistency", "one of bsp|ssp|asp", "bsp",
          "`bsp`, `ssp` or `asp` (see [Consistency](concepts.md#consistency)).");
  t.Field("training.staleness", "unsigned integer, 0 to 1048576", "0",
          "Only with `consistency: ssp`: how many clocks a worker may run ahead of the slowest "
          "(a worker at clock c reads once every worker is at c - staleness or later).",
          "# 1");
  t.Field("training.worker_timeout", "duration (e.g. 30s), positive", "120s",
          "A worker at the slowest clock, silent this long while nothing of it is held, is "
          "lost.");
  t.Field("training.on_worker_loss", "one of fail|continue", "fail",
          "`fail`: every job request gets an error naming the lost worker; `continue`: the job "
          "goes on without it.");
  t.Field("training.on_overlapping_failure", "one of rollback|fail", "",
          "Two failures that overlap so that updates are lost (a worker and a shard it pushed "
          "to die together, a worker dies between its ticks to two shards): `rollback` returns "
          "every shard to the newest checkpoint they all hold and every worker redoes its steps "
          "from there (only with `consistency: bsp`, `checkpoint.dir` and "
          "`checkpoint.every_steps`); `fail` stops the restarted worker with an error naming "
          "the loss (exit code 3, not restarted). Unset, the loss is reported (`lost_replays`, "
          "an error line) and the job goes on (see [How a job survives failures]"
          "(internals.md#how-a-job-survives-failures)).",
          "# fail",
          "rollback under bsp with checkpoint.dir and checkpoint.every_steps, else unset");
  t.Field("training.batch_size", "unsigned integer, 1 to 16777216", "256",
          "Samples per worker per step.");
  t.Field("training.epochs", "unsigned integer, 1 to 1048576", "1", "Passes over `data.train`.");
  t.Field("training.max_steps", "unsigned integer, 0 to 2^50", "0",
          "Stop each worker after this many steps (0: no limit).");
  t.Field("training.eval_every", "unsigned integer, 0 to 2^50", "0",
          "Evaluate every this many steps (0: at the end only).");
  t.Field("training.prefetch", "true or false", "true",
          "ssp (staleness 1 or more) and asp: pull the next batch's rows during compute.");
  t.Field("training.prefetch_depth", "unsigned integer, 1 to 64", "1",
          "With prefetch, ssp or asp only: pull the rows of the next k batches during compute, "
          "each at the clock of its step (at most `training.staleness` under ssp, since rows "
          "pulled k steps ahead miss the worker's own pushes of the k steps before them; not "
          "with `accumulate`). Shards admit requests up to k clocks past their sender's, so the "
          "depth is part of the job's fingerprint: shards, workers and checkpoints must agree "
          "on it.");
  t.Field("training.accumulate", "unsigned integer, 1 to 65536", "1",
          "Micro-batches of `batch_size` per step: their gradients, weighted by their sizes, are "
          "averaged and pushed once, with one tick (one step of `accumulate x batch_size` samples; "
          "no prefetch).");
  t.Field("training.on_nonfinite", "one of fail|skip", "fail",
          "A step whose loss or gradients are NaN or infinite: `fail` stops the worker naming "
          "the step and table; `skip` pushes nothing for it and counts it.");
  t.Field("training.progress_every", "duration (e.g. 30s)", "5s",
          "How often a worker prints its progress line.");

  t.Section("worker", "mapping", "How a worker computes and talks to the shards.");
  t.Field("worker.device", "one of cpu|cuda|cuda:N", "cpu",
          "Where a worker computes: `cuda` is device 0, `cuda:N` device N (see "
          "[GPU workers](internals.md#gpu-workers)); a worker asked for `cuda` on a machine "
          "without a usable GPU stops at start with the reason.");
  t.Field("worker.tf32", "true or false", "false",
          "On `cuda`: cuBLAS and cuBLASLt may use TF32 tensor cores for fp32 products (plain "
          "fp32 otherwise).");
  t.Field("worker.compute", "one of model|none", "model",
          "`none` (benchmarks only): the step computes nothing, and its gradients are a fixed "
          "pattern of the model's shapes; every pull, push and tick is made as with the model, "
          "so the rate is what the data and parameter-server path can feed a device "
          "(`scripts/bench.sh --only feed`).");
  t.Field("worker.blas_threads", "unsigned integer, 1 to 1024", "1",
          "OpenBLAS threads of a CPU worker, for each product (with `compute_threads` above 1, "
          "leave it at 1: each compute thread runs its own products).");
  t.Field("worker.compute_threads", "unsigned integer, 1 to 256", "1",
          "Threads a CPU worker splits each step's kernels over, its own included: a "
          "product's rows or columns, the interaction's samples, the gradient rows. Under BSP "
          "the shards wait while a worker computes, so on a host the job shares, as many as "
          "its cores (`docs/performance.md`). Each split is the same at every step, so a run "
          "repeats its results bit for bit at the same count.");
  t.Field("worker.pin_compute_threads", "true or false", "false",
          "With `compute_threads` above 1: keep the i-th compute thread (the worker's own first) "
          "to the i-th core the process could use at start, so that no two of them queue on one "
          "core while another is idle; the reader's threads still run on any. For one worker "
          "per host, or per set of cores given to it (a container's cpuset, `taskset`): workers "
          "pinned on one host share its first cores.");
  t.Field("worker.cache_rows", "unsigned integer, 0 to 2^40", "0",
          "ssp (staleness s >= 1): sparse rows a worker keeps and reuses while the read bound "
          "allows (a row read when the shard's slowest worker was at m answers pulls up to "
          "clock m + s); its own pushes reach its copies by SGD's rule, or drop them with "
          "another optimizer. Least recently used rows go first (0: off).");
  t.Field("worker.fuse_requests", "true or false", "true",
          "A step's pulls travel in one message per shard, and its pushes with the tick in "
          "another; `false`: one message per request (see [How it works]"
          "(internals.md#how-it-works)).");
  t.Field("worker.command", "program, or non-empty list: program, arguments", "",
          "Each worker role runs it instead of the built-in trainer, in `worker.command_dir`, "
          "with `PARASOL_MANIFEST` (absolute path), `PARASOL_WORKER` (rank), `PARASOL_SUMMARY` "
          "(where `launch` reads its summary, when asked for one) and `PARASOL_KEY` (`parasol "
          "worker --key`) set (see [Python API](python-api.md#worker-programs-in-python)).",
          "# [/usr/bin/python3, train.py]", "none: the built-in trainer of model");
  t.Field("worker.command_dir", "path", "\"\"",
          "Where `worker.command` runs (relative: to the manifest's folder); `parasol render` "
          "sets it to the original manifest's folder.",
          "", "the manifest's folder");

  t.Section("wire", "mapping", "How values travel.");
  t.Field("wire.compression", "one of none|bf16|f16", "none",
          "How values travel between workers and shards: `none` (f32), `bf16` or `f16` (f16 "
          "scaled per message; the shards apply every update in f32).");

  t.Section("checkpoint", "mapping",
            "Checkpoints and restores (see [Checkpoints, restarts and export]"
            "(operations.md#checkpoints-restarts-and-export)).");
  t.Field("checkpoint.dir", "path", "\"\"",
          "Where shards write checkpoints (relative to the manifest's folder).", "",
          "none: no checkpoints");
  t.Field("checkpoint.every_steps", "unsigned integer, 0 to 2^40", "0",
          "With `dir`: checkpoint when the slowest worker's clock reaches a multiple of this "
          "(0: never).");
  t.Field("checkpoint.every_seconds", "duration (e.g. 30s), whole seconds", "0",
          "With `dir`: checkpoint this often (0: never).");
  t.Field("checkpoint.keep", "unsigned integer, 1 to 1000", "3",
          "Newest checkpoints kept per shard.");
  t.Field("checkpoint.restore", "true or false", "true",
          "A starting shard loads its newest good checkpoint.");
  t.Field("checkpoint.background", "true or false", "true",
          "Write periodic and requested checkpoints in the background while the shard serves "
          "(`false`: on the request thread); shards with a tiered table always write in the "
          "foreground.");
  t.Field("checkpoint.copy_below", "size (e.g. 4MiB)", "32MiB",
          "In the background, a shard whose tables take at most this is copied at the "
          "checkpoint's moment and written by a thread; a larger one by a forked copy of the "
          "shard (0: always fork).");
  t.Field("checkpoint.full_every", "unsigned integer, 1 to 1000000", "1",
          "Every N-th checkpoint is full, those between are deltas (1: all full).");
  t.Field("checkpoint.max_log_bytes",
          "size (e.g. 4MiB), at least 1MiB and twice server.max_request_bytes", "2GiB",
          "Bound of a worker's push log: a shard also checkpoints whenever one worker has "
          "pushed max_log_bytes / (2 x shards) bytes to it since its last checkpoint.");
  t.Field("checkpoint.min_interval", "duration (e.g. 30s), 0 to 1h, below cluster.request_timeout",
          "",
          "Forced checkpoints (requested, for a restarted worker, or for the push log bound) "
          "begin at most once per this interval.",
          "1s", "1s, or half of cluster.request_timeout if less");
  t.Field("checkpoint.dtype", "one of f32|bf16", "f32",
          "How sparse rows' values and optimizer state are written: `f32`, or `bf16` (rounded "
          "to nearest, widened when restored; clock words, dense tensors and pending sums stay "
          "exact).");

  t.Section("metrics", "mapping",
            "The HTTP endpoints (see [Metrics](operations.md#metrics-health-logs-and-plots)).");
  t.Field("metrics.enabled", "true or false", "false", "Serve `/metrics` and `/healthz`.");
  t.Field("metrics.host", "string", "127.0.0.1", "Address the endpoints bind.");
  t.Field("metrics.port", "unsigned integer, 1 to 65535", "9400", "Server I listens on port + I.");
  t.Field("metrics.worker_port", "unsigned integer, 1 to 65535", "9500",
          "Worker J listens on worker_port + J.");

  t.Section("security", "mapping", "CURVE and roles (see [Security](operations.md#security)).");
  t.Field("security.curve", "true or false", "false",
          "Authenticate and encrypt with ZeroMQ CURVE.");
  t.Field("security.server_keys", "list of paths", "[]",
          "With curve (required there): a key pair PATH per server (PATH.key, PATH.pub).");
  t.Field("security.client_key", "path", "\"\"",
          "With curve (required there): the tools' key pair, and the workers' without "
          "`worker_keys`.");
  t.Field("security.allowed_clients", "list of paths", "[]",
          "With curve (required there): the public key files the servers admit.");
  t.Field("security.worker_keys", "list of paths", "[]",
          "Needs curve: a key pair per worker rank (`cluster.max_workers` of them); worker r "
          "then connects with its key and only its key may act as worker r (empty: no "
          "binding).");
  t.Field("security.operator_keys", "list of paths", "[]",
          "Needs curve: key pairs of the operators' tools; only they may checkpoint, stop, "
          "migrate or scale.");
  t.Field("security.mode", "one of default|insecure", "default",
          "`insecure`: a shard without curve may bind an address other than loopback (anyone "
          "who reaches its port then controls the job); contradicts `curve: true`.");
  return t.Take();
}

// "tables[].init.kind" -> "tables.init.kind": how paths are looked up and named in hints.
std::string WithoutIndices(std::string_view path) {
  std::string out;
  int depth = 0;
  for (char c : path) {
    if (c == '[') {
      ++depth;
    } else if (c == ']') {
      if (depth > 0) --depth;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

// The section a path is in: "tables[].init.kind" -> "tables[].init", "tables[].dim" ->
// "tables", "job" -> "".
std::string ParentOf(const std::string& path) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return "";
  std::string parent = path.substr(0, dot);
  if (parent.size() >= 2 && parent.compare(parent.size() - 2, 2, "[]") == 0) {
    parent.resize(parent.size() - 2);
  }
  return parent;
}

std::string LastComponent(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}


const std::map<std::string, size_t>& IndexByPlainPath() {
  static const std::map<std::string, size_t> index = [] {
    std::map<std::string, size_t> m;
    const std::vector<ManifestField>& fields = ManifestFields();
    for (size_t i = 0; i < fields.size(); ++i) m.emplace(WithoutIndices(fields[i].path), i);
    return m;
  }();
  return index;
}

// Markdown for a terminal or a YAML comment: `code` without its backticks, [text](link) as
// text.
std::string PlainText(const std::string& markdown) {
  std::string out;
  for (size_t i = 0; i < markdown.size(); ++i) {
    const char c = markdown[i];
    if (c == '`') continue;
    if (c == '[') {
      const size_t close = markdown.find("](", i);
      const size_t end = close == std::string::npos ? close : markdown.find(')', close);
      if (end != std::string::npos && markdown.find('[', i + 1) > close) {
        out += markdown.substr(i + 1, close - i - 1);
        i = end;
        continue;
      }
    }
    out += c;
  }
  return out;
}

// The default as a reader sees it: the YAML text, and what it amounts to where that says more.
std::string DefaultText(const ManifestField& f, bool markdown) {
  const std::string q = markdown ? "`" : "";
  if (f.default_value == "required") {
    return f.default_note.empty() ? "required" : "required (" + f.default_note + ")";
  }
  if (f.default_value.empty()) return f.default_note;
  std::string text = q + f.default_value + q;
  if (!f.default_note.empty()) text += " (" + f.default_note + ")";
  return text;
}

// A Markdown table cell: '|' would end it.
std::string Cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

// The first sentence of a meaning, as one line for a comment.
std::string FirstSentence(const std::string& text) {
  // A sentence ends at ". " before a capital ("(e.g. 0.0.0.0)" goes on).
  for (size_t end = text.find(". "); end != std::string::npos; end = text.find(". ", end + 1)) {
    const char next = end + 2 < text.size() ? text[end + 2] : ' ';
    if (next >= 'A' && next <= 'Z') return text.substr(0, end + 1);
  }
  return text;
}

// `text` in lines of at most `width` columns, each after `indent` spaces (for a terminal).
std::string Wrap(const std::string& text, size_t indent, size_t width = 96) {
  std::string out, line;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += std::string(indent, ' ') + line + "\n";
  return out;
}

bool IsDescendant(const std::string& path, const std::string& section) {
  for (std::string p = ParentOf(path); !p.empty(); p = ParentOf(p)) {
    if (p == section) return true;
  }
  return false;
}

class ExampleWriter {
 public:
  explicit ExampleWriter(const ManifestExampleOptions& options) : options_(options) {}

  // The lines of the fields of `section` (a top-level one: ""), at `indent`; `list_item`: the
  // first field starts a list element ("- ").
  void Children(const std::string& section, int indent, bool list_item, std::ostringstream& out,
                bool* any_active) {
    bool first = true;
    for (const ManifestField& f : ManifestFields()) {
      if (ParentOf(f.path) != section) continue;
      const std::string key = LastComponent(f.path);
      const std::string pad(indent, ' ');
      // A list element's first line carries "- "; the comment above it stays at its column.
      const std::string lead =
          list_item ? (first ? std::string(indent - 2, ' ') + "- " : pad) : pad;
      const std::string comment_pad = list_item && first ? std::string(indent - 2, ' ') : pad;
      if (f.section) {
        std::ostringstream body;
        bool active = false;
        Children(f.path, indent + 2, false, body, &active);
        out << comment_pad << "# " << PlainText(FirstSentence(f.meaning)) << "\n";
        out << lead << key << (active ? ":" : ": {}") << "\n" << body.str();
        *any_active = true;
        first = false;
        continue;
      }
      if (f.path == options_.omit) continue;
      std::string value = f.example.empty() ? f.default_value : f.example;
      if (f.path == options_.at_default && !f.default_value.empty() &&
          f.default_value != "required" && f.example.rfind("# ", 0) != 0) {
        value = f.default_value;
      }
      std::string comment = PlainText(FirstSentence(f.meaning));
      if (f.default_value == "required") {
        comment += " Required.";
      } else if (!f.example.empty() && f.example.rfind("# ", 0) != 0) {
        comment += " Default: " + PlainText(DefaultText(f, false)) + ".";
      }
      out << comment_pad << "# " << comment << "\n";
      if (value.rfind("# ", 0) == 0) {
        out << comment_pad << "# " << key << ": " << value.substr(2) << "\n";
        continue;
      }
      out << lead << key << ": " << value << "\n";
      *any_active = true;
      first = false;
    }
  }

 private:
  const ManifestExampleOptions& options_;
};

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

const std::vector<ManifestField>& ManifestFields() {
  static const std::vector<ManifestField> fields = BuildTable();
  return fields;
}

std::string ManifestFieldKey(std::string_view path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    out += path[i];
    if (path[i] != '[') continue;
    size_t j = i + 1;
    while (j < path.size() && path[j] >= '0' && path[j] <= '9') ++j;
    if (j < path.size() && path[j] == ']') i = j - 1;  // the digits go; ']' is copied next
  }
  return out;
}

const ManifestField* FindManifestField(std::string_view path) {
  const auto& index = IndexByPlainPath();
  const auto it = index.find(WithoutIndices(path));
  return it == index.end() ? nullptr : &ManifestFields()[it->second];
}

std::vector<std::string> NearestManifestFields(std::string_view path, size_t count) {
  const std::string query = WithoutIndices(path);
  const std::string last = LastComponent(query);
  // A typo is a few edits of the path, or of its last component (`batchsize`, or a field
  // named in the wrong section).
  const size_t path_limit = std::max<size_t>(2, query.size() / 4);
  const size_t last_limit = std::max<size_t>(1, last.size() / 3);
  std::vector<std::pair<size_t, std::string>> near;
  for (const auto& [plain, i] : IndexByPlainPath()) {
    const size_t by_path = EditDistance(query, plain);
    const size_t by_last = EditDistance(last, LastComponent(plain));
    if (by_path <= path_limit) {
      near.emplace_back(by_path, plain);
    } else if (by_last <= last_limit) {
      near.emplace_back(by_last + (query == last ? 0 : 1), plain);
    }
  }
  std::stable_sort(near.begin(), near.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < near.size() && out.size() < count; ++i) out.push_back(near[i].second);
  return out;
}

std::string ManifestExplainHint(std::string_view path) {
  const ManifestField* f = FindManifestField(path);
  if (f == nullptr) return "";
  return " (parasol manifest explain " + WithoutIndices(f->path) + ")";
}

std::string ExplainManifestField(const ManifestField& field) {
  std::ostringstream out;
  if (field.section) {
    out << field.path << ": " << field.type << "\n" << Wrap(PlainText(field.meaning), 2) << "\n";
    size_t width = 0;
    for (const ManifestField& f : ManifestFields()) {
      if (IsDescendant(f.path, field.path)) width = std::max(width, f.path.size());
    }
    for (const ManifestField& f : ManifestFields()) {
      if (!IsDescendant(f.path, field.path)) continue;
      out << "  " << f.path << std::string(width + 2 - f.path.size(), ' ') << f.type;
      if (!f.section) out << "; default: " << DefaultText(f, false);
      out << "\n";
    }
    out << "\nparasol manifest explain FIELD prints a field's meaning.\n";
    return out.str();
  }
  out << field.path << "\n"
      << "  type:    " << field.type << "\n"
      << "  default: " << DefaultText(field, false) << "\n"
      << Wrap(PlainText(field.meaning), 2);
  return out.str();
}

std::string ManifestReferenceMarkdown() {
  std::ostringstream out;
  out << kReferenceIntroduction;
  for (const ManifestField& section : ManifestFields()) {
    if (!section.section || !ParentOf(section.path).empty()) continue;
    out << "\n## `" << section.path << "`\n\n"
        << section.meaning << "\n\n"
        << "| field | type | default | meaning |\n|---|---|---|---|\n";
    for (const ManifestField& f : ManifestFields()) {
      if (!IsDescendant(f.path, section.path)) continue;
      out << "| `" << f.path << "` | " << Cell(f.type) << " | "
          << Cell(f.section ? "" : DefaultText(f, true)) << " | " << Cell(f.meaning) << " |\n";
    }
  }
  return out.str();
}

std::string ManifestExampleYaml(const ManifestExampleOptions& options) {
  std::ostringstream out;
  out << "# A Parasol job manifest that names every field this version reads, each with its\n"
         "# meaning: two shards on this machine, a sparse and a dense table. A field shown as a\n"
         "# comment does not apply to this job as it stands (another optimizer's field, an ssp\n"
         "# field). Generated from the table in common/manifest_fields.cc by\n"
         "#   parasol manifest example > examples/manifest.yaml\n"
         "# `parasol manifest explain FIELD` prints a field's type, default and meaning; the\n"
         "# reference is docs/manifest.md. Unknown keys, wrong types and bad values are errors\n"
         "# that name the file, line and key.\n";
  ExampleWriter writer(options);
  // The tables last: the longest section, after the settings of the job as a whole.
  for (const bool tables : {false, true}) {
    for (const ManifestField& section : ManifestFields()) {
      if (!section.section || !ParentOf(section.path).empty()) continue;
      if ((section.path == "tables") != tables) continue;
      std::ostringstream body;
      bool active = false;
      const bool list = section.path == "tables";
      writer.Children(section.path, list ? 4 : 2, list, body, &active);
      out << "\n# " << PlainText(FirstSentence(section.meaning)) << "\n"
          << section.path << (active ? ":" : ": {}") << "\n"
          << body.str();
      if (list) out << "\n" << kExampleDenseTable;
    }
  }
  return out.str();
}

}  // namespace parasol
