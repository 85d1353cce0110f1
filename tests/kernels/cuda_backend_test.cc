// The CUDA backend against the CPU backend, op by op and for whole DLRM steps, on random
// inputs. Every device output is poisoned (NaN) before each run, so an element a kernel does not
// write fails the comparison. Needs a CUDA device: skips without one.
//
// Tolerances follow the arithmetic. A product of K terms in fp32 is off by at most about
// K * 2^-24 of the sum of its terms' magnitudes (sum |a||b|); with TF32 each operand is first
// rounded to a 10-bit mantissa (a relative 2^-11 per operand, so 2^-10 per product) and that
// term dominates. Whole steps compare norm-wise, ||got - want|| / ||want||: rounding errors of
// random sign grow like sqrt(K) in fp32 and stay near the operand rounding with TF32; a chain
// of L products and sums multiplies them by at most L. A wrong or unwritten element is off by
// far more than any of these bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/key_index.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/embedding_pool.hpp"
#include "tests/support/model_step.hpp"
#include "worker/backend.hpp"
#include "worker/data_reader.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// ||got - want|| / ||want|| (0 when both are 0); NaN when any element of got is NaN.
double RelativeError(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return std::nan("");
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class CudaBackendTest : public ::testing::TestWithParam<bool> {
 public:
  bool tf32() const { return GetParam(); }
  // The relative error of one product's operands: TF32 rounding, or fp32's.
  double OperandUnit() const { return tf32() ? std::ldexp(1.0, -10) : std::ldexp(1.0, -23); }
  // A norm-wise bound for `chain` products and sums of at most k terms each.
  double StepBound(int chain, double k) const {
    return chain * (OperandUnit() + std::sqrt(k) * std::ldexp(1.0, -24)) * 4;
  }

 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << CudaUnavailableReason();
    auto cuda = MakeCudaBackend(0, /*tf32=*/tf32());
    ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
    gpu_ = std::move(*cuda);
    cpu_ = MakeCpuBackend();
  }
  DeviceBuffer Up(const std::vector<float>& host) {
    DeviceBuffer b = gpu_->Allocate(host.size());
    gpu_->ToDevice(b.data(), host.data(), host.size());
    return b;
  }
  DeviceBuffer UpIndices(const std::vector<uint32_t>& host) {
    DeviceBuffer b = gpu_->Allocate(host.size());
    gpu_->ToDevice(b.data(), reinterpret_cast<const float*>(host.data()), host.size());
    return b;
  }
  // A device output of n floats, poisoned.
  DeviceBuffer Out(size_t n) {
    DeviceBuffer b = gpu_->Allocate(n);
    gpu_->Fill(b.data(), std::nanf(""), n);
    return b;
  }
  std::vector<float> Down(const DeviceBuffer& b, size_t n) {
    std::vector<float> h(n);
    gpu_->ToHost(h.data(), b.data(), n);
    EXPECT_TRUE(gpu_->Sync().ok());
    return h;
  }
  // Element-wise: |got - want| <= bound[i] (every element written).
  void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<double>& bound, const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "] was not written";
      ASSERT_LE(std::abs(double{got[i]} - want[i]), bound[i] + 1e-30)
          << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
  // Exact ops (no products of rounded operands): fp32 rounding of a few terms.
  void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what, double rel = 1e-6) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "] was not written";
      ASSERT_NEAR(got[i], want[i], rel * (1 + std::abs(want[i]))) << what << " [" << i << "]";
    }
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_P(CudaBackendTest, GemmWithEveryTransposeAndStride) {
  const int m = 37, n = 29, k = 53, pad = 3;
  const std::vector<float> a = Random((m + pad) * (k + pad), 1), b = Random((k + pad) * (n + pad), 2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      std::vector<float> want(m * ldc, 0.0f), magnitude(m * ldc, 0.0f);
      cpu_->GemmStrided(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(), ldc);
      std::vector<float> abs_a(a.size()), abs_b(b.size());
      for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::abs(a[i]);
      for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::abs(b[i]);
      cpu_->GemmStrided(ta, tb, m, n, k, 1.0f, abs_a.data(), lda, abs_b.data(), ldb, 0.0f,
                        magnitude.data(), ldc);
      DeviceBuffer da = Up(a), db = Up(b), dc = Out(m * ldc);
      gpu_->GemmStrided(ta, tb, m, n, k, 1.0f, da.data(), lda, db.data(), ldb, 0.0f, dc.data(), ldc);
      const std::vector<float> got = Down(dc, m * ldc);
      // Each element within its dot product's magnitude times the operand rounding plus the
      // k-term fp32 sum (both sides round the sum).
      const double unit = OperandUnit() + 2 * k * std::ldexp(1.0, -24);
      for (int r = 0; r < m; ++r) {
        for (int c = 0; c < n; ++c) {
          const int i = r * ldc + c;
          ASSERT_FALSE(std::isnan(got[i])) << "gemm [" << r << "," << c << "] was not written";
          ASSERT_NEAR(got[i], want[i], unit * magnitude[i] + 1e-7)
              << "gemm [" << r << "," << c << "] (ta " << ta << ", tb " << tb << ")";
        }
        for (int c = n; c < ldc; ++c) {
          ASSERT_TRUE(std::isnan(got[r * ldc + c])) << "gemm wrote past its columns";
        }
      }
    }
  }
}

