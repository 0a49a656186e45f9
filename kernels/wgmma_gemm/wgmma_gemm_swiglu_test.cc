// WgmmaGemmSwiGlu and the W13 interleave. On the CPU: argument checks, the interleave's layout and
// round trip, and the header's claim that the interleaved gate_up viewed as [M F / 128, 256] is
// kernels/swiglu's packed layout (forward and backward). On an sm_90 GPU: one-tile probes (inputs
// whose gate | up are small integers, so a wrong tile column, box, swizzle or h column is named),
// fresh random products against a double-precision silu(x W1^T) * (x W3^T) with a bf16 bound per
// element, and bitwise agreement with WgmmaGemm + SwiGluPackedForward. Outputs are poisoned (NaN)
// before every run.
#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

#include <stdlib.h>

#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"
#include "kernels/swiglu/swiglu.h"
#include "kernels/wgmma_gemm/wgmma_gemm.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;
using Vec = std::vector<double>;

Tensor Empty(const Shape& s, DType t, Device d) { return Tensor::Empty(s, t, d).value(); }

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

// An absolute floor for h's bounds: silu(g) of a very negative g is below f32's normal range, where
// the kernel's approximate e^-g and reciprocal flush it to zero.
constexpr double kTiny = 1e-30;

// The interleaved row of W13 holding row r of W1 (up = false) or of W3.
int64_t W13Row(int64_t r, bool up) {
  return 2 * kSwiGluBlock * (r / kSwiGluBlock) + (up ? kSwiGluBlock : 0) + r % kSwiGluBlock;
}

TEST(WgmmaGemmSwiGluTest, BadArgumentsAreNamed) {
  const Device cpu = Device::Cpu();
  const DType bf = DType::kBF16;
  Tensor x = Empty({128, 64}, bf, cpu), w13 = Empty({256, 64}, bf, cpu), h = Empty({128, 128}, bf, cpu);
  absl::Status s = WgmmaGemmSwiGlu(x, Empty({256, 32}, bf, cpu), std::nullopt, h, std::nullopt, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("w13 must be the interleaved [2F, 64] (2F a multiple of 256)"), std::string::npos) << s;
  s = WgmmaGemmSwiGlu(x, Empty({384, 64}, bf, cpu), std::nullopt, h, std::nullopt, Stream::Cpu());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;  // 2F = 384: no whole block pair
  s = WgmmaGemmSwiGlu(x, w13, std::nullopt, Empty({128, 256}, bf, cpu), std::nullopt, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("h must be bf16[..., 128] with 128 rows"), std::string::npos) << s;
  s = WgmmaGemmSwiGlu(x, w13, std::nullopt, h, Empty({128, 128}, bf, cpu).view(), Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("gate_up must be bf16[..., 256] with 128 rows on cpu, found bf16[128,128]@cpu"),
            std::string::npos)
      << s;
  s = WgmmaGemmSwiGlu(x, w13, Empty({64}, DType::kF32, cpu).view(), h, std::nullopt, Stream::Cpu());
  EXPECT_NE(s.message().find("row_scale must be a contiguous f32 [128] on cpu, found f32[64]@cpu"), std::string::npos)
      << s;

  s = InterleaveGateUp(Empty({100, 64}, bf, cpu), Empty({100, 64}, bf, cpu), Empty({200, 64}, bf, cpu), Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("w1 must be a non-empty [F, K] with F a multiple of 128, found bf16[100,64]@cpu"),
            std::string::npos)
      << s;
  s = InterleaveGateUp(Empty({128, 64}, bf, cpu), Empty({128, 64}, DType::kF32, cpu), w13, Stream::Cpu());
  EXPECT_NE(s.message().find("w3 must match w1 bf16[128,64]@cpu, found f32[128,64]@cpu"), std::string::npos) << s;
  s = DeinterleaveGateUp(Empty({256, 32}, bf, cpu), Empty({128, 64}, bf, cpu), Empty({128, 64}, bf, cpu),
                         Stream::Cpu());
  EXPECT_NE(s.message().find("w13 must be bf16[256,64]@cpu to match w1 bf16[128,64]@cpu, found bf16[256,32]@cpu"),
            std::string::npos)
      << s;
}

// Valid products the kernel does not cover are Unimplemented, so callers fall back to the GEMMs.
TEST(WgmmaGemmSwiGluTest, OutsideTheKernelIsUnimplemented) {
  const Device cpu = Device::Cpu();
  const DType bf = DType::kBF16;
  EXPECT_EQ(WgmmaGemmSwiGlu(Empty({128, 64}, bf, cpu), Empty({256, 64}, bf, cpu), std::nullopt,
                            Empty({128, 128}, bf, cpu), std::nullopt, Stream::Cpu())
                .code(),
            absl::StatusCode::kUnimplemented);
  if (!CudaAvailable()) return;
  const Device gpu = Device::Cuda(0);
  Stream st = Stream::Create(gpu).value();
  struct Bad {
    int64_t m, f, k;
    DType t;
  };
  for (const Bad& c : {Bad{100, 128, 64, bf}, Bad{128, 128, 32, bf}, Bad{128, 128, 64, DType::kF32}}) {
    const absl::Status s = WgmmaGemmSwiGlu(Empty({c.m, c.k}, c.t, gpu), Empty({2 * c.f, c.k}, c.t, gpu), std::nullopt,
                                           Empty({c.m, c.f}, c.t, gpu), std::nullopt, st);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << c.m << "x" << c.f << "x" << c.k << ": " << s;
  }
}

