// AdamW, gradient norm and scaling against a double-precision loop written from PyTorch's AdamW
// definition, over two steps (bias correction and the device step counter), on a list with a
// tensor at every boundary of the CUDA kernel (Specs below), then a NaN and an infinite gradient
// scale that must leave every output unchanged; CPU and CUDA against the same reference, the norm
// also for determinism. An optimizer has no gradient of its own, so there is no finite-difference
// test here. Fresh random inputs; outputs poisoned.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

// A parameter: gradient and copy dtypes (kF32 copy: none), and whether its tensors are views at
// element offset 1 (16-byte misaligned: the scalar path).
struct Spec {
  int64_t numel;
  DType grad, copy;
  float wd;
  bool unaligned;
};

struct State {
  std::vector<Tensor> owners;  // keeps the memory alive
  std::vector<AdamWParam> params;
};

// Parameters for `specs` on `device`: random weights, gradients, first and (positive) second
// moments; copies poisoned.
State MakeState(const std::vector<Spec>& specs, Device device) {
  std::mt19937_64& rng = Rng();
  State s;
  for (const Spec& sp : specs) {
    const int64_t n = sp.numel + (sp.unaligned ? 1 : 0);
    auto view = [&](const Tensor& t) { return sp.unaligned ? t.view().Slice0(1, n).value() : t.view(); };
    Tensor p = RandomTensor({n}, DType::kF32, device, rng);
    Tensor g = RandomTensor({n}, sp.grad, device, rng, 0.1f);
    Tensor m = RandomTensor({n}, DType::kF32, device, rng, 0.01f);
    std::vector<double> v_host;
    for (int64_t i = 0; i < n; ++i) v_host.push_back(1e-5 + 1e-3 * double(rng() % 1024) / 1024);
    Tensor v = FromHost(v_host, {n}, DType::kF32, device);
    const bool copy = sp.copy != DType::kF32;
    Tensor c = Tensor::Empty({n}, copy ? sp.copy : DType::kBF16, device).value();
    Poison(c);
    s.params.push_back({view(p), view(g), view(m), view(v), copy ? view(c) : TensorView(), sp.wd});
    for (Tensor* t : {&p, &g, &m, &v, &c}) s.owners.push_back(*t);
  }
  return s;
}

struct HostParam {
  std::vector<double> p, g, m, v;
  // Sums of the magnitudes of the terms that made p and m (a value that cancels to near zero is
  // judged against the size of what cancelled, not against itself).
  std::vector<double> p_scale, m_scale;
};

std::vector<HostParam> Snapshot(const State& s) {
  std::vector<HostParam> h;
  for (const AdamWParam& a : s.params) h.push_back({ToHost(a.param), ToHost(a.grad), ToHost(a.m), ToHost(a.v), {}, {}});
  for (HostParam& hp : h) {
    for (double x : hp.p) hp.p_scale.push_back(std::abs(x));
    for (double x : hp.m) hp.m_scale.push_back(std::abs(x));
  }
  return h;
}

// ||got - want|| / ||scale|| (L2); infinity for NaN or mismatched sizes.
double ErrorRelativeTo(const std::vector<double>& got, const std::vector<double>& want,
                       const std::vector<double>& scale) {
  if (got.size() != want.size() || want.size() != scale.size()) return std::numeric_limits<double>::infinity();
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += scale[i] * scale[i];
  }
  return std::sqrt(err) / std::sqrt(norm);
}

// One AdamW step in double (PyTorch's formula), t = the 1-based step.
void DoubleStep(std::vector<HostParam>& h, const std::vector<Spec>& specs, double lr, double gscale, int t,
                const AdamWConfig& c) {
  for (size_t k = 0; k < h.size(); ++k) {
    for (size_t i = 0; i < h[k].p.size(); ++i) {
      const double g = h[k].g[i] * gscale;
      double& m = h[k].m[i];
      double& v = h[k].v[i];
      double& p = h[k].p[i];
      m = c.beta1 * m + (1 - c.beta1) * g;
      h[k].m_scale[i] = c.beta1 * h[k].m_scale[i] + (1 - c.beta1) * std::abs(g);
      v = c.beta2 * v + (1 - c.beta2) * g * g;
      p *= 1 - lr * specs[k].wd;
      const double bc1 = 1 - std::pow(double(c.beta1), t), bc2 = 1 - std::pow(double(c.beta2), t);
      const double update = lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + c.eps);
      p -= update;
      h[k].p_scale[i] = h[k].p_scale[i] * (1 - lr * specs[k].wd) + std::abs(update);
    }
  }
}