// A linear layer's forward in one call (bias and ReLU in the product's epilogue), at dlrm-small's
// first layer shape: 13 features in rows padded to 16.
TEST_P(CudaBackendTest, GemmWithBiasAndReluEpilogue) {
  for (bool relu : {true, false}) {
    const int m = 4096, n = 64, k = 13, lda = 16;
    const std::vector<float> a = Random(size_t(m) * lda, 21), w = Random(n * k, 22),
                             bias = Random(n, 23);
    std::vector<float> want(size_t(m) * n), magnitude(size_t(m) * n);
    cpu_->GemmBiasActivation(false, true, m, n, k, a.data(), lda, w.data(), k, bias.data(),
                             want.data(), n, relu);
    std::vector<float> abs_a(a.size()), abs_w(w.size()), abs_bias(n);
    for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::abs(a[i]);
    for (size_t i = 0; i < w.size(); ++i) abs_w[i] = std::abs(w[i]);
    for (int i = 0; i < n; ++i) abs_bias[i] = std::abs(bias[i]);
    cpu_->GemmBiasActivation(false, true, m, n, k, abs_a.data(), lda, abs_w.data(), k,
                             abs_bias.data(), magnitude.data(), n, false);
    DeviceBuffer da = Up(a), dw = Up(w), db = Up(bias), dc = Out(size_t(m) * n);
    gpu_->GemmBiasActivation(false, true, m, n, k, da.data(), lda, dw.data(), k, db.data(),
                             dc.data(), n, relu);
    const std::vector<float> got = Down(dc, size_t(m) * n);
    std::vector<double> bound(got.size());
    const double unit = OperandUnit() + 2 * (k + 1) * std::ldexp(1.0, -24);
    for (size_t i = 0; i < got.size(); ++i) bound[i] = unit * magnitude[i] + 1e-7;
    ExpectWithin(got, want, bound, relu ? "gemm + bias + relu" : "gemm + bias");
  }
}