// The lowering's question before any tensor exists agrees with the launch's answer: shapes, dtype
// and device kind without a GPU query; with one, the current GPU (sm_90 here, or Unimplemented).
TEST(WgmmaGemmSwiGluTest, SupportsNamesWhatIsOutside) {
  const DType bf = DType::kBF16;
  const Device gpu = Device::Cuda(0);
  EXPECT_TRUE(WgmmaGemmSwiGluSupports(16384, 2048, 8192, bf, gpu, /*query_gpu=*/false).ok());
  EXPECT_EQ(WgmmaGemmSwiGluSupports(128, 64, 128, bf, Device::Cpu(), false).code(), absl::StatusCode::kUnimplemented);
  struct Bad {
    int64_t m, k, f;
    DType t;
  };
  for (const Bad& c :
       {Bad{100, 64, 128, bf}, Bad{128, 32, 128, bf}, Bad{128, 64, 96, bf}, Bad{128, 64, 128, DType::kF32}}) {
    const absl::Status s = WgmmaGemmSwiGluSupports(c.m, c.k, c.f, c.t, gpu, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << c.m << "x" << c.k << "x" << c.f << ": " << s;
    EXPECT_NE(s.message().find("WgmmaGemmSwiGlu"), absl::string_view::npos) << s;
  }
  const absl::Status queried = WgmmaGemmSwiGluSupports(128, 64, 128, bf, gpu);
  if (!CudaAvailable()) {
    EXPECT_EQ(queried.code(), absl::StatusCode::kUnimplemented) << queried;
    return;
  }
  // On a GPU the answer is the launch's: OK runs, Unimplemented is what the launch says too.
  Stream st = Stream::Create(gpu).value();
  const absl::Status launched = WgmmaGemmSwiGlu(Empty({128, 64}, bf, gpu), Empty({256, 64}, bf, gpu), std::nullopt,
                                                Empty({128, 128}, bf, gpu), std::nullopt, st);
  EXPECT_EQ(queried.code(), launched.code()) << queried << " vs " << launched;
}

// The same for the backward: F must be a multiple of the whole 256-column tile (not of 128), and
// the queried answer is the launch's.
TEST(WgmmaGemmSwiGluTest, BackwardSupportsNamesWhatIsOutside) {
  const DType bf = DType::kBF16;
  const Device gpu = Device::Cuda(0);
  EXPECT_TRUE(WgmmaGemmSwiGluBackwardSupports(16384, 2048, 8192, bf, gpu, /*query_gpu=*/false).ok());
  EXPECT_TRUE(WgmmaGemmSwiGluBackwardSupports(8192, 4096, 11008, bf, gpu, false).ok());  // 7b: 43 tiles
  struct Bad {
    int64_t m, k, f;
    DType t;
    Device d;
  };
  for (const Bad& c : {Bad{128, 64, 256, bf, Device::Cpu()}, Bad{100, 64, 256, bf, gpu}, Bad{128, 32, 256, bf, gpu},
                       Bad{128, 64, 128, bf, gpu}, Bad{128, 64, 256, DType::kF16, gpu}, Bad{0, 64, 256, bf, gpu}}) {
    const absl::Status s = WgmmaGemmSwiGluBackwardSupports(c.m, c.k, c.f, c.t, c.d, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << c.m << "x" << c.k << "x" << c.f << ": " << s;
    EXPECT_NE(s.message().find("WgmmaGemmSwiGluBackward"), absl::string_view::npos) << s;
  }
  const absl::Status queried = WgmmaGemmSwiGluBackwardSupports(128, 64, 256, bf, gpu);
  if (!CudaAvailable()) {
    EXPECT_EQ(queried.code(), absl::StatusCode::kUnimplemented) << queried;
    return;
  }
  Stream st = Stream::Create(gpu).value();
  Tensor dy = Empty({128, 64}, bf, gpu), w2t = Empty({256, 64}, bf, gpu), g = Empty({128, 256}, bf, gpu),
         u = Empty({128, 256}, bf, gpu);
  const absl::Status launched = WgmmaGemmSwiGluBackward(dy, w2t, g, u, g, u, st);
  EXPECT_EQ(queried.code(), launched.code()) << queried << " vs " << launched;
}

// Interleave puts W1's and W3's rows where W13Row says, and Deinterleave gives them back.
void CheckInterleaveRoundTrip(const Device& dev, DType dtype) {
  SCOPED_TRACE(dev.ToString() + " " + std::string(DTypeName(dtype)));
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  const int64_t f = 384, k = 24;
  Tensor w1 = RandomTensor({f, k}, dtype, dev, Rng()), w3 = RandomTensor({f, k}, dtype, dev, Rng());
  Tensor w13 = Empty({2 * f, k}, dtype, dev), b1 = Empty({f, k}, dtype, dev), b3 = Empty({f, k}, dtype, dev);
  Poison(w13);
  Poison(b1);
  Poison(b3);
  ASSERT_TRUE(InterleaveGateUp(w1, w3, w13, stream).ok());
  ASSERT_TRUE(DeinterleaveGateUp(w13, b1, b3, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  const Vec h1 = ToHost(w1), h3 = ToHost(w3), h13 = ToHost(w13);
  int64_t wrong = 0;
  for (int64_t r = 0; r < f; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      wrong += !(h13[size_t(W13Row(r, false) * k + c)] == h1[size_t(r * k + c)]);
      wrong += !(h13[size_t(W13Row(r, true) * k + c)] == h3[size_t(r * k + c)]);
    }
  }
  EXPECT_EQ(wrong, 0) << "elements of w13 off the interleaved layout";
  EXPECT_EQ(ToHost(b1), h1);
  EXPECT_EQ(ToHost(b3), h3);
}

TEST(WgmmaGemmSwiGluTest, InterleaveRoundTrip) {
  for (const DType t : {DType::kBF16, DType::kF32}) CheckInterleaveRoundTrip(Device::Cpu(), t);
}

TEST(WgmmaGemmSwiGluCudaTest, InterleaveRoundTrip) {
  SG_SKIP_WITHOUT_CUDA();
  for (const DType t : {DType::kBF16, DType::kF32}) CheckInterleaveRoundTrip(Device::Cuda(0), t);
}

// The header's claim, on the CPU in f32: gate_up = x W13^T viewed as [M F / 128, 256] is the packed
// [gate | up] of kernels/swiglu, so SwiGluPackedForward gives silu(x W1^T) * (x W3^T) and
// SwiGluPackedBackward gives dgate and dup at the interleaved columns.
TEST(WgmmaGemmSwiGluTest, InterleavedGateUpIsSwiGluPackedLayout) {
  const Device cpu = Device::Cpu();
  const Stream st = Stream::Cpu();
  const DType t = DType::kF32;
  const int64_t m = 6, f = 256, k = 40;
  Tensor x = RandomTensor({m, k}, t, cpu, Rng()), w1 = RandomTensor({f, k}, t, cpu, Rng());
  Tensor w3 = RandomTensor({f, k}, t, cpu, Rng()), dh = RandomTensor({m, f}, t, cpu, Rng());
  Tensor w13 = Empty({2 * f, k}, t, cpu), gate_up = Empty({m, 2 * f}, t, cpu), h = Empty({m, f}, t, cpu);
  Tensor gate = Empty({m, f}, t, cpu), up = Empty({m, f}, t, cpu), want = Empty({m, f}, t, cpu);
  Tensor dgate_up = Empty({m, 2 * f}, t, cpu), dgate = Empty({m, f}, t, cpu), dup = Empty({m, f}, t, cpu);
  for (const Tensor* o : {&w13, &gate_up, &h, &gate, &up, &want, &dgate_up, &dgate, &dup}) Poison(*o);
  ASSERT_TRUE(InterleaveGateUp(w1, w3, w13, st).ok());
  ASSERT_TRUE(MatmulForward(x, w13, std::nullopt, gate_up, st).ok());
  ASSERT_TRUE(MatmulForward(x, w1, std::nullopt, gate, st).ok());
  ASSERT_TRUE(MatmulForward(x, w3, std::nullopt, up, st).ok());
  ASSERT_TRUE(SwiGluForward(gate, up, want, st).ok());
  const TensorView gate_up_blocks = gate_up.view().Reshape({m * f / kSwiGluBlock, 2 * kSwiGluBlock}).value();
  const TensorView dgate_up_blocks = dgate_up.view().Reshape({m * f / kSwiGluBlock, 2 * kSwiGluBlock}).value();
  const TensorView h_blocks = h.view().Reshape({m * f / kSwiGluBlock, kSwiGluBlock}).value();
  const TensorView dh_blocks = dh.view().Reshape({m * f / kSwiGluBlock, kSwiGluBlock}).value();
  ASSERT_TRUE(SwiGluPackedForward(gate_up_blocks, h_blocks, st).ok());
  EXPECT_LT(RelativeError(ToHost(h), ToHost(want)), 1e-5);  // the same dot products, summed in another order
  ASSERT_TRUE(SwiGluPackedBackward(dh_blocks, gate_up_blocks, dgate_up_blocks, st).ok());
  ASSERT_TRUE(SwiGluBackward(dh, gate, up, dgate, dup, st).ok());
  const Vec got = ToHost(dgate_up), want_g = ToHost(dgate), want_u = ToHost(dup);
  Vec got_g(want_g.size()), got_u(want_u.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < f; ++c) {
      got_g[size_t(i * f + c)] = got[size_t(i * 2 * f + W13Row(c, false))];
      got_u[size_t(i * f + c)] = got[size_t(i * 2 * f + W13Row(c, true))];
    }
  }
  EXPECT_LT(RelativeError(got_g, want_g), 1e-5);
  EXPECT_LT(RelativeError(got_u, want_u), 1e-5);
}

// --- on the GPU --------------------------------------------------------------------------------------------

struct Outputs {
  Vec h, gate_up;  // gate_up empty when not asked for
};

// Runs the fused kernel on host inputs (bf16 x [m, k], w13 [n, k], optional f32 scale), poisoned
// outputs, and returns them.
Outputs RunFused(const Vec& x, const Vec& w13, const Vec* scale, int64_t m, int64_t n, int64_t k, bool with_gate_up) {
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  Tensor tx = FromHost(x, {m, k}, DType::kBF16, gpu), tw = FromHost(w13, {n, k}, DType::kBF16, gpu);
  Tensor ts = FromHost(scale != nullptr ? *scale : Vec(size_t(m), 1.0), {m}, DType::kF32, gpu);
  Tensor h = Empty({m, n / 2}, DType::kBF16, gpu), gate_up = Empty({m, n}, DType::kBF16, gpu);
  Poison(h);
  Poison(gate_up);
  std::optional<TensorView> row_scale, gu;
  if (scale != nullptr) row_scale = ts.view();
  if (with_gate_up) gu = gate_up.view();
  const absl::Status s = WgmmaGemmSwiGlu(tx, tw, row_scale, h, gu, stream);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(stream.Synchronize().ok());
  return Outputs{ToHost(h), with_gate_up ? ToHost(gate_up) : Vec()};
}

struct Probe {
  const char* name;                                // which part of the kernel a mismatch points at
  int64_t m, n, k;                                 // n: W13's rows (2F)
  std::function<double(int64_t, int64_t)> x, w13;  // x(i, k), w13(j, k): small integers
  std::function<double(int64_t)> scale;            // row scale, or null for none
  std::function<double(int64_t, int64_t)> d;       // the exact gate_up(i, j) = scale(i) (x w13^T)(i, j)
  const char* meaning;                             // what a wrong gate_up value names
};

double Delta(int64_t a, int64_t b) { return a == b ? 1.0 : 0.0; }

void RunProbe(const Probe& p) {
  SCOPED_TRACE(std::string(p.name) + ", " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" +
               std::to_string(p.k));
  Vec x(size_t(p.m * p.k)), w(size_t(p.n * p.k)), scale(size_t(p.m));
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t c = 0; c < p.k; ++c) x[size_t(i * p.k + c)] = p.x(i, c);
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t c = 0; c < p.k; ++c) w[size_t(j * p.k + c)] = p.w13(j, c);
  for (int64_t i = 0; i < p.m; ++i) scale[size_t(i)] = p.scale ? p.scale(i) : 1.0;
  const Outputs both = RunFused(x, w, p.scale ? &scale : nullptr, p.m, p.n, p.k, true);
  const Outputs h_only = RunFused(x, w, p.scale ? &scale : nullptr, p.m, p.n, p.k, false);
  const int64_t f = p.n / 2;
  int64_t wrong_d = 0, wrong_h = 0, differ = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      const double g = both.gate_up[size_t(i * p.n + j)], want = p.d(i, j);
      if (g != want && ++wrong_d <= 6) {
        first << "\n  gate_up[" << i << "][" << j << "] = " << g << ", want " << want << " (" << p.meaning << ")";
      }
    }
    for (int64_t c = 0; c < f; ++c) {
      // h from the exact gate and up in double: bf16 output rounding (2^-9) with margin.
      const double gate = p.d(i, W13Row(c, false)), up = p.d(i, W13Row(c, true));
      const double want = Silu(gate) * up, got = both.h[size_t(i * f + c)];
      if (!(std::fabs(got - want) <= std::ldexp(std::fabs(want), -8) + kTiny) && ++wrong_h <= 6) {
        first << "\n  h[" << i << "][" << c << "] = " << got << ", want silu(" << gate << ") * " << up << " = " << want;
      }
      differ += !(h_only.h[size_t(i * f + c)] == got);
    }
  }
  EXPECT_EQ(wrong_d, 0) << wrong_d << " gate_up values wrong; first:" << first.str();
  EXPECT_EQ(wrong_h, 0) << wrong_h << " h values wrong; first:" << first.str();
  EXPECT_EQ(differ, 0) << "the h-only epilogue differs from the h + gate_up one in " << differ << " outputs";
}