// Sizes around every boundary of the CUDA kernel (tiles of 1024 elements, 4-element packs,
// chunks of 65536) and each of its gradient x copy paths: a lone element, pack tails, partial
// tiles with and without a pack tail, exactly one chunk, a tensor over several chunks whose last
// one ends in a partial tile, unaligned tensors (the scalar path).
const std::vector<Spec>& Specs() {
  constexpr int64_t kChunk = AdamWTensorList::kChunk;
  static const std::vector<Spec> specs = {
      {1, DType::kF32, DType::kF32, 0.f, false},
      {7, DType::kBF16, DType::kBF16, 0.1f, false},
      {4099, DType::kF32, DType::kF16, 0.1f, false},
      {2 * kChunk + 4096 + 12, DType::kBF16, DType::kBF16, 0.01f, false},
      {kChunk, DType::kF32, DType::kBF16, 0.1f, false},
      {3 * 1024 + 8, DType::kF32, DType::kF32, 0.1f, false},
      {2048 + 4, DType::kBF16, DType::kF16, 0.1f, false},
      {1024 + 6, DType::kBF16, DType::kF32, 0.1f, false},
      {333, DType::kF32, DType::kF16, 0.1f, true},
      {1000, DType::kBF16, DType::kBF16, 0.1f, true},
  };
  return specs;
}

// Every output (param, m, v, copy) of every parameter, exactly (each dtype converts to double
// without rounding).
std::vector<std::vector<double>> Outputs(const State& s) {
  std::vector<std::vector<double>> out;
  for (const AdamWParam& p : s.params) {
    for (const TensorView* t : {&p.param, &p.m, &p.v, &p.param_copy}) {
      if (t->raw() != nullptr) out.push_back(ToHost(*t));
    }
  }
  return out;
}

void CheckSteps(Device device) {
  SCOPED_TRACE(device.ToString());
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  State s = MakeState(Specs(), device);
  std::vector<HostParam> want = Snapshot(s);
  auto list = AdamWTensorList::Create(s.params);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->chunks(), 1 + 1 + 1 + 3 + 1 + 1 + 1 + 1 + 1 + 1);
  const AdamWConfig config{0.9f, 0.95f, 1e-8f};
  Tensor lr = FromHost({3e-3}, {}, DType::kF32, device);
  Tensor step = FromHost({4}, {1}, DType::kI64, device);  // 4 steps already done
  Tensor scale = FromHost({0.5}, {}, DType::kF32, device);
  for (int t = 5; t <= 6; ++t) {
    ASSERT_TRUE(AdamWStep(*list, config, lr, step, scale, stream).ok());
    DoubleStep(want, Specs(), double(3e-3f), 0.5, t, config);
  }
  ASSERT_TRUE(stream.Synchronize().ok());
  EXPECT_EQ(ToHost(step)[0], 6.0);
  for (size_t k = 0; k < s.params.size(); ++k) {
    SCOPED_TRACE("parameter " + std::to_string(k));
    // f32 state after two f32 updates of an f64-defined step: ~1e-6 of the size of the terms (a
    // one-element m whose terms cancelled was 1.9e-5 off relative to itself with seed
    // 1329167037081833815, the f32 rounding of its terms).
    EXPECT_LT(ErrorRelativeTo(ToHost(s.params[k].param), want[k].p, want[k].p_scale), 1e-6);
    EXPECT_LT(ErrorRelativeTo(ToHost(s.params[k].m), want[k].m, want[k].m_scale), 1e-6);
    EXPECT_LT(RelativeError(ToHost(s.params[k].v), want[k].v), 1e-5);
    if (Specs()[k].copy != DType::kF32) {
      // The bf16 or f16 copy is the f32 result rounded once.
      const Tensor rounded =
          FromHost(ToHost(s.params[k].param), s.params[k].param.shape(), Specs()[k].copy, Device::Cpu());
      EXPECT_EQ(ToHost(s.params[k].param_copy), ToHost(rounded));
    }
  }
  // A non-finite grad_scale (the loss scaler's overflow signal) leaves parameters, moments, copies
  // and the step counter bitwise unchanged.
  const auto before = Outputs(s);
  for (double bad : {double(NAN), double(INFINITY)}) {
    Tensor skip = FromHost({bad}, {}, DType::kF32, device);
    ASSERT_TRUE(AdamWStep(*list, config, lr, step, skip, stream).ok());
    ASSERT_TRUE(stream.Synchronize().ok());
    EXPECT_EQ(ToHost(step)[0], 6.0) << bad;
    EXPECT_TRUE(Outputs(s) == before) << "grad_scale " << bad << " changed the state";
  }
}

