// parasol_bench: push/pull throughput of real shards, each figure printed next to the
// machine's ceilings measured in the same run (memcpy bandwidth and a raw ZeroMQ round trip of
// the same bytes between two plain processes).
//
//   parasol_bench [--only GROUP] [--json FILE] [--quick]
//
// Groups: ceilings, dense, sparse. The figure of a row is a median over timed iterations.
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/ceilings.hpp"
#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "common/transport.hpp"
#include "worker/ps_client.hpp"

namespace parasol::bench {
namespace {

struct Row {
  std::string name;
  double value = 0;
  std::string unit;
  std::optional<double> ceiling;
  std::string ceiling_name;
  std::optional<double> memcpy_ratio;  // value in GB/s over memcpy GB/s, where it applies
};

struct Options {
  std::string only;
  std::string json;
  bool quick = false;
};

// Real `parasol server` processes for one benchmark configuration.
class BenchCluster {
 public:
  BenchCluster(const std::string& tables_yaml, int shards) {
    char tmpl[] = "/tmp/parasol-bench-XXXXXX";
    dir_ = ::mkdtemp(tmpl) ? tmpl : "/tmp";
    std::string y = "cluster:\n  servers:\n";
    for (int s = 0; s < shards; ++s) {
      y += "    - 127.0.0.1:" + std::to_string(*PickFreePort()) + "\n";
    }
    y += "  workers: 1\n  connect_timeout: 30s\n  request_timeout: 60s\n";
    y += "tables:\n" + tables_yaml;
    path_ = dir_ + "/manifest.yaml";
    std::ofstream(path_) << y;
    manifest_ = *LoadManifest(path_);
    const std::string self = SelfDir() + "/parasol";
    for (int r = 0; r < shards; ++r) {
      auto p = Subprocess::Spawn(
          {self, "server", "--manifest", path_, "--rank", std::to_string(r)},
          dir_ + "/server" + std::to_string(r) + ".log");
      if (p.ok()) servers_.push_back(std::move(*p));
    }
  }
  ~BenchCluster() {
    servers_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const Manifest& manifest() const { return manifest_; }

  static std::string SelfDir() {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    return std::filesystem::path(std::string(buf, n > 0 ? n : 0)).parent_path().string();
  }

 private:
  std::string dir_, path_;
  Manifest manifest_;
  std::vector<Subprocess> servers_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `fn`: median over `iters` timed calls after `warmup` untimed ones.
double TimeIt(int warmup, int iters, const std::function<bool()>& fn) {
  for (int i = 0; i < warmup; ++i) {
    if (!fn()) return -1;
  }
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto a = std::chrono::steady_clock::now();
    if (!fn()) return -1;
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  return Median(t);
}

std::string Mb(uint64_t bytes) { return std::to_string(bytes >> 20) + "MB"; }

void DenseRows(const Options& opt, RawEcho& echo, double memcpy_gbs, std::vector<Row>* rows) {
  const std::vector<uint64_t> sizes = opt.quick ? std::vector<uint64_t>{1 << 20, 16 << 20}
                                                : std::vector<uint64_t>{1 << 20, 16 << 20,
                                                                        64 << 20};
  for (uint64_t bytes : sizes) {
    const uint64_t n = bytes / sizeof(float);
    const int iters = bytes >= (64 << 20) ? 8 : (bytes >= (16 << 20) ? 20 : 100);
    const double echo_s = echo.RoundTrip(bytes, 3, iters);
    const double ceiling = 2.0 * bytes / echo_s / 1e9;
    for (int shards : {1, 2}) {
      BenchCluster cluster("  - {name: w, kind: dense, shape: [" + std::to_string(n) +
                               "], init: {kind: zeros}, optimizer: {kind: sgd, lr: 0.0}}\n",
                           shards);
      auto client = PsClient::Connect(cluster.manifest(), 0);
      if (!client.ok()) {
        spdlog::error("dense bench: {}", client.status().ToString());
        continue;
      }
      std::vector<float> grad(n, 1.0f), out(n);
      const double s = TimeIt(3, iters, [&] {
        return (*client)->PushDense(0, grad).ok() && (*client)->PullDense(0, out.data()).ok();
      });
      const double gbs = 2.0 * bytes / s / 1e9;
      rows->push_back({"dense_push_pull_" + Mb(bytes) + "_" + std::to_string(shards) + "shard",
                       gbs, "GB/s", ceiling, "zmq_roundtrip_" + Mb(bytes), gbs / memcpy_gbs});
    }
  }
}

void SparseRows(const Options& opt, RawEcho& echo, double memcpy_gbs, std::vector<Row>* rows) {
  constexpr uint64_t kKeys = 100000;
  constexpr uint32_t kDim = 16;
  const uint64_t push_bytes = kKeys * (8 + kDim * 4);  // keys + values out, same back on pull
  const int iters = opt.quick ? 10 : 30;
  const double echo_s = echo.RoundTrip(push_bytes, 3, iters);
  for (int shards : {1, 2}) {
    BenchCluster cluster("  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: sgd, lr: 0.01}}\n",
                         shards);
    auto client = PsClient::Connect(cluster.manifest(), 0);
    if (!client.ok()) {
      spdlog::error("sparse bench: {}", client.status().ToString());
      continue;
    }
    std::mt19937_64 rng(1);
    std::vector<uint64_t> keys(kKeys);
    for (auto& k : keys) k = rng();
    std::vector<float> grad(kKeys * kDim, 0.001f), out(kKeys * kDim);
    const double s = TimeIt(3, iters, [&] {
      return (*client)->PushSparse(0, keys, grad).ok() &&
             (*client)->PullSparse(0, keys, out.data()).ok();
    });
    const std::string tag = "_" + std::to_string(shards) + "shard";
    const double gbs = 2.0 * push_bytes / s / 1e9;
    rows->push_back({"sparse_push_pull_1e5x16_rows" + tag, kKeys / s, "rows/s", kKeys / echo_s,
                     "zmq_roundtrip_7.2MB", std::nullopt});
    rows->push_back({"sparse_push_pull_1e5x16_bytes" + tag, gbs, "GB/s",
                     2.0 * push_bytes / echo_s / 1e9, "zmq_roundtrip_7.2MB", gbs / memcpy_gbs});
  }
}

std::string Num(double v) {
  char buf[64];
  if (v >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3f", v);
  }
  return buf;
}

void Print(const std::vector<Row>& rows) {
  std::printf("%-42s %12s %-7s %12s %-24s %7s %9s\n", "name", "value", "unit", "ceiling",
              "ceiling_name", "ratio", "/memcpy");
  for (const Row& r : rows) {
    std::printf("%-42s %12s %-7s %12s %-24s %7s %9s\n", r.name.c_str(), Num(r.value).c_str(),
                r.unit.c_str(), r.ceiling ? Num(*r.ceiling).c_str() : "-",
                r.ceiling ? r.ceiling_name.c_str() : "-",
                r.ceiling ? Num(r.value / *r.ceiling).c_str() : "-",
                r.memcpy_ratio ? Num(*r.memcpy_ratio).c_str() : "-");
  }
}

void WriteJson(const std::vector<Row>& rows, const std::string& path) {
  std::ofstream out(path);
  out << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "  {\"name\": \"" << r.name << "\", \"value\": " << r.value << ", \"unit\": \""
        << r.unit << "\", \"ceiling\": " << (r.ceiling ? std::to_string(*r.ceiling) : "null")
        << ", \"ceiling_name\": " << (r.ceiling ? "\"" + r.ceiling_name + "\"" : "null")
        << ", \"ratio\": " << (r.ceiling ? std::to_string(r.value / *r.ceiling) : "null") << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "]\n";
}

int Main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" && i + 1 < argc) {
      opt.only = argv[++i];
    } else if (a == "--json" && i + 1 < argc) {
      opt.json = argv[++i];
    } else if (a == "--quick") {
      opt.quick = true;
    } else {
      std::fprintf(stderr, "usage: parasol_bench [--only ceilings|dense|sparse] [--json FILE] "
                           "[--quick]\n");
      return 2;
    }
  }
  if (!opt.only.empty() && opt.only != "ceilings" && opt.only != "dense" && opt.only != "sparse") {
    std::fprintf(stderr, "unknown group '%s' (ceilings, dense, sparse)\n", opt.only.c_str());
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  TuneAllocatorForLargeMessages();  // the echo child inherits it: both sides alike
  std::vector<Row> rows;
  const double memcpy_gbs = MemcpyBandwidth(256 << 20, opt.quick ? 3 : 8);
  rows.push_back({"memcpy_bandwidth_256MB", memcpy_gbs, "GB/s", std::nullopt, "", std::nullopt});
  auto echo = RawEcho::Start();
  if (!echo.ok()) {
    std::fprintf(stderr, "cannot start the raw ZeroMQ echo process: %s\n",
                 echo.status().ToString().c_str());
    return 1;
  }
  if (opt.only.empty() || opt.only == "ceilings") {
    for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{16} << 20, uint64_t{64} << 20}) {
      const double s = (*echo)->RoundTrip(bytes, 3, 10);
      rows.push_back({"zmq_roundtrip_" + Mb(bytes), 2.0 * bytes / s / 1e9, "GB/s", std::nullopt,
                      "", std::nullopt});
    }
  }
  if (opt.only.empty() || opt.only == "dense") DenseRows(opt, **echo, memcpy_gbs, &rows);
  if (opt.only.empty() || opt.only == "sparse") SparseRows(opt, **echo, memcpy_gbs, &rows);
  Print(rows);
  if (!opt.json.empty()) WriteJson(rows, opt.json);
  return 0;
}

}  // namespace
}  // namespace parasol::bench

int main(int argc, char** argv) { return parasol::bench::Main(argc, argv); }