// One tile (and two M-adjacent tiles, and two tiles along N) of 128 gate and 128 up columns. With
// x(i, k) = [k == i % 64], gate_up(i, j) = w13(j, i % 64): w13(j, k) = j names the W13 row that
// reached column j of gate_up and, through h = silu(j) * (j + 128), the pairing of gate and up
// columns in h; w13(j, k) = k names the k of W13 met by x's k and the rows of h. x(i, k) = i names x's
// rows. Values stay below 256 (exact in bf16).
TEST(WgmmaGemmSwiGluCudaTest, OneTileProbes) {
  SG_SKIP_WITHOUT_CUDA();
  const std::vector<Probe> probes = {
      {"W13 rows (B box, tile columns, gate/up pairing in h)", 128, 256, 64,
       [](int64_t i, int64_t c) { return Delta(c, i % 64); }, [](int64_t j, int64_t) { return double(j); }, nullptr,
       [](int64_t, int64_t j) { return double(j); }, "the value is the W13 row that reached this column"},
      {"W13 k order (B swizzle, k16 steps; rows of h)", 128, 256, 64,
       [](int64_t i, int64_t c) { return Delta(c, i % 64); }, [](int64_t, int64_t c) { return double(c); }, nullptr,
       [](int64_t i, int64_t) { return double(i % 64); }, "the value is the k of W13 met by x's k = i % 64"},
      {"x rows (A box, warpgroup rows, h rows)", 256, 256, 64, [](int64_t i, int64_t) { return double(i % 256); },
       [](int64_t j, int64_t c) { return Delta(c, j % 64); }, nullptr, [](int64_t i, int64_t) { return double(i); },
       "the value is the x row that reached this row"},
      {"row scale", 128, 256, 64, [](int64_t i, int64_t c) { return Delta(c, i % 64); },
       [](int64_t j, int64_t) { return j < 128 ? 1.0 : 2.0; }, [](int64_t i) { return double(i + 1) / 8; },
       [](int64_t i, int64_t j) { return (j < 128 ? 1.0 : 2.0) * double(i + 1) / 8; },
       "the value is (the row whose scale was applied + 1) / 8, doubled in up columns"},
      {"N tiles (h column of each tile)", 128, 512, 64, [](int64_t i, int64_t c) { return Delta(c, i % 64); },
       [](int64_t j, int64_t) { return double(1 + j / 128); }, nullptr,
       [](int64_t, int64_t j) { return double(1 + j / 128); }, "the value - 1 is the 128-row block of W13"},
      {"k-blocks (ring stages, mbarrier phases)", 128, 256, 256,
       [](int64_t i, int64_t c) { return Delta(c, (2 * i + 1) % 256); }, [](int64_t, int64_t c) { return double(c); },
       nullptr, [](int64_t i, int64_t) { return double((2 * i + 1) % 256); },
       "the value is the k of W13 met by x's k = (2 i + 1) % 256"},
  };
  for (const Probe& p : probes) RunProbe(p);
}

