// RoPE against a double-precision loop written from the Hugging Face definition (cos/sin of the
// f32 angle, rotate_half), the backward against finite differences and against orthogonality
// (backward(forward(x)) == x), CUDA against the CPU reference, tables against computed angles.
// Fresh random inputs; outputs poisoned before each run.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/rope/rope.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

struct Case {
  int64_t batch, seq, q_heads, k_heads, head_dim;
  DType dtype;
  int64_t offset;
};

std::string Name(const Case& c) {
  return std::to_string(c.batch) + "x" + std::to_string(c.seq) + " q" + std::to_string(c.q_heads) + " k" +
         std::to_string(c.k_heads) + " d" + std::to_string(c.head_dim) + " " + std::string(DTypeName(c.dtype)) +
         " off" + std::to_string(c.offset);
}

// x: [tokens, heads, d] rotated at position pos(token); the angle is computed as the contract says
// (f32 inv_freq and product, as Hugging Face), everything else in double.
std::vector<double> DoubleRope(const std::vector<double>& x, int64_t tokens, int64_t heads, int64_t d,
                               const std::vector<int64_t>& pos, float theta, double sign) {
  std::vector<double> y(x.size());
  const int64_t half = d / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float inv = 1.f / std::pow(theta, float(2 * i) / float(d));
      const double a = double(float(pos[size_t(t)]) * inv);
      const double c = std::cos(a), s = sign * std::sin(a);
      for (int64_t h = 0; h < heads; ++h) {
        const size_t base = size_t((t * heads + h) * d);
        y[base + i] = x[base + i] * c - x[base + i + half] * s;
        y[base + i + half] = x[base + i + half] * c + x[base + i] * s;
      }
    }
  }
  return y;
}

// f32: products of f32 values (~1e-6); bf16: one bf16 rounding per output (~3e-3 in L2).
double Tolerance(DType t) { return t == DType::kF32 ? 2e-5 : 1e-2; }

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 1, 1, 0, 2, DType::kF32, 0},     {2, 5, 3, 1, 6, DType::kF32, 7},     {1, 9, 4, 2, 16, DType::kF32, 0},
      {3, 17, 5, 3, 64, DType::kF32, 40},  {2, 7, 2, 2, 10, DType::kBF16, 3},   {2, 33, 6, 2, 64, DType::kBF16, 100},
      {1, 19, 8, 8, 128, DType::kBF16, 0}, {1, 5, 3, 0, 32, DType::kBF16, 11},  {2, 33, 6, 2, 64, DType::kF16, 100},
      // More chunks per token than one CTA step of the token-run kernel (130 heads x 8 chunks; 48
      // heads x 65 scalar pairs), and token counts that leave a partial run.
      {1, 3, 100, 30, 128, DType::kBF16, 5}, {2, 3, 40, 8, 130, DType::kF32, 1}, {3, 7, 7, 1, 64, DType::kBF16, 0},
  };
  return cases;
}