TEST_P(CudaBackendTest, ElementwiseAndFusedBiasOps) {
  // Rows enough for many chunks of the grid-wide column sums, and a ragged last chunk.
  for (int rows : {33, 16384 + 5}) {
    const int cols = 17;
    const size_t n = size_t(rows) * cols;
    const std::vector<float> x = Random(n, 3), bias = Random(cols, 4), dy = Random(n, 5);
    std::vector<float> y(n), dx(n), db(cols), yb = x, fused = x, dpre(n), fdb(cols);
    cpu_->Relu(y.data(), x.data(), n);
    cpu_->ReluBackward(dx.data(), dy.data(), y.data(), n);
    cpu_->BiasGrad(db.data(), dy.data(), rows, cols);
    cpu_->AddBias(yb.data(), bias.data(), rows, cols);
    cpu_->BiasActivation(fused.data(), bias.data(), rows, cols, true);
    cpu_->BiasActivationBackward(dpre.data(), fdb.data(), dy.data(), fused.data(), rows, cols, true);
    DeviceBuffer dx_in = Up(x), ddy = Up(dy), dbias = Up(bias), dfused = Up(x);
    DeviceBuffer gy = Out(n), gdx = Out(n), gdb = Out(cols), gdpre = Out(n), gfdb = Out(cols);
    gpu_->Relu(gy.data(), dx_in.data(), n);
    gpu_->ReluBackward(gdx.data(), ddy.data(), gy.data(), n);
    gpu_->BiasGrad(gdb.data(), ddy.data(), rows, cols);
    gpu_->AddBias(dx_in.data(), dbias.data(), rows, cols);
    gpu_->BiasActivation(dfused.data(), dbias.data(), rows, cols, true);
    gpu_->BiasActivationBackward(gdpre.data(), gfdb.data(), ddy.data(), dfused.data(), rows, cols,
                                 true);
    ExpectNear(Down(gy, n), y, "relu");
    ExpectNear(Down(gdx, n), dx, "relu backward");
    ExpectNear(Down(dx_in, n), yb, "add bias");
    ExpectNear(Down(dfused, n), fused, "bias + relu");
    ExpectNear(Down(gdpre, n), dpre, "bias + relu backward: dpre");
    // Column sums of `rows` terms in another order: within rows * 2^-24 of the sum of |terms|.
    std::vector<double> bound(cols, 0.0), fbound(cols, 0.0);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        bound[c] += std::abs(dy[size_t(r) * cols + c]) * rows * std::ldexp(1.0, -24);
        fbound[c] += std::abs(dpre[size_t(r) * cols + c]) * rows * std::ldexp(1.0, -24);
      }
    }
    ExpectWithin(Down(gdb, cols), db, bound, "bias grad, rows " + std::to_string(rows));
    ExpectWithin(Down(gfdb, cols), fdb, fbound, "fused bias grad, rows " + std::to_string(rows));
  }
}

TEST_P(CudaBackendTest, EmbeddingPoolAndRowGradientsWithHotKeys) {
  for (int dim : {16, 1, 7, 48}) {
    const int unique = 50, batch = 3000;
    std::mt19937 rng(6 + dim);
    std::vector<uint32_t> offsets(batch + 1, 0), indices, key_bags;
    std::vector<float> values;
    for (int b = 0; b < batch; ++b) {
      const uint32_t n = rng() % 6;
      for (uint32_t j = 0; j < n; ++j) {
        // Key 0 is hot: in most bags, thousands of times in all.
        indices.push_back(rng() % 3 == 0 ? rng() % unique : 0);
        values.push_back(std::uniform_real_distribution<float>(-2, 2)(rng));
        key_bags.push_back(b);
      }
      offsets[b + 1] = static_cast<uint32_t>(indices.size());
    }
    const auto keys = static_cast<uint32_t>(indices.size());
    std::vector<uint32_t> row_start(unique + 1), occ(keys), hot(keys / kHotRowKeys + 1);
    const uint32_t hot_count = BuildRowIndex(indices.data(), keys, unique, row_start.data(),
                                             occ.data(), hot.data());
    ASSERT_GE(hot_count, 1u);
    ASSERT_EQ(hot[0], 0u);
    ASSERT_GE(row_start[1] - row_start[0], 1000u);
    const std::vector<float> rows = Random(unique * dim, 7), dout = Random(batch * dim, 8);
    std::vector<float> out(batch * dim), drows(unique * dim), magnitude(unique * dim, 0.0f);
    cpu_->EmbeddingPool(out.data(), rows.data(), dim, indices.data(), values.data(), offsets.data(),
                        batch, unique);
    cpu_->EmbeddingRowGrad(drows.data(), dout.data(), dim, row_start.data(), occ.data(), hot.data(),
                           hot_count, key_bags.data(), values.data(), unique);
    DeviceBuffer grows = Up(rows), gdout = Up(dout), gvals = Up(values);
    DeviceBuffer gidx = UpIndices(indices), goff = UpIndices(offsets), gbags = UpIndices(key_bags);
    DeviceBuffer gstart = UpIndices(row_start), gocc = UpIndices(occ), ghot = UpIndices(hot);
    DeviceBuffer gout = Out(out.size()), gdrows = Out(drows.size());
    auto u32 = [](const DeviceBuffer& b) { return reinterpret_cast<const uint32_t*>(b.data()); };
    gpu_->EmbeddingPool(gout.data(), grows.data(), dim, u32(gidx), gvals.data(), u32(goff), batch,
                        unique);
    gpu_->EmbeddingRowGrad(gdrows.data(), gdout.data(), dim, u32(gstart), u32(gocc), u32(ghot),
                           hot_count, u32(gbags), gvals.data(), unique);
    ExpectNear(Down(gout, out.size()), out, "pool, dim " + std::to_string(dim), 1e-5);
    // Sums of up to thousands of terms in another order: within n * 2^-24 of sum |terms|.
    std::vector<double> bound(drows.size(), 0.0);
    for (int u = 0; u < unique; ++u) {
      const double n = row_start[u + 1] - row_start[u];
      for (uint32_t k = row_start[u]; k < row_start[u + 1]; ++k) {
        const uint32_t j = occ[k];
        for (int d = 0; d < dim; ++d) {
          bound[size_t(u) * dim + d] +=
              std::abs(values[j] * dout[size_t(key_bags[j]) * dim + d]) * n * std::ldexp(1.0, -24);
        }
      }
    }
    const std::vector<float> first = Down(gdrows, drows.size());
    ExpectWithin(first, drows, bound, "row gradients, dim " + std::to_string(dim));
    // Deterministic: the same inputs give the same bits.
    gpu_->Fill(gdrows.data(), std::nanf(""), drows.size());
    gpu_->EmbeddingRowGrad(gdrows.data(), gdout.data(), dim, u32(gstart), u32(gocc), u32(ghot),
                           hot_count, u32(gbags), gvals.data(), unique);
    EXPECT_EQ(Down(gdrows, drows.size()), first) << "row gradients differ between runs";
  }
}