// --- random products against the double reference ----------------------------------------------------

struct Case {
  Shape x_shape;  // [..., K], M = the product of the leading dims
  int64_t f;      // W1's (and W3's) rows
  bool scaled;
  bool with_gate_up;
};

void CheckAgainstReference(const Case& c) {
  const int64_t k = c.x_shape.back();
  int64_t m = 1;
  for (size_t i = 0; i + 1 < c.x_shape.size(); ++i) m *= c.x_shape[i];
  const int64_t f = c.f;
  SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(f) + "x" + std::to_string(k) +
               (c.scaled ? " scaled" : " unscaled") + (c.with_gate_up ? ", h + gate_up" : ", h only"));
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  auto& rng = Rng();
  Tensor x = RandomTensor(c.x_shape, DType::kBF16, gpu, rng);
  Tensor w1 = RandomTensor({f, k}, DType::kBF16, gpu, rng), w3 = RandomTensor({f, k}, DType::kBF16, gpu, rng);
  Tensor w13 = Empty({2 * f, k}, DType::kBF16, gpu);
  ASSERT_TRUE(InterleaveGateUp(w1, w3, w13, stream).ok());
  Vec scale(size_t(m), 1.0);
  std::uniform_real_distribution<double> u(0.25, 4.0);
  if (c.scaled) {
    for (double& v : scale) v = u(rng);
  }
  Tensor ts = FromHost(scale, {m}, DType::kF32, gpu);
  Shape h_shape = c.x_shape, gu_shape = c.x_shape;
  h_shape.back() = f;
  gu_shape.back() = 2 * f;
  Tensor h = Empty(h_shape, DType::kBF16, gpu), gate_up = Empty(gu_shape, DType::kBF16, gpu);
  Poison(h);
  Poison(gate_up);
  std::optional<TensorView> row_scale, gu;
  if (c.scaled) row_scale = ts.view();
  if (c.with_gate_up) gu = gate_up.view();
  const absl::Status s = WgmmaGemmSwiGlu(x, w13, row_scale, h, gu, stream);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(stream.Synchronize().ok());

  const Vec hx = ToHost(x), h1 = ToHost(w1), h3 = ToHost(w3), hs = ToHost(ts), got = ToHost(h);
  const Vec got_gu = c.with_gate_up ? ToHost(gate_up) : Vec();
  Vec want(size_t(m * f));
  int64_t wrong = 0, wrong_gu = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < f; ++j) {
      double g = 0, g_abs = 0, v = 0, v_abs = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double a = hx[size_t(i * k + q)], pg = a * h1[size_t(j * k + q)], pu = a * h3[size_t(j * k + q)];
        g += pg, g_abs += std::fabs(pg), v += pu, v_abs += std::fabs(pu);
      }
      const double sc = hs[size_t(i)];
      g *= sc, v *= sc, g_abs *= sc, v_abs *= sc;
      // gate and up as the kernel rounds them: bf16 (2^-9 relative, 2^-8 with margin) after an f32
      // accumulation (generously 2^-16 of the sum of |products|, far below a layout error's O(1)).
      const double eg = std::ldexp(std::fabs(g), -8) + std::ldexp(g_abs, -16);
      const double ev = std::ldexp(std::fabs(v), -8) + std::ldexp(v_abs, -16);
      const double sig = 1 / (1 + std::exp(-g)), dsilu = sig * (1 + g * (1 - sig));  // |silu'| < 1.1
      const double w = Silu(g) * v;
      want[size_t(i * f + j)] = w;
      // h's own bf16 rounding, and gate's and up's errors carried through silu(g) * u (with a 2x
      // margin on the first-order terms).
      const double bound =
          std::ldexp(std::fabs(w), -8) + 2 * (std::fabs(dsilu * v) * eg + std::fabs(Silu(g)) * ev) + kTiny;
      const double e = got[size_t(i * f + j)];
      if (!(std::fabs(e - w) <= bound) && ++wrong <= 5) {
        first << "\n  h[" << i << "][" << j << "] = " << e << ", want " << w << " (bound " << bound << ")";
      }
      if (c.with_gate_up) {
        const double eg_got = got_gu[size_t(i * 2 * f + W13Row(j, false))];
        const double ev_got = got_gu[size_t(i * 2 * f + W13Row(j, true))];
        wrong_gu += !(std::fabs(eg_got - g) <= eg) + !(std::fabs(ev_got - v) <= ev);
      }
    }
  }
  // L2: bf16 output rounding alone is ~1.1e-3 relative; gate's and up's roundings add about as much.
  EXPECT_LT(RelativeError(got, want), 5e-3);
  EXPECT_EQ(wrong, 0) << wrong << " of " << m * f << " outputs outside the bf16 bound; first:" << first.str();
  EXPECT_EQ(wrong_gu, 0) << wrong_gu << " gate_up values outside the bf16 bound";
}

TEST(WgmmaGemmSwiGluCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  const std::vector<Case> cases = {
      {{128, 64}, 128, false, true},   // one tile, one k-block
      {{128, 64}, 128, true, false},   // the same, h only, scaled
      {{256, 2048}, 256, true, true},  // 2 x 2 tiles, 32 k-blocks (8 passes over the ring)
      {{256, 2048}, 256, false, false},
      {{128, 8192}, 128, true, true},  // one tile, 128 k-blocks
      {{128, 8192}, 128, false, false},
      {{2, 192, 192}, 384, true, true},  // leading dims (M = 384), 3 k-blocks, 3 tiles along N
      {{2048, 64}, 2048, true, false},   // 256 tiles: several per persistent block
      {{2048, 64}, 2048, false, true},
  };
  for (const Case& c : cases) CheckAgainstReference(c);
}

// h is WgmmaGemm into gate_up followed by SwiGluPackedForward on the [M F / 128, 256] view, bit for
// bit (the epilogue rounds gate and up to bf16 and uses kernels/swiglu's arithmetic), and gate_up
// is WgmmaGemm's output bit for bit; on a problem of many tiles and k-blocks, with a row scale.
TEST(WgmmaGemmSwiGluCudaTest, MatchesUnfusedBitwise) {
  SG_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(unsetenv("SG_SWIGLU_KERNEL"), 0);
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  auto& rng = Rng();
  const int64_t m = 1024, f = 768, k = 640;
  Tensor x = RandomTensor({m, k}, DType::kBF16, gpu, rng), w13 = RandomTensor({2 * f, k}, DType::kBF16, gpu, rng);
  Tensor scale = RandomTensor({m}, DType::kF32, gpu, rng, 2.0f);
  Tensor d = Empty({m, 2 * f}, DType::kBF16, gpu), h_ref = Empty({m, f}, DType::kBF16, gpu);
  Tensor h = Empty({m, f}, DType::kBF16, gpu), gate_up = Empty({m, 2 * f}, DType::kBF16, gpu);
  Tensor h_only = Empty({m, f}, DType::kBF16, gpu);
  for (const Tensor* o : {&d, &h_ref, &h, &gate_up, &h_only}) Poison(*o);
  ASSERT_TRUE(WgmmaGemm(x, w13, scale.view(), d, stream, WgmmaGemmVariant::kTmaStore).ok());
  ASSERT_TRUE(SwiGluPackedForward(d.view().Reshape({m * f / kSwiGluBlock, 2 * kSwiGluBlock}).value(),
                                  h_ref.view().Reshape({m * f / kSwiGluBlock, kSwiGluBlock}).value(), stream)
                  .ok());
  absl::Status s = WgmmaGemmSwiGlu(x, w13, scale.view(), h, gate_up.view(), stream);
  ASSERT_TRUE(s.ok()) << s;
  s = WgmmaGemmSwiGlu(x, w13, scale.view(), h_only, std::nullopt, stream);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(stream.Synchronize().ok());
  auto count_differ = [](const Vec& a, const Vec& b) {
    int64_t n = 0;
    for (size_t e = 0; e < b.size(); ++e) n += !(a[e] == b[e]);  // NaN (unwritten) differs too
    return n;
  };
  const Vec want_h = ToHost(h_ref);
  EXPECT_EQ(count_differ(ToHost(d), ToHost(gate_up)), 0) << "gate_up differs from WgmmaGemm's output";
  EXPECT_EQ(count_differ(want_h, ToHost(h)), 0) << "h (with gate_up) differs from WgmmaGemm + SwiGluPackedForward";
  EXPECT_EQ(count_differ(want_h, ToHost(h_only)), 0) << "h (h only) differs from WgmmaGemm + SwiGluPackedForward";
}

