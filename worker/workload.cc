#include "worker/workload.hpp"

#include <chrono>
#include <cmath>
#include <random>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/initializer.hpp"
#include "common/zipf.hpp"

namespace parasol {
namespace {

// The SGD update the server applies (in double, stored as float), with the gradient scaled
// by `scale` (1/workers under BSP, which averages the workers' pushes of a clock).
void ReferenceSgd(const OptimizerOptions& opt, float* w, const float* g, uint32_t n,
                  double scale) {
  for (uint32_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(w[i] - opt.lr * (g[i] * scale + opt.weight_decay * w[i]));
  }
}

double Compare(const float* got, const float* want, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return worst;
}

struct SparseRef {
  uint32_t table = 0;
  const TableOptions* options = nullptr;
  std::unordered_map<uint64_t, std::vector<float>> rows;

  std::vector<float>& Row(uint64_t key) {
    auto [it, inserted] = rows.try_emplace(key);
    if (inserted) {
      it->second.resize(options->dim);
      InitSparseRow(options->init, options->seed, key, it->second);
    }
    return it->second;
  }
};

struct DenseRef {
  uint32_t table = 0;
  const TableOptions* options = nullptr;
  std::vector<float> values;
};

}  // namespace

std::string WorkloadReport::ToString() const {
  std::ostringstream s;
  s << rounds << " rounds, " << rows_pulled << " rows pulled, " << rows_pushed
    << " rows pushed, " << unique_keys << " distinct keys, " << dense_elements
    << " dense elements moved, " << values_checked << " values checked (max |error| "
    << max_abs_error << "), " << seconds << " s";
  return s.str();
}

Result<WorkloadReport> RunWorkload(PsClient& client, const WorkloadOptions& options) {
  const Manifest& m = client.manifest();
  std::vector<SparseRef> sparse;
  std::vector<DenseRef> dense;
  for (uint32_t t = 0; t < m.tables.size(); ++t) {
    if (m.tables[t].kind == TableKind::kSparse) {
      sparse.push_back({t, &m.tables[t], {}});
    } else if (options.push_dense) {
      DenseRef d{t, &m.tables[t], std::vector<float>(m.tables[t].NumElements())};
      InitDenseRange(d.options->init, d.options->seed, 0, d.values);
      dense.push_back(std::move(d));
    }
  }
  for (const TableOptions& t : m.tables) {
    if (options.verify && t.optimizer.kind != OptimizerOptions::Kind::kSgd) {
      return InvalidArgument("the checked workload computes SGD updates; table '" + t.name +
                             "' uses another optimizer");
    }
  }
  const double scale = m.training.consistency == TrainingOptions::Consistency::kBsp
                           ? 1.0 / m.cluster.workers
                           : 1.0;
  std::mt19937_64 rng(options.seed);
  const ZipfSampler zipf(options.key_space, options.zipf_s);
  std::normal_distribution<float> grad(0.0f, 1.0f);
  WorkloadReport report;
  const auto start = std::chrono::steady_clock::now();

  std::vector<uint64_t> keys(options.batch_keys);
  std::vector<float> pulled, grads, summed;
  for (uint32_t round = 0; round < options.steps; ++round) {
    for (SparseRef& ref : sparse) {
      const uint32_t dim = ref.options->dim;
      for (auto& k : keys) k = options.key_offset + zipf(rng);
      pulled.resize(keys.size() * dim);
      PARASOL_RETURN_IF_ERROR(client.PullSparse(ref.table, keys, pulled.data()));
      if (options.verify) {
        for (size_t i = 0; i < keys.size(); ++i) {
          report.max_abs_error = std::max(
              report.max_abs_error, Compare(&pulled[i * dim], ref.Row(keys[i]).data(), dim));
          report.values_checked += dim;
        }
      }
      grads.resize(keys.size() * dim);
      for (auto& g : grads) g = grad(rng);
      PARASOL_RETURN_IF_ERROR(client.PushSparse(ref.table, keys, grads));
      if (options.verify) {
        // The client sums a repeated key's gradients in order of appearance, then the shard
        // applies the sum once.
        std::unordered_map<uint64_t, std::vector<float>> sums;
        std::vector<uint64_t> order;
        for (size_t i = 0; i < keys.size(); ++i) {
          auto [it, inserted] = sums.try_emplace(keys[i]);
          if (inserted) {
            it->second.assign(&grads[i * dim], &grads[i * dim] + dim);
            order.push_back(keys[i]);
          } else {
            for (uint32_t d = 0; d < dim; ++d) it->second[d] += grads[i * dim + d];
          }
        }
        for (uint64_t k : order) {
          ReferenceSgd(ref.options->optimizer, ref.Row(k).data(), sums[k].data(), dim, scale);
        }
      }
      report.rows_pulled += keys.size();
      report.rows_pushed += keys.size();
    }
    for (DenseRef& ref : dense) {
      pulled.resize(ref.values.size());
      PARASOL_RETURN_IF_ERROR(client.PullDense(ref.table, pulled.data()));
      if (options.verify) {
        report.max_abs_error =
            std::max(report.max_abs_error, Compare(pulled.data(), ref.values.data(), pulled.size()));
        report.values_checked += pulled.size();
      }
      grads.resize(ref.values.size());
      for (auto& g : grads) g = grad(rng);
      PARASOL_RETURN_IF_ERROR(client.PushDense(ref.table, grads));
      ReferenceSgd(ref.options->optimizer, ref.values.data(), grads.data(),
                   static_cast<uint32_t>(grads.size()), scale);
      report.dense_elements += 2 * ref.values.size();
    }
    // End of the step: under BSP the next pull waits for every worker's pushes of this one.
    PARASOL_RETURN_IF_ERROR(client.Tick());
    ++report.rounds;
  }
  // Final check: every key touched and every dense table, after the last push.
  for (SparseRef& ref : sparse) {
    report.unique_keys += ref.rows.size();
    if (!options.verify || ref.rows.empty()) continue;
    const uint32_t dim = ref.options->dim;
    std::vector<uint64_t> all;
    all.reserve(ref.rows.size());
    for (const auto& [k, row] : ref.rows) all.push_back(k);
    pulled.resize(all.size() * dim);
    PARASOL_RETURN_IF_ERROR(client.PullSparse(ref.table, all, pulled.data()));
    for (size_t i = 0; i < all.size(); ++i) {
      report.max_abs_error =
          std::max(report.max_abs_error, Compare(&pulled[i * dim], ref.rows[all[i]].data(), dim));
    }
    report.values_checked += pulled.size();
  }
  for (DenseRef& ref : dense) {
    if (!options.verify) continue;
    pulled.resize(ref.values.size());
    PARASOL_RETURN_IF_ERROR(client.PullDense(ref.table, pulled.data()));
    report.max_abs_error =
        std::max(report.max_abs_error, Compare(pulled.data(), ref.values.data(), pulled.size()));
    report.values_checked += pulled.size();
  }
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.verify && report.max_abs_error > 1e-5) {
    return Internal("workload check failed: a value differs from the reference by " +
                    std::to_string(report.max_abs_error));
  }
  return report;
}

}  // namespace parasol