// Forward then backward (in place) on `device`, against DoubleRope at positions offset + s.
void Check(const Case& c, Device device) {
  SCOPED_TRACE(Name(c) + " on " + device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  const int64_t tokens = c.batch * c.seq;
  Tensor q = RandomTensor({c.batch, c.seq, c.q_heads, c.head_dim}, c.dtype, device, Rng());
  Tensor qo = Tensor::Empty(q.shape(), c.dtype, device).value();
  Tensor k, ko;
  if (c.k_heads > 0) {
    k = RandomTensor({c.batch, c.seq, c.k_heads, c.head_dim}, c.dtype, device, Rng());
    ko = Tensor::Empty(k.shape(), c.dtype, device).value();
    Poison(ko);
  }
  Poison(qo);
  RopeOptions opt;
  opt.theta = 10000.f;
  opt.position_offset = c.offset;
  ASSERT_TRUE(RopeForward(q, k.view(), qo, ko.view(), opt, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  std::vector<int64_t> pos;
  for (int64_t t = 0; t < tokens; ++t) pos.push_back(c.offset + t % c.seq);
  const std::vector<double> hq = ToHost(q), hqo = ToHost(qo);
  EXPECT_LT(RelativeError(hqo, DoubleRope(hq, tokens, c.q_heads, c.head_dim, pos, opt.theta, 1)),
            Tolerance(c.dtype))
      << "q";
  if (c.k_heads > 0) {
    EXPECT_LT(RelativeError(ToHost(ko), DoubleRope(ToHost(k), tokens, c.k_heads, c.head_dim, pos, opt.theta, 1)),
              Tolerance(c.dtype))
        << "k";
  }
  // Backward in place over the forward's output: the inverse rotation.
  ASSERT_TRUE(RopeBackward(qo, ko.view(), qo, ko.view(), opt, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_LT(RelativeError(ToHost(qo), DoubleRope(hqo, tokens, c.q_heads, c.head_dim, pos, opt.theta, -1)),
            Tolerance(c.dtype))
      << "dq";
  EXPECT_LT(RelativeError(ToHost(qo), hq), 2 * Tolerance(c.dtype)) << "backward(forward(q)) != q";
}

TEST(RopeCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) Check(c, Device::Cpu());
}

// dL/dx for L = sum(RopeForward(x) * g) by central differences must equal RopeBackward(g).
TEST(RopeCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t b = 1, s = 3, h = 2, d = 6;
  const int64_t n = b * s * h * d;
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (double& e : x) e = u(Rng());
  for (double& e : g) e = u(Rng());
  const std::vector<int64_t> pos = {5, 6, 7};
  auto loss = [&](const std::vector<double>& xx) {
    const std::vector<double> y = DoubleRope(xx, b * s, h, d, pos, 500000.f, 1);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * g[i];
    return l;
  };
  RopeOptions opt;
  opt.theta = 500000.f;
  opt.position_offset = 5;
  Tensor tg = FromHost(g, {b, s, h, d}, DType::kF32, Device::Cpu());
  Tensor dx = Tensor::Empty({b, s, h, d}, DType::kF32, Device::Cpu()).value();
  Poison(dx);
  ASSERT_TRUE(RopeBackward(tg, TensorView(), dx, TensorView(), opt, Stream::Cpu()).ok());
  const std::vector<double> hdx = ToHost(dx);
  const double eps = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> xp = x, xm = x;
    xp[size_t(i)] += eps;
    xm[size_t(i)] -= eps;
    EXPECT_NEAR(hdx[size_t(i)], (loss(xp) - loss(xm)) / (2 * eps), 1e-5) << i;  // f32 kernel
  }
}

// Explicit positions ([batch, seq], i64), a precomputed table, and offset positions agree.
void CheckPositionsAndTable(Device device) {
  SCOPED_TRACE(device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  const int64_t b = 2, sq = 11, h = 3, d = 64;
  Tensor q = RandomTensor({b, sq, h, d}, DType::kF32, device, Rng());
  std::vector<double> pos_values;
  std::vector<int64_t> pos;
  for (int64_t i = 0; i < b * sq; ++i) {
    pos.push_back(int64_t(Rng()() % 300));
    pos_values.push_back(double(pos.back()));
  }
  Tensor positions = FromHost(pos_values, {b, sq}, DType::kI64, device);
  Tensor cos = Tensor::Empty({300, d / 2}, DType::kF32, device).value();
  Tensor sin = Tensor::Empty({300, d / 2}, DType::kF32, device).value();
  Poison(cos);
  Poison(sin);
  ASSERT_TRUE(RopeTable(10000.f, cos, sin, s).ok());
  RopeOptions computed;
  computed.positions = positions;
  RopeOptions table = computed;
  table.cos = cos;
  table.sin = sin;
  for (const RopeOptions* opt : {&computed, &table}) {
    Tensor qo = Tensor::Empty(q.shape(), DType::kF32, device).value();
    Poison(qo);
    ASSERT_TRUE(RopeForward(q, TensorView(), qo, TensorView(), *opt, s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_LT(RelativeError(ToHost(qo), DoubleRope(ToHost(q), b * sq, h, d, pos, 10000.f, 1)), 2e-5)
        << (opt == &table ? "table" : "computed");
  }
}

TEST(RopeCpuTest, PositionsAndTable) { CheckPositionsAndTable(Device::Cpu()); }

TEST(RopeCpuTest, BadArgumentsAreNamed) {
  Tensor q = Tensor::Empty({1, 4, 2, 8}, DType::kBF16, Device::Cpu()).value();
  Tensor k = Tensor::Empty({1, 5, 2, 8}, DType::kBF16, Device::Cpu()).value();
  absl::Status st = RopeForward(q, k, q, k, RopeOptions(), Stream::Cpu());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k must be contiguous bf16[1,4,heads,8]@cpu, found bf16[1,5,2,8]@cpu"),
            std::string::npos)
      << st;
  Tensor odd = Tensor::Empty({1, 4, 2, 7}, DType::kBF16, Device::Cpu()).value();
  EXPECT_NE(RopeForward(odd, TensorView(), odd, TensorView(), RopeOptions(), Stream::Cpu()).message().find("even"),
            std::string::npos);
  Tensor pos = FromHost({0, 1, -2, 3}, {4}, DType::kI32, Device::Cpu());
  RopeOptions opt;
  opt.positions = pos;
  st = RopeForward(q, TensorView(), q, TensorView(), opt, Stream::Cpu());
  EXPECT_NE(st.message().find("positions[2] = -2 is outside"), std::string::npos) << st;
  Tensor cos = Tensor::Empty({3, 4}, DType::kF32, Device::Cpu()).value();
  RopeOptions short_table;
  short_table.cos = cos;
  short_table.sin = cos;
  st = RopeForward(q, TensorView(), q, TensorView(), short_table, Stream::Cpu());
  EXPECT_NE(st.message().find("need a table of at least 4 rows, found 3"), std::string::npos) << st;
}

// Both CUDA kernels (rope.cu): the default (the flat kernel where it applies, the token-run kernel
// for the rest) and SG_ROPE_KERNEL=tokens (the token-run kernel for everything). The flat kernel
// takes the cases with head_dim % 16 == 0 (blocks spanning 22 tokens at d16, one token's 1040
// chunks over 9 blocks at q100 k30 d128, q only); the default falls back to the token-run kernel
// for head_dim % 16 != 0 (scalar accesses), for cos/sin over 48 KiB of shared memory (d8192), and
// the token-run kernel itself raises its shared-memory limit for one token of d16384.
TEST(RopeCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const char* kernel : {"", "tokens"}) {
    SCOPED_TRACE(std::string("SG_ROPE_KERNEL=") + kernel);
    if (*kernel == 0) {
      unsetenv("SG_ROPE_KERNEL");
    } else {
      ASSERT_EQ(setenv("SG_ROPE_KERNEL", kernel, 1), 0);
    }
    for (const Case& c : Cases()) Check(c, Device::Cuda(0));
    Check({2, 2048, 32, 8, 64, DType::kBF16, 2048}, Device::Cuda(0));  // Llama-1B, second sequence shard
    Check({1, 3, 1, 1, 8192, DType::kBF16, 2}, Device::Cuda(0));
    Check({1, 2, 1, 0, 16384, DType::kF32, 3}, Device::Cuda(0));
    CheckPositionsAndTable(Device::Cuda(0));
  }
  unsetenv("SG_ROPE_KERNEL");
}

}  // namespace
}  // namespace sg::kernels