void CheckNorm(Device device) {
  SCOPED_TRACE(device.ToString());
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  State s = MakeState(Specs(), device);
  auto list = AdamWTensorList::Create(s.params).value();
  Tensor norm = Tensor::Empty({}, DType::kF32, device).value();
  Tensor clip = Tensor::Empty({}, DType::kF32, device).value();
  Tensor norm2 = Tensor::Empty({}, DType::kF32, device).value();
  Poison(norm);
  Poison(clip);
  ASSERT_TRUE(GradNorm(list, 0.25f, norm, clip, stream).ok());
  ASSERT_TRUE(GradNorm(list, 0.25f, norm2, TensorView(), stream).ok());
  // With the caller's scratch for the partial sums (a norm on another stream): the same bits.
  Tensor norm3 = Tensor::Empty({}, DType::kF32, device).value();
  Tensor scratch = Tensor::Empty({list.chunks() + 3}, DType::kF32, device).value();
  Poison(norm3);
  Poison(scratch);
  ASSERT_TRUE(GradNorm(list, 0.25f, norm3, TensorView(), stream, scratch).ok());
  const absl::Status small = GradNorm(list, 0.25f, norm3, TensorView(), stream,
                                       TensorView(scratch.view().raw(), DType::kF32, {list.chunks() - 1}, device));
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument) << small;
  EXPECT_NE(small.message().find(absl::StrCat("scratch must be f32 with at least ", list.chunks(), " elements")),
            std::string::npos) << small;
  ASSERT_TRUE(stream.Synchronize().ok());
  EXPECT_EQ(ToHost(norm3)[0], ToHost(norm2)[0]);
  double ss = 0;
  std::vector<std::vector<double>> grads;
  for (const AdamWParam& p : s.params) {
    grads.push_back(ToHost(p.grad));
    for (double g : grads.back()) ss += g * g;
  }
  const double want = std::sqrt(ss);
  EXPECT_NEAR(ToHost(norm)[0], want, 1e-6 * want);  // f32 chunk partials of f32 squares
  EXPECT_EQ(ToHost(norm)[0], ToHost(norm2)[0]);    // deterministic
  const double c = std::min(1.0, 0.25 / (want + 1e-6));
  ASSERT_LT(c, 1.0) << "the test needs a norm above max_norm";
  EXPECT_NEAR(ToHost(clip)[0], c, 1e-6 * c);
  // Clip the gradients themselves: the norm becomes max_norm.
  ASSERT_TRUE(ScaleGrads(list, clip, stream).ok());
  ASSERT_TRUE(GradNorm(list, 0.f, norm, clip, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  EXPECT_NEAR(ToHost(norm)[0], 0.25, 2e-3);  // bf16 gradients are rounded after scaling
  EXPECT_EQ(ToHost(clip)[0], 1.0);
}

// UpdateLossScale against the rules in adamw.h, one row per case.
void CheckLossScale(Device device) {
  SCOPED_TRACE(device.ToString());
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  struct Case {
    double scaled_norm, scale, good, step;  // inputs
    double norm, grad_scale, new_scale, new_good, skipped, new_step;  // expected
  };
  LossScaleConfig c;
  c.max_norm = 1.f;
  c.growth_interval = 3;
  c.min_scale = 4.f;
  const Case cases[] = {
      {0.5 * 1024, 1024, 0, 7, 0.5, 1.0 / 1024, 1024, 1, 0, 7},                  // below max_norm: no clip
      {4.0 * 1024, 1024, 1, 7, 4.0, (1 / (4.0 + 1e-6)) / 1024, 1024, 2, 0, 7},   // clipped
      {0.5 * 1024, 1024, 2, 7, 0.5, 1.0 / 1024, 2048, 0, 0, 7},                  // third good step: growth
      {INFINITY, 1024, 2, 7, INFINITY, NAN, 512, 0, 1, 6},                       // overflow: back off
      {NAN, 6, 1, 7, NAN, NAN, 4, 0, 1, 6},                                      // not below min_scale
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.scaled_norm) + " at scale " + std::to_string(k.scale));
    Tensor norm = FromHost({k.scaled_norm}, {}, DType::kF32, device);
    Tensor gs = Tensor::Empty({}, DType::kF32, device).value();
    Poison(gs);
    Tensor scale = FromHost({k.scale}, {}, DType::kF32, device);
    Tensor good = FromHost({k.good}, {}, DType::kF32, device);
    Tensor skipped = Tensor::Empty({}, DType::kF32, device).value();
    Poison(skipped);
    Tensor step = FromHost({k.step}, {}, DType::kF32, device);
    ASSERT_TRUE(UpdateLossScale(c, norm, gs, scale, good, skipped, step, stream).ok());
    ASSERT_TRUE(stream.Synchronize().ok());
    auto same = [](double got, double want) {
      if (std::isnan(want) || std::isinf(want)) return std::isnan(want) ? std::isnan(got) : got == want;
      return std::abs(got - want) <= 1e-6 * std::abs(want);
    };
    EXPECT_TRUE(same(ToHost(norm)[0], k.norm)) << ToHost(norm)[0];
    EXPECT_TRUE(same(ToHost(gs)[0], k.grad_scale)) << ToHost(gs)[0];
    EXPECT_EQ(ToHost(scale)[0], k.new_scale);
    EXPECT_EQ(ToHost(good)[0], k.new_good);
    EXPECT_EQ(ToHost(skipped)[0], k.skipped);
    EXPECT_EQ(ToHost(step)[0], k.new_step);
  }
  Tensor one = FromHost({1}, {}, DType::kF32, device);
  LossScaleConfig bad = c;
  bad.backoff = 1.5f;
  absl::Status st = UpdateLossScale(bad, one, one, one, one, one, TensorView(), stream);
  EXPECT_NE(st.message().find("backoff 1.5"), std::string::npos) << st;
}

