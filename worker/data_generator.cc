#include "worker/data_generator.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "common/hash.hpp"
#include "common/model_tables.hpp"
#include "common/zipf.hpp"

namespace parasol {
namespace {

// A hidden weight in N(0, 1)-ish, fixed by (field, value).
double HiddenWeight(uint64_t field, uint64_t value) {
  const uint64_t h = SplitMix64(field * 0x9e3779b97f4a7c15ULL + value);
  const double u1 = ((h >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = ((SplitMix64(h) >> 11) + 0.5) / 9007199254740992.0;
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

}  // namespace

uint64_t GeneratedCardinality(uint32_t field, uint64_t vocabulary) {
  const double lo = std::log(10.0), hi = std::log(std::max<double>(10.0, vocabulary));
  return static_cast<uint64_t>(std::exp(lo + (hi - lo) * field / (kCriteoSparseFields - 1)));
}

Status GenerateCriteo(const std::string& path, const GeneratorOptions& options) {
  std::unique_ptr<FILE, FileCloser> out(std::fopen(path.c_str(), "w"));
  if (!out) return IoError("cannot write '" + path + "': " + std::strerror(errno));
  std::mt19937_64 rng(options.seed);
  std::vector<ZipfSampler> fields;
  for (uint32_t f = 0; f < kCriteoSparseFields; ++f) {
    fields.emplace_back(GeneratedCardinality(f, options.vocabulary), options.zipf_s);
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::string line;
  for (uint64_t r = 0; r < options.rows; ++r) {
    double logit = -1.6;
    std::string body;
    char buf[32];
    for (uint32_t d = 0; d < kCriteoDenseFeatures; ++d) {
      body += '\t';
      if (unit(rng) < 0.1 * (d % 3)) continue;  // some integer features are often missing
      // Heavy-tailed counts; their log carries signal for a few features.
      const int64_t x = static_cast<int64_t>(std::floor(std::exp(unit(rng) * (2 + d % 5))) - 1);
      if (d < 4) logit += 0.25 * (d % 2 == 0 ? 1 : -1) * (std::log1p(double(x)) - 1.5);
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(x));
      body += buf;
    }
    for (uint32_t f = 0; f < kCriteoSparseFields; ++f) {
      body += '\t';
      if (f >= 19 && unit(rng) < 0.4) continue;  // a few fields are often empty
      const uint64_t v = fields[f](rng);
      // Popular values carry most of the signal, as in click logs.
      logit += 0.45 * HiddenWeight(f, v) / (1.0 + 0.02 * f);
      std::snprintf(buf, sizeof(buf), "%08llx",
                    static_cast<unsigned long long>(HashKey(v, f) & 0xffffffffULL));
      body += buf;
    }
    const double p = 1.0 / (1.0 + std::exp(-logit));
    line.assign(1, unit(rng) < p ? '1' : '0');
    line += body;
    line += '\n';
    if (std::fputs(line.c_str(), out.get()) < 0) {
      return IoError("cannot write '" + path + "': " + std::strerror(errno));
    }
  }
  if (std::fflush(out.get()) != 0) return IoError("cannot write '" + path + "'");
  return Status::Ok();
}

}  // namespace parasol
