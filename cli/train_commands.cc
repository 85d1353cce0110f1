#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>

#include "cli/commands.hpp"
#include "common/manifest.hpp"
#include "worker/backend.hpp"
#include "worker/data_generator.hpp"
#include "worker/ps_client.hpp"
#include "worker/trainer.hpp"

namespace parasol::cli {

int RunWorker(const std::string& manifest_path, uint32_t rank, const std::string& summary) {
  Result<Manifest> manifest = LoadManifest(manifest_path);
  if (!manifest.ok()) {
    spdlog::error("{}", manifest.status().message());
    return 2;
  }
  if (manifest->model.kind == ModelOptions::Kind::kNone) {
    spdlog::error("{}: key 'model': no model to train (use `parasol loadgen` to drive the tables)",
                  manifest_path);
    return 2;
  }
  if (rank >= manifest->cluster.workers) {
    spdlog::error("--rank {} is out of range: cluster.workers is {}", rank,
                  manifest->cluster.workers);
    return 2;
  }
  auto client = PsClient::Connect(*manifest, rank);
  if (!client.ok()) {
    spdlog::error("worker {}: {}", rank, client.status().ToString());
    return 1;
  }
  std::unique_ptr<Backend> backend = MakeCpuBackend(manifest->worker.blas_threads);
  Trainer trainer(*manifest, rank, client->get(), backend.get(),
                  [](const std::string& line) { std::printf("%s\n", line.c_str()); std::fflush(stdout); });
  Result<TrainReport> report = trainer.Run();
  if (!report.ok()) {
    spdlog::error("worker {}: {}", rank, report.status().ToString());
    return 1;
  }
  if (report->bad_rows > 0) {
    spdlog::warn("worker {}: skipped {} malformed rows; the first: {}", rank, report->bad_rows,
                 report->first_bad_row);
  }
  std::printf("%s\n", report->Summary().c_str());
  if (!summary.empty()) {
    std::ofstream out(summary);
    out << report->ToJson() << "\n";
    if (!out) {
      spdlog::error("cannot write the summary to '{}'", summary);
      return 1;
    }
  }
  return 0;
}

int RunGenData(uint64_t rows, const std::string& out, uint64_t seed) {
  GeneratorOptions o;
  o.rows = rows;
  o.seed = seed;
  Status st = GenerateCriteo(out, o);
  if (!st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }
  std::printf("wrote %llu Criteo-format rows to %s\n", static_cast<unsigned long long>(rows),
              out.c_str());
  return 0;
}

}  // namespace parasol::cli