TEST_P(CudaBackendTest, InteractionForwardAndBackward) {
  const int batch = 19, fields = 26, dim = 16;
  const int width = dim + (fields + 1) * fields / 2, ld = (width + 3) / 4 * 4;
  const std::vector<float> z = Random(batch * dim, 9), e = Random(batch * fields * dim, 10);
  const std::vector<float> dout = Random(batch * ld, 11);
  std::vector<float> out(batch * ld), dz(batch * dim), de(batch * fields * dim);
  cpu_->Interaction(out.data(), ld, z.data(), e.data(), batch, fields, dim);
  cpu_->InteractionBackward(dz.data(), de.data(), dout.data(), ld, z.data(), e.data(), batch,
                            fields, dim);
  DeviceBuffer gz = Up(z), ge = Up(e), gd = Up(dout);
  DeviceBuffer gout = Out(out.size()), gdz = Out(dz.size()), gde = Out(de.size());
  gpu_->Interaction(gout.data(), ld, gz.data(), ge.data(), batch, fields, dim);
  gpu_->InteractionBackward(gdz.data(), gde.data(), gd.data(), ld, gz.data(), ge.data(), batch,
                            fields, dim);
  // fp32 dot products of 16 and sums of 27 terms of magnitude <= 1, in another order.
  ExpectNear(Down(gout, out.size()), out, "interaction", 1e-5);
  ExpectNear(Down(gdz, dz.size()), dz, "interaction dz", 1e-5);
  ExpectNear(Down(gde, de.size()), de, "interaction de", 1e-5);
}

TEST_P(CudaBackendTest, SigmoidBceWithLargeLogits) {
  const int n = 5000;
  std::vector<float> logits = Random(n, 12, 4.0f), labels(n);
  // Large |logits| (the loss must stay finite, the probabilities in [0, 1]).
  for (int i = 0; i < n; i += 7) logits[i] = (i % 2 ? 1.0f : -1.0f) * (30.0f + i % 90);
  for (int i = 0; i < n; ++i) labels[i] = i % 3 == 0 ? 1.0f : 0.0f;
  std::vector<float> probs(n), dl(n);
  double loss = 0;
  cpu_->SigmoidBce(probs.data(), dl.data(), &loss, logits.data(), labels.data(), n);
  DeviceBuffer gl = Up(logits), gy = Up(labels), gp = Out(n), gd = Out(n);
  DeviceBuffer gloss = gpu_->Allocate(2);
  auto* loss_dev = reinterpret_cast<double*>(gloss.data());
  gpu_->SigmoidBce(gp.data(), gd.data(), loss_dev, gl.data(), gy.data(), n);
  std::vector<float> raw = Down(gloss, 2);
  double gpu_loss = 0;
  std::memcpy(&gpu_loss, raw.data(), sizeof gpu_loss);
  ASSERT_TRUE(std::isfinite(gpu_loss));
  EXPECT_NEAR(gpu_loss, loss, 1e-9 * std::abs(loss));
  ExpectNear(Down(gp, n), probs, "probs");
  ExpectNear(Down(gd, n), dl, "dlogits");
}

