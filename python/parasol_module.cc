// The Python module `parasol._parasol`: the manifest, the parameter-server client and the data
// reader, on NumPy arrays. python/parasol/__init__.py is the public face (docs/python-api.md).
//
// Every call that waits on the network releases the GIL and takes the client's own lock (a
// PsClient serves one thread at a time); while it waits, a pending Ctrl-C ends the wait with
// KeyboardInterrupt (the ticket stays outstanding: wait on it again, or close the client). The
// arrays a request reads or writes stay referenced until its ticket completes or the client is
// closed: the shards may still answer into them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/manifest.hpp"
#include "common/model_tables.hpp"
#include "worker/batch.hpp"
#include "worker/data_reader.hpp"
#include "worker/metrics.hpp"
#include "worker/ps_client.hpp"

namespace py = pybind11;

namespace parasol::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using KeyArray = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

// `text` as valid UTF-8: each byte that is not part of a well-formed sequence becomes \xNN.
// Python builds its exceptions' and strings' text from UTF-8; a message quoting a row of
// binary data would otherwise raise UnicodeDecodeError in place of the error itself.
std::string ValidUtf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len > 1) {
      // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
      uint32_t cp = c & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3f);
      static constexpr uint32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kLeast[len] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
      ++i;
    }
  }
  return out;
}

// A failed Status as a Python exception carrying its text.
class Error : public std::runtime_error {
 public:
  explicit Error(const Status& s) : std::runtime_error(ValidUtf8(s.ToString())) {}
};

void Check(const Status& s) {
  if (!s.ok()) throw Error(s);
}
template <typename T>
T Check(Result<T> r) {
  if (!r.ok()) throw Error(r.status());
  return std::move(*r);
}

const char* KindName(TableKind k) { return k == TableKind::kSparse ? "sparse" : "dense"; }

const char* ConsistencyName(TrainingOptions::Consistency c) {
  switch (c) {
    case TrainingOptions::Consistency::kBsp: return "bsp";
    case TrainingOptions::Consistency::kSsp: return "ssp";
    case TrainingOptions::Consistency::kAsp: return "asp";
  }
  return "?";
}

const char* OptimizerName(OptimizerOptions::Kind k) {
  switch (k) {
    case OptimizerOptions::Kind::kSgd: return "sgd";
    case OptimizerOptions::Kind::kAdagrad: return "adagrad";
    case OptimizerOptions::Kind::kAdagradRowwise: return "adagrad_rowwise";
    case OptimizerOptions::Kind::kAdam: return "adam";
    case OptimizerOptions::Kind::kFtrl: return "ftrl";
  }
  return "?";
}

py::dict OptimizerDict(const OptimizerOptions& o) {
  py::dict d;
  d["kind"] = OptimizerName(o.kind);
  d["lr"] = o.lr;
  d["weight_decay"] = o.weight_decay;
  d["eps"] = o.eps;
  d["initial_accumulator"] = o.initial_accumulator;
  d["beta1"] = o.beta1;
  d["beta2"] = o.beta2;
  d["bias_correction"] = o.bias_correction;
  d["alpha"] = o.alpha;
  d["beta"] = o.beta;
  d["l1"] = o.l1;
  d["l2"] = o.l2;
  return d;
}

// A request's arrays, kept alive while the shards may still read or write them.
struct Ticket {
  uint64_t id = 0;
  const void* owner = nullptr;   // the Client that made it
  py::object result;             // what wait() returns (the output array), or None
  std::vector<py::object> keep;  // arrays the request reads
  bool done = false;
  std::optional<Status> failure;  // how its wait failed
};