TEST(AdamWCpuTest, MatchesDoubleReference) { CheckSteps(Device::Cpu()); }
TEST(AdamWCpuTest, GradNormAndClipping) { CheckNorm(Device::Cpu()); }
TEST(AdamWCpuTest, LossScaleUpdate) { CheckLossScale(Device::Cpu()); }

TEST(AdamWCpuTest, BadArgumentsAreNamed) {
  Tensor p = Tensor::Empty({8}, DType::kF32, Device::Cpu()).value();
  Tensor g = Tensor::Empty({9}, DType::kF32, Device::Cpu()).value();
  auto bad = AdamWTensorList::Create({AdamWParam{p, g, p, p, TensorView(), 0.f}});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("parameter 0: grad must be contiguous f32 or bf16 with 8 elements on cpu, found f32[9]@cpu"),
            std::string::npos)
      << bad.status();
  Tensor pc = Tensor::Empty({8}, DType::kF32, Device::Cpu()).value();
  bad = AdamWTensorList::Create({AdamWParam{p, p, p, p, pc, 0.f}});
  EXPECT_NE(bad.status().message().find("param_copy: expected contiguous bf16[8]@cpu, found f32[8]@cpu"),
            std::string::npos)
      << bad.status();
  auto list = AdamWTensorList::Create({AdamWParam{p, p, p, p, TensorView(), 0.f}}).value();
  Tensor lr = Tensor::Empty({2}, DType::kF32, Device::Cpu()).value();
  Tensor step = Tensor::Empty({}, DType::kF32, Device::Cpu()).value();
  absl::Status st = AdamWStep(list, {}, lr, step, TensorView(), Stream::Cpu());
  EXPECT_NE(st.message().find("lr must be a one-element f32 tensor on cpu, found f32[2]@cpu"), std::string::npos) << st;
  Tensor lr1 = Tensor::Empty({}, DType::kF32, Device::Cpu()).value();
  st = AdamWStep(list, {}, lr1, step, TensorView(), Stream::Cpu());
  EXPECT_NE(st.message().find("step must be a one-element i32 (or i64) tensor"), std::string::npos) << st;
}

// The kernel over every boundary of Specs, against the same double reference as the CPU.
TEST(AdamWCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  CheckSteps(Device::Cuda(0));
}
TEST(AdamWCudaTest, GradNormAndClipping) {
  SG_SKIP_WITHOUT_CUDA();
  CheckNorm(Device::Cuda(0));
}
TEST(AdamWCudaTest, LossScaleUpdate) {
  SG_SKIP_WITHOUT_CUDA();
  CheckLossScale(Device::Cuda(0));
}

}  // namespace
}  // namespace sg::kernels