// --- the backward: WgmmaGemmSwiGluBackward and TransposeMatrix --------------------------------------

TEST(WgmmaGemmSwiGluBackwardTest, BadArgumentsAreNamed) {
  const Device cpu = Device::Cpu();
  const DType bf = DType::kBF16;
  Tensor dy = Empty({128, 64}, bf, cpu), w2t = Empty({256, 64}, bf, cpu), g = Empty({128, 256}, bf, cpu);
  Tensor u = Empty({128, 256}, bf, cpu), dg = Empty({128, 256}, bf, cpu), du = Empty({128, 256}, bf, cpu);
  absl::Status s = WgmmaGemmSwiGluBackward(dy, Empty({256, 32}, bf, cpu), g, u, dg, du, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("w2t must be bf16[F, 64]@cpu (the transposed down projection) to match dy "
                             "bf16[128,64]@cpu, found bf16[256,32]@cpu"),
            std::string::npos)
      << s;
  s = WgmmaGemmSwiGluBackward(dy, w2t, g, Empty({128, 128}, bf, cpu), dg, du, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("up must be bf16[..., 256] with 128 rows on cpu"), std::string::npos) << s;
  s = WgmmaGemmSwiGluBackward(dy, w2t, g, u, dg, Empty({128, 256}, DType::kF32, cpu), Stream::Cpu());
  EXPECT_NE(s.message().find("dup must be bf16[..., 256]"), std::string::npos) << s;
  s = WgmmaGemmSwiGluBackward(dy, w2t, g, u, dg, du, Stream::Cpu());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;  // valid, but the kernel is CUDA only
  EXPECT_NE(s.message().find("CUDA only"), std::string::npos) << s;

  s = TransposeMatrix(Empty({3, 5}, bf, cpu), Empty({3, 5}, bf, cpu), Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dst must be a contiguous bf16[5,3]@cpu to hold src bf16[3,5]@cpu transposed, found "
                             "bf16[3,5]@cpu"),
            std::string::npos)
      << s;
  Tensor square = Empty({4, 4}, bf, cpu);
  s = TransposeMatrix(square, square, Stream::Cpu());
  EXPECT_NE(s.message().find("must not overlap src"), std::string::npos) << s;
}

