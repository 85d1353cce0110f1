#include "server/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/optimizer_layout.hpp"
#include "common/small_copy.hpp"

namespace parasol {

using Kind = OptimizerOptions::Kind;

uint32_t Optimizer::SparseStateFloats(uint32_t dim) const { return parasol::SparseStateFloats(o_, dim); }

OptimizerState Optimizer::SparseState(float* w, uint32_t dim) const {
  OptimizerState s;
  s.row = true;
  float* state = w + dim;
  switch (o_.kind) {
    case Kind::kSgd: break;
    case Kind::kAdagrad: s.a = state; break;
    case Kind::kAdagradRowwise: s.row_acc = state; break;
    case Kind::kAdam:
      s.a = state;
      s.b = state + dim;
      s.step = reinterpret_cast<uint32_t*>(state + 2 * dim);
      break;
    case Kind::kFtrl:
      s.a = state;
      s.b = state + dim;
      break;
  }
  return s;
}

uint32_t Optimizer::DenseStateArrays() const { return parasol::DenseStateArrays(o_); }

OptimizerState Optimizer::DenseState(float* const* arrays, uint64_t i) const {
  OptimizerState s;
  const uint32_t k = DenseStateArrays();
  if (k >= 1) s.a = arrays[0] + i;
  if (k >= 2) s.b = arrays[1] + i;
  if (o_.kind == Kind::kAdam) {
    s.step = reinterpret_cast<uint32_t*>(arrays[2] + i);
    s.step_per_element = true;
  }
  return s;
}

void Optimizer::InitState(const float* w, OptimizerState s, uint32_t n) const {
  switch (o_.kind) {
    case Kind::kSgd:
      return;
    case Kind::kAdagrad:
      for (uint32_t i = 0; i < n; ++i) s.a[i] = static_cast<float>(o_.initial_accumulator);
      return;
    case Kind::kAdagradRowwise:
      *s.row_acc = static_cast<float>(o_.initial_accumulator);
      return;
    case Kind::kAdam:
      for (uint32_t i = 0; i < n; ++i) s.a[i] = s.b[i] = 0.0f;
      if (s.step_per_element) {
        for (uint32_t i = 0; i < n; ++i) s.step[i] = 0;
      } else {
        *s.step = 0;
      }
      return;
    case Kind::kFtrl: {
      // Choose z so that the FTRL weight formula gives back the initial value at n = 0.
      const double d = o_.beta / o_.alpha + o_.l2;
      for (uint32_t i = 0; i < n; ++i) {
        const double w0 = w[i];
        s.a[i] = w0 == 0.0 ? 0.0f : static_cast<float>(-(w0 * d + std::copysign(o_.l1, w0)));
        s.b[i] = 0.0f;
      }
      return;
    }
  }
}

namespace {

// Optimizer::Apply's loops.
void ApplyLoops(const OptimizerOptions& o_, float* w, OptimizerState s, const std::byte* grad,
                uint64_t n, double scale) {
  const double wd = o_.weight_decay;
  auto g_at = [&](uint64_t i) { return LoadF32(grad + i * sizeof(float)) * scale + wd * w[i]; };
  switch (o_.kind) {
    case Kind::kSgd:
      for (uint64_t i = 0; i < n; ++i) w[i] = static_cast<float>(w[i] - o_.lr * g_at(i));
      return;
    case Kind::kAdagrad:
      for (uint64_t i = 0; i < n; ++i) {
        const double g = g_at(i);
        const double acc = s.a[i] + g * g;
        s.a[i] = static_cast<float>(acc);
        w[i] = static_cast<float>(w[i] - o_.lr * g / (std::sqrt(acc) + o_.eps));
      }
      return;
    case Kind::kAdagradRowwise: {
      double sum_sq = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const double g = g_at(i);
        sum_sq += g * g;
      }
      const double acc = *s.row_acc + sum_sq / static_cast<double>(n);
      *s.row_acc = static_cast<float>(acc);
      const double step = o_.lr / (std::sqrt(acc) + o_.eps);
      for (uint64_t i = 0; i < n; ++i) w[i] = static_cast<float>(w[i] - step * g_at(i));
      return;
    }
    case Kind::kAdam: {
      // Bias corrections 1 - beta^t (1 without bias correction: dividing by it is exact).
      auto corrections = [&](uint32_t t, double* c1, double* c2) {
        *c1 = o_.bias_correction ? 1 - std::pow(o_.beta1, t) : 1.0;
        *c2 = o_.bias_correction ? 1 - std::pow(o_.beta2, t) : 1.0;
      };
      auto update = [&](uint64_t i, double c1, double c2) {
        const double g = g_at(i);
        const double m = o_.beta1 * s.a[i] + (1 - o_.beta1) * g;
        const double v = o_.beta2 * s.b[i] + (1 - o_.beta2) * g * g;
        s.a[i] = static_cast<float>(m);
        s.b[i] = static_cast<float>(v);
        w[i] = static_cast<float>(w[i] - o_.lr * (m / c1) / (std::sqrt(v / c2) + o_.eps));
      };
      double c1 = 1, c2 = 1;
      if (s.step_per_element) {
        // The elements of a dense slice usually share one step count: pow only when it changes.
        bool have = false;
        uint32_t have_t = 0;
        for (uint64_t i = 0; i < n; ++i) {
          const uint32_t t = ++s.step[i];
          if (!have || t != have_t) {
            have = true;
            have_t = t;
            corrections(t, &c1, &c2);
          }
          update(i, c1, c2);
        }
      } else {
        corrections(++*s.step, &c1, &c2);
        for (uint64_t i = 0; i < n; ++i) update(i, c1, c2);
      }
      return;
    }
    case Kind::kFtrl:
      for (uint64_t i = 0; i < n; ++i) {
        const double g = g_at(i);
        const double n_old = s.b[i];
        const double n_new = n_old + g * g;
        const double sigma = (std::sqrt(n_new) - std::sqrt(n_old)) / o_.alpha;
        const double z = s.a[i] + g - sigma * w[i];
        s.a[i] = static_cast<float>(z);
        s.b[i] = static_cast<float>(n_new);
        if (std::abs(z) <= o_.l1) {
          w[i] = 0.0f;
        } else {
          w[i] = static_cast<float>(-(z - std::copysign(o_.l1, z)) /
                                    ((o_.beta + std::sqrt(n_new)) / o_.alpha + o_.l2));
        }
      }
      return;
  }
}

}  // namespace