// A shape from its sizes, as Python prints it: "(2, 8)", "(16,)".
std::string ShapeOf(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}
// An array's shape.
std::string ShapeOf(const py::array& a) {
  return ShapeOf(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

// The array a pull writes into: `out` itself (never a converted copy, which the caller would
// not see), or a new one of `shape`.
FloatArray OutArray(const py::object& out, const std::vector<py::ssize_t>& shape, uint64_t floats,
                    const std::string& table) {
  if (out.is_none()) return FloatArray(shape);
  const std::string want = "out: expected a writable float32 C-contiguous array of shape " +
                           ShapeOf(shape) + " (" + std::to_string(floats) +
                           " floats) for table '" + table + "', got ";
  if (!py::isinstance<py::array>(out)) {
    throw Error(InvalidArgument(want + std::string(py::str(py::type::of(out).attr("__name__")))));
  }
  auto given = py::reinterpret_borrow<py::array>(out);
  const std::string got = "an array of dtype " + std::string(py::str(given.dtype())) +
                          " and shape " + ShapeOf(given);
  if (!py::array_t<float, py::array::c_style>::check_(out)) {
    throw Error(InvalidArgument(want + got + (given.dtype().is(py::dtype::of<float>())
                                                  ? ", not C-contiguous"
                                                  : "")));
  }
  auto a = py::reinterpret_borrow<FloatArray>(out);
  if (!a.writeable()) throw Error(InvalidArgument(want + got + ", read-only"));
  if (static_cast<uint64_t>(a.size()) != floats) throw Error(InvalidArgument(want + got));
  return a;
}

// Keys as uint64: unsigned or signed integers (negative ones as their two's complement, as
// C++ would convert them), never floats or booleans (a silent truncation).
// `keys` as 64-bit ids: a NumPy integer array, or any sequence of integers (a list, a tuple, a
// range; Python or NumPy integers, negative ones as their two's complement, as C++ converts
// them). Anything else (floats, bools, strings, sets, mappings, iterators) is a TypeError
// naming the argument; an integer outside [-2^63, 2^64) a ValueError.
KeyArray Keys(const py::object& keys) {
  if (py::isinstance<py::array>(keys)) {
    py::array array = py::reinterpret_borrow<py::array>(keys);
    const char kind = array.dtype().kind();
    if (kind != 'u' && kind != 'i') {
      throw py::type_error("keys: expected integers, got an array of dtype " +
                           std::string(py::str(array.dtype())));
    }
    return KeyArray::ensure(array);
  }
  const std::string type = py::str(py::type::of(keys).attr("__name__"));
  if (py::isinstance<py::str>(keys) || py::isinstance<py::bytes>(keys) ||
      !PySequence_Check(keys.ptr())) {
    throw py::type_error("keys: expected a sequence of integers (a list, or a NumPy integer "
                         "array), got " + type);
  }
  // Element by element: NumPy would turn [2**63, -1] into floats and [1, True] into [1, 1].
  py::sequence items = py::reinterpret_borrow<py::sequence>(keys);
  const size_t n = py::len(items);
  KeyArray out(static_cast<py::ssize_t>(n));
  uint64_t* dst = out.mutable_data();
  const py::module_ numpy = py::module_::import("numpy");
  const py::object numpy_bool = numpy.attr("bool_"), numpy_integer = numpy.attr("integer");
  for (size_t i = 0; i < n; ++i) {
    py::object item = items[i];
    const bool integer = !py::isinstance<py::bool_>(item) && !py::isinstance(item, numpy_bool) &&
                         (py::isinstance<py::int_>(item) || py::isinstance(item, numpy_integer));
    if (!integer) {
      throw py::type_error("keys: element " + std::to_string(i) + " is " +
                           std::string(py::str(py::type::of(item).attr("__name__"))) +
                           ", not an integer");
    }
    py::int_ value(item);
    const unsigned long long u = PyLong_AsUnsignedLongLong(value.ptr());
    if (!PyErr_Occurred()) {
      dst[i] = u;
      continue;
    }
    PyErr_Clear();
    const long long s = PyLong_AsLongLong(value.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error("keys: element " + std::to_string(i) + " (" +
                            std::string(py::str(item)) + ") is outside [-2^63, 2^64)");
    }
    dst[i] = static_cast<uint64_t>(s);
  }
  return out;
}

// Refuses a sparse request whose bytes no set of shards would take, before its arrays are
// made or anything is sent: the client splits a request by shard, and each shard refuses a
// share over server.max_request_bytes (the keys it carries, or the rows of its reply), so a
// request over that limit times every shard has a share no shard would take. (Checked here
// on the key count; a request under it may still be refused by a shard that holds more than
// its share of the keys.)
void CheckRequestSize(const PsClient& c, const TableOptions& t, uint64_t keys, const char* op,
                      uint64_t bytes_per_key) {
  const uint64_t limit = c.manifest().server.max_request_bytes;
  const uint64_t shards = std::max<uint32_t>(1, c.num_shards());
  uint64_t all = 0, bytes = 0;
  if (__builtin_mul_overflow(limit, shards, &all)) all = UINT64_MAX;
  const bool wraps = __builtin_mul_overflow(keys, bytes_per_key, &bytes);
  if (!wraps && bytes <= all) return;
  throw Error(ResourceExhausted(
      std::string(op) + " of " + std::to_string(keys) + " keys of table '" + t.name + "' takes " +
      (wraps ? std::string("over 2^64") : std::to_string(bytes)) + " bytes (" + std::to_string(bytes_per_key) + " a key), over the limit of " +
      std::to_string(limit) + " bytes (server.max_request_bytes) on each of its " +
      std::to_string(shards) + " shards; split it into smaller requests"));
}

class Client {
 public:
  Client(const Manifest& manifest, uint32_t worker_id, const std::string& key_path) {
    // A Ctrl-C (any Python signal handler) is noticed every 100 ms of a wait, from the
    // handshake on. Its handler runs here, with the client's lock held by this thread: a
    // handler that uses this client gets an error instead of a deadlock (see Enter()).
    auto interrupt = [this] {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return Status::Ok();
      interrupted_ = true;  // the Python error is set; the caller raises it
      return FailedPrecondition("interrupted");
    };
    Result<std::unique_ptr<PsClient>> c = [&] {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      Busy busy(this);
      return PsClient::Connect(manifest, worker_id, key_path, interrupt);
    }();
    RaiseIfInterrupted();
    client_ = Check(std::move(c));
  }

  ~Client() {
    // The client first: its sockets may still read or write the tickets' arrays.
    py::gil_scoped_release release;
    client_.reset();
  }

  uint32_t TableId(const py::object& table) {
    return Locked([&](PsClient& c) { return TableIdOf(c, table); });
  }

  std::shared_ptr<Ticket> PullSparseAsync(const py::object& table, const py::object& key_array,
                                          const py::object& out, bool prefetch, bool read_only) {
    const KeyArray keys = Keys(key_array);
    return Locked([&](PsClient& c) {
      const uint32_t id = TableIdOf(c, table);
      const TableOptions& t = c.manifest().tables[id];
      if (t.kind != TableKind::kSparse) {
        throw Error(InvalidArgument("table '" + t.name + "' is dense"));
      }
      const size_t n = static_cast<size_t>(keys.size());
      // A key goes out as 8 bytes and its row comes back as dim floats.
      CheckRequestSize(c, t, n, prefetch ? "prefetch_sparse" : "pull_sparse",
                       std::max<uint64_t>(8, uint64_t{4} * t.dim));
      FloatArray rows = OutArray(out, {static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(t.dim)},
                                 n * t.dim, t.name);
      auto ticket = NewTicket(rows);
      const std::span<const uint64_t> k(keys.data(), n);
      float* dst = rows.mutable_data();
      ticket->id = prefetch ? Check(c.PrefetchSparseAsync(id, k, dst))
                            : Check(c.PullSparseAsync(id, k, dst, false, read_only));
      return Track(ticket);  // keys are copied by the client
    });
  }

  std::shared_ptr<Ticket> PushSparseAsync(const py::object& table, const py::object& key_array,
                                          const FloatArray& grads) {
    const KeyArray keys = Keys(key_array);
    return Locked([&](PsClient& c) {
      const uint32_t id = TableIdOf(c, table);
      const TableOptions& t = c.manifest().tables[id];
      const size_t n = static_cast<size_t>(keys.size());
      if (t.kind != TableKind::kSparse) {
        throw Error(InvalidArgument("table '" + t.name + "' is dense"));
      }
      CheckRequestSize(c, t, n, "push_sparse", 8 + uint64_t{4} * t.dim);
      if (static_cast<size_t>(grads.size()) != n * t.dim) {
        throw Error(InvalidArgument(
            "grads: expected shape (" + std::to_string(n) + ", " + std::to_string(t.dim) +
            ") for " + std::to_string(n) + " keys of table '" + t.name + "' (dim " +
            std::to_string(t.dim) + "), got shape " + ShapeOf(grads) + " (" +
            std::to_string(grads.size()) + " floats)"));
      }
      auto ticket = NewTicket(py::none());
      const std::span<const uint64_t> k(keys.data(), n);
      const std::span<const float> g(grads.data(), static_cast<size_t>(grads.size()));
      ticket->id = Check(c.PushSparseAsync(id, k, g));  // copied by the client
      return Track(ticket);
    });
  }

  std::shared_ptr<Ticket> PullDenseAsync(const py::object& table, const py::object& out) {
    return Locked([&](PsClient& c) {
      const uint32_t id = TableIdOf(c, table);
      const TableOptions& t = c.manifest().tables[id];
      if (t.kind != TableKind::kDense) {
        throw Error(InvalidArgument("table '" + t.name + "' is sparse"));
      }
      std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
      FloatArray values = OutArray(out, shape, t.NumElements(), t.name);
      auto ticket = NewTicket(values);
      ticket->id = Check(c.PullDenseAsync(id, values.mutable_data()));
      return Track(ticket);
    });
  }

  std::shared_ptr<Ticket> PushDenseAsync(const py::object& table, const FloatArray& grads) {
    return Locked([&](PsClient& c) {
      const uint32_t id = TableIdOf(c, table);
      const TableOptions& t = c.manifest().tables[id];
      if (t.kind != TableKind::kDense) {
        throw Error(InvalidArgument("table '" + t.name + "' is sparse"));
      }
      if (static_cast<uint64_t>(grads.size()) != t.NumElements()) {
        const std::string want =
            ShapeOf(std::vector<py::ssize_t>(t.shape.begin(), t.shape.end()));
        throw Error(InvalidArgument("grads: expected shape " + want + " for table '" + t.name +
                                    "' (" + std::to_string(t.NumElements()) +
                                    " floats), got shape " + ShapeOf(grads) + " (" +
                                    std::to_string(grads.size()) + " floats)"));
      }
      // The client sends a dense gradient from the caller's memory: a copy of our own, so the
      // caller may change or drop its array at once (as with sparse pushes).
      FloatArray copy(grads.size());
      std::memcpy(copy.mutable_data(), grads.data(), sizeof(float) * grads.size());
      auto ticket = NewTicket(py::none());
      ticket->keep.push_back(copy);
      ticket->id = Check(c.PushDenseAsync(id, {copy.data(), static_cast<size_t>(copy.size())}));
      return Track(ticket);
    });
  }

  std::shared_ptr<Ticket> TickAsync() {
    return Locked([&](PsClient& c) {
      auto ticket = NewTicket(py::none());
      ticket->id = Check(c.TickAsync());
      return Track(ticket);
    });
  }

  py::object Wait(const std::shared_ptr<Ticket>& ticket) {
    if (ticket->owner != this) {
      throw Error(InvalidArgument("ticket " + std::to_string(ticket->id) +
                                  " belongs to another client"));
    }
    Status st = Blocking([&](PsClient& c) -> Status {
      // Checked under the lock: another thread may have completed it meanwhile.
      if (ticket->done) return Status::Ok();
      Status s = c.Wait(ticket->id);
      if (interrupted_) return s;  // still outstanding: waiting again completes it
      ticket->done = true;
      tracked_.erase(ticket->id);
      if (!s.ok()) {
        // The client may still hold replies for it: its arrays live until close().
        ticket->failure = s;
        retired_.push_back(ticket);
      }
      return s;
    });
    if (ticket->failure) throw Error(*ticket->failure);
    Check(st);
    return ticket->result;
  }

  py::object WaitAll(const std::vector<std::shared_ptr<Ticket>>& tickets) {
    py::list out;
    for (const auto& t : tickets) out.append(Wait(t));
    return out;
  }

  void BeginStep() { Locked([](PsClient& c) { c.BeginStep(); return 0; }); }
  void SendStep() { Locked([](PsClient& c) { c.SendStep(); return 0; }); }
  void Tick() { Check(Blocking([](PsClient& c) { return c.Tick(); })); }
  void Leave() { Check(Blocking([](PsClient& c) { return c.Leave(); })); }
  void Barrier(int64_t id) { Check(Blocking([&](PsClient& c) { return c.Barrier(id); })); }
  void Checkpoint() { Check(Blocking([](PsClient& c) { return c.Checkpoint(); })); }
  void Shutdown() { Check(Blocking([](PsClient& c) { return c.Shutdown(); })); }

  py::list Stats() {
    Result<std::vector<std::string>> stats = Blocking([](PsClient& c) { return c.Stats(); });
    py::object loads = py::module_::import("json").attr("loads");
    py::list out;
    for (const std::string& s : Check(std::move(stats))) out.append(loads(s));
    return out;
  }

  void Close() {
    std::unique_ptr<PsClient> c;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      if (busy_ == std::this_thread::get_id()) {
        throw Error(FailedPrecondition("close() from a signal handler while the client waits"));
      }
      c = std::move(client_);
      c.reset();  // closes the sockets: nothing reads or writes the tickets' arrays any more
    }
    tracked_.clear();
    retired_.clear();
  }

  // A property of the open client, read under its lock.
  template <typename F>
  auto Get(F f) -> decltype(f(std::declval<PsClient&>())) {
    return Locked(f);
  }

  size_t outstanding() const { return tracked_.size(); }

 private:
  // Marks the thread that holds mu_ (Enter() refuses a call from it: a signal handler that
  // runs while this thread waits).
  struct Busy {
    explicit Busy(Client* c) : c(c) { c->busy_ = std::this_thread::get_id(); }
    ~Busy() { c->busy_ = std::thread::id(); }
    Client* c;
  };

  // Takes the client's lock (without the GIL, so a thread that waits on the network holding it
  // can take the GIL meanwhile) and returns the open client.
  PsClient& Enter(std::unique_lock<std::mutex>& lock) {
    if (busy_ == std::this_thread::get_id()) {
      throw Error(FailedPrecondition(
          "this client is waiting in this thread (a signal handler may not use it)"));
    }
    {
      py::gil_scoped_release release;
      lock.lock();
    }
    if (!client_) throw Error(FailedPrecondition("the client is closed"));
    return *client_;
  }

  // Runs `f` on the client under its lock, with the GIL held (calls that do not wait).
  template <typename F>
  auto Locked(F f) -> decltype(f(std::declval<PsClient&>())) {
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    PsClient& c = Enter(lock);
    Busy busy(this);
    return f(c);
  }

  // Runs `f`, which waits on the network, without the GIL. A signal whose handler raises
  // (Ctrl-C: KeyboardInterrupt) ends the wait with that exception; the requests it waited on
  // stay outstanding, and their arrays alive.
  template <typename F>
  auto Blocking(F f) -> decltype(f(std::declval<PsClient&>())) {
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    PsClient& c = Enter(lock);
    Busy busy(this);
    interrupted_ = false;
    std::optional<decltype(f(c))> result;
    {
      py::gil_scoped_release release;
      result.emplace(f(c));
    }
    RaiseIfInterrupted();
    return std::move(*result);
  }

  void RaiseIfInterrupted() {
    if (!interrupted_) return;
    interrupted_ = false;
    throw py::error_already_set();
  }

  uint32_t TableIdOf(PsClient& c, const py::object& table) const {
    if (py::isinstance<py::bool_>(table)) throw py::type_error("table: a name or an id, not a bool");
    if (py::isinstance<py::int_>(table)) {
      const int64_t id = table.cast<int64_t>();
      const size_t n = c.manifest().tables.size();
      if (id < 0 || static_cast<uint64_t>(id) >= n) {
        throw py::index_error("table id " + std::to_string(id) + " is out of range: the job has " +
                              std::to_string(n) + " tables");
      }
      return static_cast<uint32_t>(id);
    }
    return Check(c.TableId(table.cast<std::string>()));
  }

  std::shared_ptr<Ticket> NewTicket(py::object result) {
    auto t = std::make_shared<Ticket>();
    t->owner = this;
    t->result = std::move(result);
    return t;
  }

  std::shared_ptr<Ticket> Track(std::shared_ptr<Ticket> t) {
    tracked_[t->id] = t;
    return t;
  }

  // Declared before client_, so destroyed after it: the client's sockets may use their arrays.
  // Not yet waited on (also those whose wait was interrupted).
  std::map<uint64_t, std::shared_ptr<Ticket>> tracked_;
  std::vector<std::shared_ptr<Ticket>> retired_;  // failed waits: kept until close()
  std::mutex mu_;
  std::atomic<std::thread::id> busy_{};
  bool interrupted_ = false;
  std::unique_ptr<PsClient> client_;
};

// A batch as NumPy arrays (copies of the reader's vectors, owned by the arrays).
py::dict BatchDict(Batch&& b) {
  auto own = [](auto&& v) {
    using V = std::decay_t<decltype(v)>;
    auto* heap = new V(std::move(v));
    py::capsule free(heap, [](void* p) { delete static_cast<V*>(p); });
    return py::array(static_cast<py::ssize_t>(heap->size()), heap->data(), free);
  };
  const py::ssize_t n = b.size;
  py::dict d;
  d["size"] = b.size;
  d["labels"] = own(std::move(b.labels));
  d["dense"] = own(std::move(b.dense)).attr("reshape")(n, static_cast<py::ssize_t>(kCriteoDenseFeatures));
  d["keys"] = own(std::move(b.keys));
  d["values"] = own(std::move(b.values));
  d["offsets"] = own(std::move(b.offsets));
  return d;
}

class Reader {
 public:
  Reader(std::vector<std::string> files, uint32_t batch_size, uint32_t epochs, uint32_t rank,
         uint32_t workers, const std::string& format, bool has_label, bool fail_on_bad_row) {
    if (files.empty()) throw Error(InvalidArgument("BatchReader: no files"));
    if (batch_size == 0) throw Error(InvalidArgument("BatchReader: batch_size must be > 0"));
    if (workers == 0 || rank >= workers) {
      throw Error(InvalidArgument("BatchReader: rank " + std::to_string(rank) +
                                  " is not below workers " + std::to_string(workers)));
    }
    ReaderOptions o;
    if (format == "criteo") {
      o.format = DataOptions::Format::kCriteo;
    } else if (format == "libsvm") {
      o.format = DataOptions::Format::kLibsvm;
    } else {
      throw Error(InvalidArgument("BatchReader: format must be criteo or libsvm, got '" + format + "'"));
    }
    o.files = std::move(files);
    o.batch_size = batch_size;
    o.epochs = epochs;
    o.rank = rank;
    o.workers = workers;
    o.has_label = has_label;
    o.on_bad_row = fail_on_bad_row ? DataOptions::OnBadRow::kFail : DataOptions::OnBadRow::kSkip;
    reader_ = std::make_unique<BatchReader>(std::move(o));
  }

  py::object Next() {
    Result<std::optional<Batch>> b = [&] {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);  // BatchReader::Next has one consumer at a time
      return reader_->Next();
    }();
    std::optional<Batch> batch = Check(std::move(b));
    if (!batch) throw py::stop_iteration();
    return BatchDict(std::move(*batch));
  }

  uint64_t bad_rows() const { return reader_->bad_rows(); }
  uint64_t rows_read() const { return reader_->rows_read(); }
  std::string first_bad_row() const { return ValidUtf8(reader_->first_bad_row()); }

 private:
  std::mutex mu_;
  std::unique_ptr<BatchReader> reader_;
};

}  // namespace
}  // namespace parasol::python