// Every element lands at its transposed place: on the CPU (f32, odd sizes) against the index
// formula, on the GPU (bf16, sizes that leave partial 64 x 64 tiles) against the CPU transpose.
TEST(WgmmaGemmSwiGluBackwardTest, TransposeMatrixMovesEveryElement) {
  auto& rng = Rng();
  Tensor a = RandomTensor({37, 53}, DType::kF32, Device::Cpu(), rng), at = Empty({53, 37}, DType::kF32, Device::Cpu());
  Poison(at);
  ASSERT_TRUE(TransposeMatrix(a, at, Stream::Cpu()).ok());
  const Vec av = ToHost(a), atv = ToHost(at);
  for (int64_t r = 0; r < 37; ++r) {
    for (int64_t c = 0; c < 53; ++c) ASSERT_EQ(atv[size_t(c * 37 + r)], av[size_t(r * 53 + c)]) << r << "," << c;
  }
  if (!CudaAvailable()) GTEST_SKIP() << "the CUDA transpose needs a GPU: " << CudaUnavailableReason();
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{200, 130}, {2048, 8192}, {1, 77}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    Tensor host = RandomTensor({rows, cols}, DType::kBF16, Device::Cpu(), rng);
    Tensor want = Empty({cols, rows}, DType::kBF16, Device::Cpu());
    ASSERT_TRUE(TransposeMatrix(host, want, Stream::Cpu()).ok());
    Tensor src = Empty({rows, cols}, DType::kBF16, gpu), dst = Empty({cols, rows}, DType::kBF16, gpu);
    ASSERT_TRUE(CopyTensor(host, src, stream).ok());
    Poison(dst);
    absl::Status s = TransposeMatrix(src, dst, stream);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(stream.Synchronize().ok());
    const Vec got = ToHost(dst), ref = ToHost(want);
    int64_t differ = 0;
    for (size_t e = 0; e < ref.size(); ++e) differ += !(got[e] == ref[e]);
    EXPECT_EQ(differ, 0);
  }
}