// After an error every call is skipped (no launch, no copy) and Sync names the failed call's
// file and line; the memory a skipped call would have written keeps its contents.
TEST_P(CudaBackendTest, CallsAfterAnErrorAreSkippedAndTheErrorNamesItsPlace) {
  DeviceBuffer a = Up(Random(64, 30)), c = Out(64);
  ASSERT_TRUE(gpu_->Sync().ok());
  // lda below the row length: cuBLAS refuses the product.
  gpu_->GemmStrided(false, false, 8, 8, 8, 1.0f, a.data(), 2, a.data(), 8, 0.0f, c.data(), 8);
  gpu_->Fill(c.data(), 1.0f, 64);
  const Status st = gpu_->Sync();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cublasSgemm"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("cuda_backend.cc:"), std::string::npos) << st.ToString();
  // Another backend on the same device reads what the skipped fill would have overwritten.
  auto other = MakeCudaBackend(0, tf32());
  ASSERT_TRUE(other.ok());
  std::vector<float> got(64, 0.0f);
  (*other)->ToHost(got.data(), c.data(), 64);
  ASSERT_TRUE((*other)->Sync().ok());
  for (float v : got) ASSERT_TRUE(std::isnan(v)) << "a call after the error ran";
}

Manifest DlrmSmall() {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:1]\nmodel:\n  kind: dlrm\n  embedding_dim: 16\n"
      "  bottom: [64, 16]\n  top: [64, 1]\n",
      "dlrm.yaml");
  EXPECT_TRUE(m.ok());
  return *m;
}

Batch RandomBatch(uint32_t n, uint64_t seed, uint32_t ids) {
  Batch batch;
  batch.Clear();
  std::mt19937_64 rng(seed);
  for (uint32_t i = 0; i < n; ++i) {
    std::string line = std::to_string(rng() % 2);
    for (int d = 0; d < 13; ++d) {
      line += '\t';
      line += std::to_string(rng() % 100);
    }
    for (int c = 0; c < 26; ++c) {
      line += '\t';
      // Field 0 is one hot id in every sample; the others draw from `ids`.
      line += c == 0 ? "7" : std::to_string(rng() % ids);
    }
    EXPECT_TRUE(ParseCriteoRow(line, true, &batch).ok());
  }
  return batch;
}

struct DlrmCase {
  uint32_t max_batch, batch, ids;
};