namespace {

bool AllFinite(const float* v, uint64_t n) {
  // Branch-free over the run, on the bits (a float sum would be one serial chain of adds): an
  // all-ones exponent is an infinity or a NaN.
  uint32_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// What one run's update may change, copied before it so that it can be put back. The buffers
// only grow (a run is at most kGuardRun elements, or one row), and the copies are inline: a
// shard saves every row it updates.
struct RunBackup {
  std::vector<float> w, a, b;
  std::vector<uint32_t> step;
  float row_acc = 0;
  uint32_t row_step = 0;

  static void Keep(std::vector<float>& to, const float* from, uint64_t n) {
    if (to.size() < n) to.resize(n);
    CopyFloats(to.data(), from, n);
  }
  void Save(const float* wv, const OptimizerState& s, uint64_t n) {
    Keep(w, wv, n);
    if (s.a) Keep(a, s.a, n);
    if (s.b) Keep(b, s.b, n);
    if (s.row_acc) row_acc = *s.row_acc;
    if (s.step && s.step_per_element) step.assign(s.step, s.step + n);
    if (s.step && !s.step_per_element) row_step = *s.step;
  }
  void Restore(float* wv, const OptimizerState& s, uint64_t n) const {
    CopyFloats(wv, w.data(), n);
    if (s.a) CopyFloats(s.a, a.data(), n);
    if (s.b) CopyFloats(s.b, b.data(), n);
    if (s.row_acc) *s.row_acc = row_acc;
    if (s.step && s.step_per_element) std::copy(step.begin(), step.begin() + n, s.step);
    if (s.step && !s.step_per_element) *s.step = row_step;
  }
};

}  // namespace

uint64_t Optimizer::Apply(float* w, OptimizerState s, const std::byte* grad, uint64_t n,
                          double scale) const {
  // A row's own state (a row-wise accumulator, adam's step per row) makes the row one run.
  const bool row_state =
      s.row || s.row_acc != nullptr || (s.step != nullptr && !s.step_per_element);
  const uint64_t run = row_state ? std::max<uint64_t>(n, 1) : kGuardRun;
  thread_local RunBackup backup;
  uint64_t kept = 0;
  for (uint64_t at = 0; at < n; at += run) {
    const uint64_t m = std::min(run, n - at);
    OptimizerState part = s;
    if (part.a) part.a += at;
    if (part.b) part.b += at;
    if (part.step && part.step_per_element) part.step += at;
    backup.Save(w + at, part, m);
    ApplyLoops(o_, w + at, part, grad + at * sizeof(float), m, scale);
    if (AllFinite(w + at, m) && (!part.a || AllFinite(part.a, m)) &&
        (!part.b || AllFinite(part.b, m)) && (!part.row_acc || std::isfinite(*part.row_acc))) {
      continue;
    }
    backup.Restore(w + at, part, m);
    kept += m;
  }
  if (kept) kept_->fetch_add(kept, std::memory_order_relaxed);
  return kept;
}

}  // namespace parasol