PYBIND11_MODULE(_parasol, m) {
  using namespace parasol;
  using namespace parasol::python;
  m.doc() = "Parasol's parameter-server client, manifest and data reader (see the parasol package)";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  py::class_<TableOptions>(m, "Table")
      .def_readonly("name", &TableOptions::name)
      .def_property_readonly("kind", [](const TableOptions& t) { return KindName(t.kind); })
      .def_readonly("dim", &TableOptions::dim)
      .def_readonly("shape", &TableOptions::shape)
      .def_property_readonly("num_elements", &TableOptions::NumElements)
      .def_property_readonly("optimizer", [](const TableOptions& t) { return OptimizerDict(t.optimizer); })
      .def("__repr__", [](const TableOptions& t) {
        return "<parasol.Table '" + t.name + "' " + KindName(t.kind) + ">";
      });

  py::class_<Manifest>(m, "Manifest")
      .def_readonly("source", &Manifest::source)
      .def_property_readonly("job_name", [](const Manifest& x) { return x.job.name; })
      .def_property_readonly("seed", [](const Manifest& x) { return x.job.seed; })
      .def_property_readonly("servers", [](const Manifest& x) {
        std::vector<std::string> s;
        for (const ServerAddress& a : x.cluster.servers) s.push_back(a.ToString());
        return s;
      })
      .def_property_readonly("workers", [](const Manifest& x) { return x.cluster.workers; })
      .def_property_readonly("consistency", [](const Manifest& x) { return ConsistencyName(x.training.consistency); })
      .def_property_readonly("staleness", [](const Manifest& x) { return x.training.staleness; })
      .def_property_readonly("batch_size", [](const Manifest& x) { return x.training.batch_size; })
      .def_property_readonly("epochs", [](const Manifest& x) { return x.training.epochs; })
      .def_property_readonly("max_steps", [](const Manifest& x) { return x.training.max_steps; })
      .def_property_readonly("prefetch", [](const Manifest& x) { return x.training.prefetch; })
      .def_property_readonly("train_files", [](const Manifest& x) { return x.data.train; })
      .def_property_readonly("eval_file", [](const Manifest& x) { return x.data.eval; })
      .def_property_readonly("data_format", [](const Manifest& x) {
        return x.data.format == DataOptions::Format::kCriteo ? "criteo" : "libsvm";
      })
      .def_property_readonly("fail_on_bad_row", [](const Manifest& x) {
        return x.data.on_bad_row == DataOptions::OnBadRow::kFail;
      })
      .def_property_readonly("checkpoint_dir", [](const Manifest& x) { return x.checkpoint.dir; })
      .def_property_readonly("model", [](const Manifest& x) {
        py::dict d;
        d["kind"] = x.model.kind == ModelOptions::Kind::kDlrm ? "dlrm"
                    : x.model.kind == ModelOptions::Kind::kLr ? "lr"
                                                              : "none";
        d["embedding_dim"] = x.model.embedding_dim;
        d["bottom"] = x.model.bottom;
        d["top"] = x.model.top;
        return d;
      })
      .def_readonly("tables", &Manifest::tables)
      .def("table", [](const Manifest& x, const std::string& name) {
        const int i = x.FindTable(name);
        if (i < 0) throw Error(NotFound("no table '" + name + "' in " + x.source));
        return x.tables[i];
      })
      .def_property_readonly("fingerprint", &Manifest::Fingerprint)
      .def("__repr__", [](const Manifest& x) {
        return "<parasol.Manifest '" + x.job.name + "' from " + x.source + ">";
      });

  m.def("load_manifest", [](const std::string& path) { return Check(LoadManifest(path)); },
        py::arg("path"), "Reads and checks a job manifest (errors name file, line and key).");
  m.def("parse_manifest", [](const std::string& text, const std::string& source) {
        return Check(ParseManifest(text, source));
      }, py::arg("text"), py::arg("source") = "<string>");

  py::class_<Ticket, std::shared_ptr<Ticket>>(m, "Ticket")
      .def_readonly("id", &Ticket::id)
      .def_readonly("done", &Ticket::done)
      .def("__repr__", [](const Ticket& t) {
        return "<parasol.Ticket " + std::to_string(t.id) + (t.done ? " done>" : ">");
      });

  py::class_<Client>(m, "Client")
      .def(py::init<const Manifest&, uint32_t, const std::string&>(), py::arg("manifest"),
           py::arg("worker_id"), py::arg("key_path") = "")
      .def("table_id", &Client::TableId, py::arg("table"))
      .def("pull_sparse_async", &Client::PullSparseAsync, py::arg("table"), py::arg("keys"),
           py::arg("out") = py::none(), py::arg("prefetch") = false, py::arg("read_only") = false)
      .def("push_sparse_async", &Client::PushSparseAsync, py::arg("table"), py::arg("keys"),
           py::arg("grads"))
      .def("pull_dense_async", &Client::PullDenseAsync, py::arg("table"), py::arg("out") = py::none())
      .def("push_dense_async", &Client::PushDenseAsync, py::arg("table"), py::arg("grads"))
      .def("tick_async", &Client::TickAsync)
      .def("wait", &Client::Wait, py::arg("ticket"))
      .def("wait_all", &Client::WaitAll, py::arg("tickets"))
      .def("begin_step", &Client::BeginStep)
      .def("send_step", &Client::SendStep)
      .def("tick", &Client::Tick)
      .def("leave", &Client::Leave)
      .def("barrier", &Client::Barrier, py::arg("id"))
      .def("stats", &Client::Stats)
      .def("checkpoint", &Client::Checkpoint)
      .def("shutdown", &Client::Shutdown)
      .def("close", &Client::Close)
      .def_property_readonly("clock", [](Client& c) { return c.Get([](PsClient& p) { return p.clock(); }); })
      .def_property_readonly("worker_id", [](Client& c) { return c.Get([](PsClient& p) { return p.worker_id(); }); })
      .def_property_readonly("num_shards", [](Client& c) { return c.Get([](PsClient& p) { return p.num_shards(); }); })
      .def_property_readonly("resumed_clock", [](Client& c) { return c.Get([](PsClient& p) { return p.resumed_clock(); }); })
      .def_property_readonly("resumed_done", [](Client& c) { return c.Get([](PsClient& p) { return p.resumed_done(); }); })
      .def_property_readonly("pushes_acknowledged", [](Client& c) { return c.Get([](PsClient& p) { return p.pushes_acknowledged(); }); })
      .def_property_readonly("outstanding", &Client::outstanding)
      .def_property_readonly("cache_hits", [](Client& c) { return c.Get([](PsClient& p) { return p.cache_hits(); }); })
      .def_property_readonly("cache_misses", [](Client& c) { return c.Get([](PsClient& p) { return p.cache_misses(); }); });

  py::class_<Reader>(m, "BatchReader")
      .def(py::init<std::vector<std::string>, uint32_t, uint32_t, uint32_t, uint32_t,
                    const std::string&, bool, bool>(),
           py::arg("files"), py::arg("batch_size"), py::arg("epochs") = 1, py::arg("rank") = 0,
           py::arg("workers") = 1, py::arg("format") = "criteo", py::arg("has_label") = true,
           py::arg("fail_on_bad_row") = false)
      .def("__iter__", [](Reader& r) -> Reader& { return r; })
      .def("__next__", &Reader::Next)
      .def_property_readonly("bad_rows", &Reader::bad_rows)
      .def_property_readonly("rows_read", &Reader::rows_read)
      .def_property_readonly("first_bad_row", &Reader::first_bad_row);

  m.def("log_loss", [](const FloatArray& probs, const FloatArray& labels) {
    if (probs.size() != labels.size()) throw Error(InvalidArgument("log_loss: sizes differ"));
    return LogLoss({probs.data(), static_cast<size_t>(probs.size())},
                   {labels.data(), static_cast<size_t>(labels.size())});
  }, py::arg("probs"), py::arg("labels"));
  m.def("auc", [](const FloatArray& scores, const FloatArray& labels) {
    if (scores.size() != labels.size()) throw Error(InvalidArgument("auc: sizes differ"));
    return Auc({scores.data(), static_cast<size_t>(scores.size())},
               {labels.data(), static_cast<size_t>(labels.size())});
  }, py::arg("scores"), py::arg("labels"));
  m.attr("criteo_dense_features") = kCriteoDenseFeatures;
  m.attr("criteo_sparse_fields") = kCriteoSparseFields;
  std::vector<std::string> binaries;
#ifdef PARASOL_BUILD_BINARY
  binaries.push_back(PARASOL_BUILD_BINARY);
#endif
#ifdef PARASOL_INSTALL_BINARY
  binaries.push_back(PARASOL_INSTALL_BINARY);
#endif
  m.attr("_binaries") = binaries;
#ifdef PARASOL_BUILD_PYTHON_DIR
  m.attr("_build_python_dir") = PARASOL_BUILD_PYTHON_DIR;
#endif
}
