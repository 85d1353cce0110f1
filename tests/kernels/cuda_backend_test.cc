// The CUDA backend against the CPU backend, op by op and for the whole DLRM step, on random
// inputs. Every device output is poisoned (NaN) before each run, so an element a kernel does not
// write fails the comparison. Needs a CUDA device: skips without one.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/key_index.hpp"
#include "kernels/cuda_check.hpp"
#include "worker/backend.hpp"
#include "worker/data_reader.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

class CudaBackendTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << CudaUnavailableReason();
    auto cuda = MakeCudaBackend(0, /*tf32=*/GetParam());
    ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
    gpu_ = std::move(*cuda);
    cpu_ = MakeCpuBackend();
  }
  // Relative tolerance: plain fp32 and TF32.
  double Tol() const { return GetParam() ? 1e-3 : 1e-5; }

  // A device buffer holding `host`.
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
  void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "] was not written";
      ASSERT_NEAR(got[i], want[i], Tol() * (1 + std::abs(want[i]))) << what << " [" << i << "]";
    }
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_P(CudaBackendTest, GemmWithEveryTranspose) {
  const int m = 37, n = 29, k = 53;
  const std::vector<float> a = Random(m * k, 1), b = Random(k * n, 2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> want(m * n), magnitude(m * n);
      cpu_->Gemm(ta, tb, m, n, k, 1.0f, a.data(), b.data(), 0.0f, want.data());
      // Each element's error bound follows its dot product's magnitude, sum |a||b|: TF32 rounds
      // both operands to 10-bit mantissas (a relative error of 2^-10 per product), float32 to
      // 24-bit ones, and the k-term float32 sum adds k * 2^-24.
      std::vector<float> abs_a(a.size()), abs_b(b.size());
      for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::abs(a[i]);
      for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::abs(b[i]);
      cpu_->Gemm(ta, tb, m, n, k, 1.0f, abs_a.data(), abs_b.data(), 0.0f, magnitude.data());
      DeviceBuffer da = Up(a), db = Up(b), dc = Out(m * n);
      gpu_->Gemm(ta, tb, m, n, k, 1.0f, da.data(), db.data(), 0.0f, dc.data());
      const std::vector<float> got = Down(dc, m * n);
      const double unit = (GetParam() ? std::ldexp(1.0, -10) : std::ldexp(1.0, -23)) +
                          2 * k * std::ldexp(1.0, -24);
      for (int i = 0; i < m * n; ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << "gemm [" << i << "] was not written";
        ASSERT_NEAR(got[i], want[i], unit * magnitude[i] + 1e-7)
            << "gemm [" << i << "] (ta " << ta << ", tb " << tb << ")";
      }
    }
  }
}

TEST_P(CudaBackendTest, ElementwiseOps) {
  const int rows = 33, cols = 17;
  const std::vector<float> x = Random(rows * cols, 3), bias = Random(cols, 4), dy = Random(rows * cols, 5);
  std::vector<float> y(rows * cols), dx(rows * cols), db(cols), yb = x;
  cpu_->Relu(y.data(), x.data(), x.size());
  cpu_->ReluBackward(dx.data(), dy.data(), y.data(), x.size());
  cpu_->BiasGrad(db.data(), dy.data(), rows, cols);
  cpu_->AddBias(yb.data(), bias.data(), rows, cols);
  DeviceBuffer dx_in = Up(x), ddy = Up(dy), dbias = Up(bias);
  DeviceBuffer gy = Out(x.size()), gdx = Out(x.size()), gdb = Out(cols);
  gpu_->Relu(gy.data(), dx_in.data(), x.size());
  gpu_->ReluBackward(gdx.data(), ddy.data(), gy.data(), x.size());
  gpu_->BiasGrad(gdb.data(), ddy.data(), rows, cols);
  gpu_->AddBias(dx_in.data(), dbias.data(), rows, cols);
  ExpectNear(Down(gy, x.size()), y, "relu");
  ExpectNear(Down(gdx, x.size()), dx, "relu backward");
  ExpectNear(Down(gdb, cols), db, "bias grad");
  ExpectNear(Down(dx_in, x.size()), yb, "add bias");
}

TEST_P(CudaBackendTest, EmbeddingPoolAndScatterAdd) {
  const int dim = 16, unique = 50, batch = 40;
  std::mt19937 rng(6);
  std::vector<uint32_t> offsets(batch + 1, 0), indices;
  std::vector<float> values;
  for (int b = 0; b < batch; ++b) {
    for (uint32_t j = 0; j < rng() % 6; ++j) {
      indices.push_back(rng() % unique);
      values.push_back(std::uniform_real_distribution<float>(-2, 2)(rng));
    }
    offsets[b + 1] = static_cast<uint32_t>(indices.size());
  }
  const std::vector<float> rows = Random(unique * dim, 7), dout = Random(batch * dim, 8);
  std::vector<float> out(batch * dim), drows(unique * dim, 0.0f);
  cpu_->EmbeddingPool(out.data(), rows.data(), dim, indices.data(), values.data(), offsets.data(), batch);
  cpu_->EmbeddingPoolBackward(drows.data(), dout.data(), dim, indices.data(), values.data(),
                              offsets.data(), batch);
  DeviceBuffer grows = Up(rows), gdout = Up(dout), gvals = Up(values);
  DeviceBuffer gidx = UpIndices(indices), goff = UpIndices(offsets);
  DeviceBuffer gout = Out(out.size()), gdrows = Out(drows.size());
  auto* idx = reinterpret_cast<const uint32_t*>(gidx.data());
  auto* off = reinterpret_cast<const uint32_t*>(goff.data());
  gpu_->EmbeddingPool(gout.data(), grows.data(), dim, idx, gvals.data(), off, batch);
  gpu_->Fill(gdrows.data(), 0.0f, drows.size());
  gpu_->EmbeddingPoolBackward(gdrows.data(), gdout.data(), dim, idx, gvals.data(), off, batch);
  ExpectNear(Down(gout, out.size()), out, "pool");
  ExpectNear(Down(gdrows, drows.size()), drows, "scatter-add");
}