// The fused backward on fresh random inputs: bit for bit WgmmaGemm(dy, w2t) into dh followed by
// SwiGluBackward (also when dgate and dup overwrite gate and up), and within bf16 rounding of a
// double-precision dh = dy W2 and SwiGLU derivative. Shapes: one tile, tiles along M and N with
// many k-blocks, leading dims, and many tiles per persistent block.
TEST(WgmmaGemmSwiGluBackwardTest, MatchesUnfusedBitwiseAndDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(unsetenv("SG_SWIGLU_KERNEL"), 0);
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  auto& rng = Rng();
  struct BwdCase {
    Shape dy_shape;  // [..., K]
    int64_t f;
  };
  for (const BwdCase& c : {BwdCase{{128, 64}, 256}, BwdCase{{256, 2048}, 512}, BwdCase{{2, 192, 320}, 768},
                           BwdCase{{2048, 128}, 2048}}) {
    const int64_t k = c.dy_shape.back(), m = c.dy_shape.size() == 3 ? c.dy_shape[0] * c.dy_shape[1] : c.dy_shape[0];
    const int64_t f = c.f;
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(f) + "x" + std::to_string(k));
    Tensor dy = RandomTensor(c.dy_shape, DType::kBF16, gpu, rng);
    Tensor w2 = RandomTensor({k, f}, DType::kBF16, gpu, rng, float(1.0 / std::sqrt(double(k))));
    Tensor gate = RandomTensor({m, f}, DType::kBF16, gpu, rng, 3.0f);
    Tensor up = RandomTensor({m, f}, DType::kBF16, gpu, rng);
    Tensor w2t = Empty({f, k}, DType::kBF16, gpu), dh = Empty({m, f}, DType::kBF16, gpu);
    Tensor dg_ref = Empty({m, f}, DType::kBF16, gpu), du_ref = Empty({m, f}, DType::kBF16, gpu);
    Tensor dg = Empty({m, f}, DType::kBF16, gpu), du = Empty({m, f}, DType::kBF16, gpu);
    Tensor dg_in_place = Empty({m, f}, DType::kBF16, gpu), du_in_place = Empty({m, f}, DType::kBF16, gpu);
    for (const Tensor* o : {&w2t, &dh, &dg_ref, &du_ref, &dg, &du}) Poison(*o);
    ASSERT_TRUE(TransposeMatrix(w2, w2t, stream).ok());
    const TensorView dy2 = dy.view().Reshape({m, k}).value();
    ASSERT_TRUE(WgmmaGemm(dy2, w2t, std::nullopt, dh, stream, WgmmaGemmVariant::kTmaStore).ok());
    ASSERT_TRUE(SwiGluBackward(dh, gate, up, dg_ref, du_ref, stream).ok());
    absl::Status s = WgmmaGemmSwiGluBackward(dy, w2t, gate, up, dg, du, stream);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(CopyTensor(gate, dg_in_place, stream).ok());
    ASSERT_TRUE(CopyTensor(up, du_in_place, stream).ok());
    s = WgmmaGemmSwiGluBackward(dy, w2t, dg_in_place, du_in_place, dg_in_place, du_in_place, stream);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(stream.Synchronize().ok());
    auto count_differ = [](const Vec& a, const Vec& b) {
      int64_t n = 0;
      for (size_t e = 0; e < b.size(); ++e) n += !(a[e] == b[e]);  // NaN (unwritten) differs too
      return n;
    };
    const Vec want_dg = ToHost(dg_ref), want_du = ToHost(du_ref), got_dg = ToHost(dg), got_du = ToHost(du);
    EXPECT_EQ(count_differ(got_dg, want_dg), 0) << "dgate differs from WgmmaGemm + SwiGluBackward";
    EXPECT_EQ(count_differ(got_du, want_du), 0) << "dup differs from WgmmaGemm + SwiGluBackward";
    EXPECT_EQ(count_differ(ToHost(dg_in_place), want_dg), 0) << "dgate written over gate differs";
    EXPECT_EQ(count_differ(ToHost(du_in_place), want_du), 0) << "dup written over up differs";

    // The double reference: dh = dy W2, then the exact derivative.
    const Vec dyv = ToHost(dy), w2v = ToHost(w2), gv = ToHost(gate), uv = ToHost(up);
    Vec ref_dg(size_t(m * f)), ref_du(size_t(m * f));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < f; ++j) {
        double d = 0;
        for (int64_t q = 0; q < k; ++q) d += dyv[size_t(i * k + q)] * w2v[size_t(q * f + j)];
        const double g = gv[size_t(i * f + j)], u = uv[size_t(i * f + j)], sg = 1.0 / (1.0 + std::exp(-g));
        ref_dg[size_t(i * f + j)] = d * u * sg * (1.0 + g * (1.0 - sg));
        ref_du[size_t(i * f + j)] = d * g * sg;
      }
    }
    EXPECT_LT(RelativeError(got_dg, ref_dg), 1e-2);
    EXPECT_LT(RelativeError(got_du, ref_du), 1e-2);
  }
}

}  // namespace
}  // namespace sg::kernels