// Whole dlrm-small steps on both backends from the same inputs, three per case through both
// slots (so full batches also run as recorded graphs). After each, a different batch runs on the
// same slot and then the first again: it must give the same bits as the first time (an output
// the device fails to write would keep the other batch's values).
void CheckDlrmSteps(CudaBackendTest* t, Backend* cpu, Backend* gpu, double (*bound)(const CudaBackendTest*, double),
                    std::initializer_list<DlrmCase> cases) {
  const Manifest m = DlrmSmall();
  for (const DlrmCase c : cases) {
    auto cpu_model = Model::Create(m, cpu, c.max_batch);
    auto gpu_model = Model::Create(m, gpu, c.max_batch);
    ASSERT_TRUE(cpu_model.ok() && gpu_model.ok());
    Model& g = **gpu_model;
    Model& r = **cpu_model;
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("max batch " + std::to_string(c.max_batch) + ", batch " +
                   std::to_string(c.batch) + ", ids " + std::to_string(c.ids) + ", step " +
                   std::to_string(step));
      const Batch batch = RandomBatch(c.batch, 13 + step, c.ids);
      const BatchKeys keys = DeduplicateKeys(batch.keys);
      std::vector<std::vector<float>> dense = DenseShapes(r);
      for (size_t i = 0; i < dense.size(); ++i) dense[i] = Random(dense[i].size(), 100 + i + step, 0.2f);
      const std::vector<float> rows = Random(keys.unique.size() * 16, 14 + step);
      const int slot = step % 2;
      ASSERT_TRUE(RunModelStep(r, batch, keys, rows, dense, true, slot).ok());
      const TransferCounts before = gpu->transfers();
      const Status st = RunModelStep(g, batch, keys, rows, dense, true, slot);
      ASSERT_TRUE(st.ok()) << st.ToString();
      // One upload, one download, one synchronisation.
      const TransferCounts after = gpu->transfers();
      EXPECT_EQ(after.uploads - before.uploads, 1u);
      EXPECT_EQ(after.downloads - before.downloads, 1u);
      EXPECT_EQ(after.syncs - before.syncs, 1u);
      const double b = bound(t, c.batch);
      EXPECT_LE(std::abs(g.Loss() - r.Loss()), b * std::abs(r.Loss()));
      EXPECT_LE(RelativeError(g.Probabilities(), r.Probabilities()), b) << "probabilities";
      EXPECT_LE(RelativeError(g.RowGrads(), r.RowGrads()), b) << "row gradients";
      for (size_t i = 0; i < r.DenseGrads().size(); ++i) {
        EXPECT_LE(RelativeError(g.DenseGrads()[i], r.DenseGrads()[i]), b) << "dense gradient " << i;
      }
      const std::vector<float> probs(g.Probabilities().begin(), g.Probabilities().end());
      const std::vector<float> grads(g.RowGrads().begin(), g.RowGrads().end());
      std::vector<std::vector<float>> dgrads;
      for (auto d : g.DenseGrads()) dgrads.emplace_back(d.begin(), d.end());
      const double loss = g.Loss();
      // Another batch on the same slot, then this one again: the same bits.
      const Batch other = RandomBatch(c.batch, 1000 + step, c.ids + 5);
      const BatchKeys other_keys = DeduplicateKeys(other.keys);
      ASSERT_TRUE(RunModelStep(g, other, other_keys, Random(other_keys.unique.size() * 16, 99),
                               dense, true, slot)
                      .ok());
      ASSERT_TRUE(RunModelStep(g, batch, keys, rows, dense, true, slot).ok());
      EXPECT_EQ(g.Loss(), loss);
      EXPECT_EQ(std::vector<float>(g.Probabilities().begin(), g.Probabilities().end()), probs);
      EXPECT_EQ(std::vector<float>(g.RowGrads().begin(), g.RowGrads().end()), grads);
      for (size_t i = 0; i < dgrads.size(); ++i) {
        EXPECT_EQ(std::vector<float>(g.DenseGrads()[i].begin(), g.DenseGrads()[i].end()),
                  dgrads[i])
            << "dense gradient " << i << " differs between runs";
      }
    }
  }
}

// The longest chain: 4 products forward and back, sums over the batch (dW, bias) or over the
// batch's uses of a row. With TF32 a ReLU input within its rounding of zero can switch, which
// changes a gradient element by its whole size; at batch 64 a few such switches measured 5.8%
// norm-wise (H200), so TF32 steps allow 0.15 more. A wrong or unwritten element is off by O(1);
// TF32's products alone are checked element-wise in GemmWithEveryTransposeAndStride.
double DlrmStepBound(const CudaBackendTest* t, double batch) {
  return t->StepBound(8, batch) + (t->tf32() ? 0.15 : 0.0);
}

// Small batches (quick enough for the memory checker): full ones, and a partial one where most
// rows are hot (200 samples over 3 ids a field: about 67 keys per row).
TEST_P(CudaBackendTest, SmallDlrmStepsMatchTheCpu) {
  const int graphs = gpu_->GraphCount();
  CheckDlrmSteps(this, cpu_.get(), gpu_.get(), DlrmStepBound,
                 {DlrmCase{64, 64, 7}, DlrmCase{256, 200, 3}});
  EXPECT_GT(gpu_->GraphCount(), graphs) << "no full batch ran as a recorded graph";
}

// The real shapes: batch 4096 and 16384, and a partial batch of 1000 with hot rows.
TEST_P(CudaBackendTest, LargeDlrmStepsMatchTheCpu) {
  CheckDlrmSteps(this, cpu_.get(), gpu_.get(), DlrmStepBound,
                 {DlrmCase{4096, 4096, 5000}, DlrmCase{4096, 1000, 3},
                  DlrmCase{16384, 16384, 100000}});
}

INSTANTIATE_TEST_SUITE_P(Precision, CudaBackendTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tf32" : "fp32"; });

}  // namespace
}  // namespace parasol