TEST_P(CudaBackendTest, InteractionForwardAndBackward) {
  const int batch = 19, fields = 26, dim = 16;
  const int width = dim + (fields + 1) * fields / 2;
  const std::vector<float> z = Random(batch * dim, 9), e = Random(batch * fields * dim, 10);
  const std::vector<float> dout = Random(batch * width, 11);
  std::vector<float> out(batch * width), dz(batch * dim), de(batch * fields * dim);
  cpu_->Interaction(out.data(), z.data(), e.data(), batch, fields, dim);
  cpu_->InteractionBackward(dz.data(), de.data(), dout.data(), z.data(), e.data(), batch, fields, dim);
  DeviceBuffer gz = Up(z), ge = Up(e), gd = Up(dout);
  DeviceBuffer gout = Out(out.size()), gdz = Out(dz.size()), gde = Out(de.size());
  gpu_->Interaction(gout.data(), gz.data(), ge.data(), batch, fields, dim);
  gpu_->InteractionBackward(gdz.data(), gde.data(), gd.data(), gz.data(), ge.data(), batch, fields, dim);
  ExpectNear(Down(gout, out.size()), out, "interaction");
  ExpectNear(Down(gdz, dz.size()), dz, "interaction dz");
  ExpectNear(Down(gde, de.size()), de, "interaction de");
}

TEST_P(CudaBackendTest, SigmoidBce) {
  const int n = 1000;
  std::vector<float> logits = Random(n, 12), labels(n);
  for (int i = 0; i < n; ++i) labels[i] = i % 3 == 0 ? 1.0f : 0.0f;
  std::vector<float> probs(n), dl(n);
  const double loss = cpu_->SigmoidBce(probs.data(), dl.data(), logits.data(), labels.data(), n);
  DeviceBuffer gl = Up(logits), gy = Up(labels), gp = Out(n), gd = Out(n);
  const double gloss = gpu_->SigmoidBce(gp.data(), gd.data(), gl.data(), gy.data(), n);
  EXPECT_NEAR(gloss, loss, 1e-6);
  ExpectNear(Down(gp, n), probs, "probs");
  ExpectNear(Down(gd, n), dl, "dlogits");
}

TEST_P(CudaBackendTest, WholeDlrmStepMatchesTheCpu) {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:1]\nmodel:\n  kind: dlrm\n  embedding_dim: 16\n"
      "  bottom: [64, 16]\n  top: [64, 1]\n",
      "dlrm.yaml");
  ASSERT_TRUE(m.ok());
  Batch batch;
  batch.Clear();
  std::mt19937_64 rng(13);
  for (int i = 0; i < 64; ++i) {
    std::string line = std::to_string(rng() % 2);
    for (int d = 0; d < 13; ++d) {
      line += '\t';
      line += std::to_string(rng() % 100);
    }
    for (int c = 0; c < 26; ++c) {
      line += '\t';
      line += std::to_string(rng() % 7);
    }
    ASSERT_TRUE(ParseCriteoRow(line, true, &batch).ok());
  }
  const BatchKeys keys = DeduplicateKeys(batch.keys);
  const std::vector<uint64_t>& unique = keys.unique;
  const std::vector<uint32_t>& indices = keys.indices;
  auto cpu_model = Model::Create(*m, cpu_.get(), 64);
  auto gpu_model = Model::Create(*m, gpu_.get(), 64);
  ASSERT_TRUE(cpu_model.ok() && gpu_model.ok());
  for (size_t t = 0; t < (*cpu_model)->DenseParams().size(); ++t) {
    (*cpu_model)->DenseParams()[t] = Random((*cpu_model)->DenseParams()[t].size(), 100 + t);
    for (auto& v : (*cpu_model)->DenseParams()[t]) v *= 0.2f;
    (*gpu_model)->DenseParams()[t] = (*cpu_model)->DenseParams()[t];
  }
  std::vector<float> rows = Random(unique.size() * 16, 14);
  const double lc = (*cpu_model)->Forward(batch, rows.data(), unique.size(), indices.data());
  const double lg = (*gpu_model)->Forward(batch, rows.data(), unique.size(), indices.data());
  std::vector<float> gc(rows.size()), gg(rows.size(), std::nanf(""));
  (*cpu_model)->Backward(gc.data());
  (*gpu_model)->Backward(gg.data());
  ASSERT_TRUE(gpu_->Sync().ok());
  EXPECT_NEAR(lg, lc, Tol() * (1 + std::abs(lc)));
  ExpectNear((*gpu_model)->Probabilities(), (*cpu_model)->Probabilities(), "probabilities");
  ExpectNear(gg, gc, "row gradients");
  for (size_t t = 0; t < (*cpu_model)->DenseGrads().size(); ++t) {
    ExpectNear((*gpu_model)->DenseGrads()[t], (*cpu_model)->DenseGrads()[t],
               "dense gradient " + std::to_string(t));
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, CudaBackendTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tf32" : "fp32"; });

}  // namespace
}  // namespace parasol
