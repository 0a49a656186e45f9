// Attention tests. Oracles: a naive materialized-softmax loop in this file (forward), central finite
// differences in f64 (backward), and the CPU reference (f64 accumulation) for the CUDA kernels.
// Thresholds: CPU f32 vs naive 1e-5 relative L2; finite differences 1e-6 relative; CUDA bf16
// outputs 1e-2 and gradients 2e-2 relative L2 against the reference (bf16 rounding of P and dS);
// CUDA f16 3e-3 and 5e-3 (the same roundings with an 11-bit significand, 8x finer than bf16's, so
// about 8x less error; the bound leaves a factor ~3 over bf16's ratio); lse 2e-3 absolute.
#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_fwd_v4.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/attention/attention_tiling.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

using sg::testing::FromHost;
using sg::testing::Poison;
using sg::testing::RelativeError;
using sg::testing::ToHost;
using Vec = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Problem {
  int64_t batch, seq_q, seq_k, heads, kv_heads, dim;
  bool causal;
  int64_t q_offset = 0, k_offset = 0;

  Shape QShape() const { return {batch, seq_q, heads, dim}; }
  Shape KShape() const { return {batch, seq_k, kv_heads, dim}; }
  Shape StatShape() const { return {batch, heads, seq_q}; }
  AttentionOptions Options() const { return {causal, std::nullopt, q_offset, k_offset}; }
  internal::AttentionParams Params() const {
    return {batch, seq_q, seq_k, heads, kv_heads, dim, causal, 1.0 / std::sqrt(double(dim)),
            q_offset, k_offset};
  }
  std::string ToString() const {
    return absl::StrCat("B", batch, " Sq", seq_q, " Sk", seq_k, " H", heads, " KV", kv_heads, " D",
                        dim, causal ? " causal" : "", " q0=", q_offset, " k0=", k_offset);
  }
};

// Values representable in bf16 and in f16 (|x| < 2^-14, below f16's normal range, become 0), so
// CPU (f32) and CUDA (bf16 or f16) runs see identical inputs.
Vec RandomBf16Values(int64_t n, double scale) {
  std::uniform_real_distribution<double> u(-scale, scale);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) {
    x = BFloat16::FromFloat(float(u(sg::testing::Rng()))).ToFloat();
    if (std::abs(x) < 0x1p-14) x = 0;
  }
  return v;
}

struct Inputs {
  Vec q, k, v, dout;
};

Inputs RandomInputs(const Problem& p) {
  return {RandomBf16Values(NumElements(p.QShape()), 2.0), RandomBf16Values(NumElements(p.KShape()), 1.0),
          RandomBf16Values(NumElements(p.KShape()), 1.0),
          RandomBf16Values(NumElements(p.QShape()), 1.0)};
}

struct Result {
  Vec out, lse, dq, dk, dv;
};

Tensor Output(const Shape& s, DType t, Device d) {
  Tensor x = Tensor::Empty(s, t, d).value();
  Poison(x);
  return x;
}

// Forward and backward through the public API on `device` with `dtype` data.
Result RunAttention(const Problem& p, const Inputs& in, DType dtype, Device device) {
  Stream stream = Stream::Create(device).value();
  Tensor q = FromHost(in.q, p.QShape(), dtype, device), k = FromHost(in.k, p.KShape(), dtype, device);
  Tensor v = FromHost(in.v, p.KShape(), dtype, device);
  Tensor dout = FromHost(in.dout, p.QShape(), dtype, device);
  Tensor out = Output(p.QShape(), dtype, device), lse = Output(p.StatShape(), DType::kF32, device);
  Tensor dq = Output(p.QShape(), dtype, device), dk = Output(p.KShape(), dtype, device);
  Tensor dv = Output(p.KShape(), dtype, device);
  absl::Status st = AttentionForward(q, k, v, p.Options(), out, lse, stream);
  EXPECT_TRUE(st.ok()) << st;
  st = AttentionBackward(q, k, v, out, dout, lse, p.Options(), dq, dk, dv, stream);
  EXPECT_TRUE(st.ok()) << st;
  st = stream.Synchronize();
  EXPECT_TRUE(st.ok()) << st;
  return {ToHost(out), ToHost(lse), ToHost(dq), ToHost(dk), ToHost(dv)};
}

// The naive oracle: the full score matrix of each (batch, head), softmax, then P v.
void NaiveForward(const Problem& p, const Inputs& in, Vec& out, Vec& lse) {
  out.assign(size_t(NumElements(p.QShape())), 0.0);
  lse.assign(size_t(NumElements(p.StatShape())), 0.0);
  const double scale = 1.0 / std::sqrt(double(p.dim));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t kh = h / (p.heads / p.kv_heads);
      std::vector<Vec> s(size_t(p.seq_q), Vec(size_t(p.seq_k)));
      for (int64_t i = 0; i < p.seq_q; ++i) {
        double m = -kInf;
        for (int64_t j = 0; j < p.seq_k; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < p.dim; ++d) {
            dot += in.q[((b * p.seq_q + i) * p.heads + h) * p.dim + d] *
                   in.k[((b * p.seq_k + j) * p.kv_heads + kh) * p.dim + d];
          }
          const bool masked = p.causal && p.k_offset + j > p.q_offset + i;
          s[i][j] = masked ? -kInf : dot * scale;
          m = std::max(m, s[i][j]);
        }
        double z = 0;
        for (int64_t j = 0; j < p.seq_k; ++j) z += m == -kInf ? 0.0 : std::exp(s[i][j] - m);
        lse[(b * p.heads + h) * p.seq_q + i] = z > 0 ? m + std::log(z) : -kInf;
        for (int64_t j = 0; j < p.seq_k && z > 0; ++j) {
          const double w = std::exp(s[i][j] - m) / z;
          for (int64_t d = 0; d < p.dim; ++d) {
            out[((b * p.seq_q + i) * p.heads + h) * p.dim + d] +=
                w * in.v[((b * p.seq_k + j) * p.kv_heads + kh) * p.dim + d];
          }
        }
      }
    }
  }
}

// Relative L2 error of a gradient, measured against max(||want||, 1e-3 ||dv_want||). dq and dk
// vanish identically when each query sees exactly one key (the softmax of one score has zero
// gradient), e.g. seq_q = seq_k = 1: both sides are then rounding noise (the f32 reference's
// ~1e-8 against the kernel's ~1e-7), whose plain relative error is meaningless. dv = P^T dout
// never vanishes while some query sees a key, so it sets the scale of "zero".
double GradientError(const Vec& got, const Vec& want, const Vec& dv_want) {
  double num = 0, den = 0, dv2 = 0;
  if (got.size() != want.size()) return kInf;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return kInf;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  for (double x : dv_want) dv2 += x * x;
  const double floor = 1e-3 * std::sqrt(dv2);
  return std::sqrt(num) / std::max(std::sqrt(den), floor > 0 ? floor : 1.0);
}

// Max |a - b| over entries where b is finite; both must be -inf together.
double StatError(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return kInf;
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) {
      if (a[i] != b[i]) return kInf;
    } else {
      err = std::max(err, std::isnan(a[i]) ? kInf : std::abs(a[i] - b[i]));
    }
  }
  return err;
}

// --- CPU reference --------------------------------------------------------------------------------

TEST(AttentionCpuTest, ForwardMatchesNaiveLoop) {
  for (const Problem& p : {Problem{2, 17, 17, 4, 4, 16, false}, Problem{1, 13, 29, 8, 2, 8, true},
                           Problem{2, 9, 11, 4, 1, 5, true, 6, 2},
                           Problem{1, 7, 7, 2, 2, 64, true, 0, 3}}) {
    SCOPED_TRACE(p.ToString());
    const Inputs in = RandomInputs(p);
    const Result r = RunAttention(p, in, DType::kF32, Device::Cpu());
    Vec out, lse;
    NaiveForward(p, in, out, lse);
    EXPECT_LT(RelativeError(r.out, out), 1e-6);
    EXPECT_LT(StatError(r.lse, lse), 1e-5);
  }
}

// Loss = sum(out * w) in f64; dL/dx by central differences against the analytic backward.
TEST(AttentionCpuTest, BackwardMatchesFiniteDifferences) {
  for (const Problem& p : {Problem{1, 5, 7, 4, 2, 3, false}, Problem{2, 6, 6, 2, 1, 4, true},
                           Problem{1, 5, 7, 4, 2, 3, true, 3, 0}, Problem{1, 5, 4, 2, 2, 3, true, 0, 2}}) {
    SCOPED_TRACE(p.ToString());
    const internal::AttentionParams prm = p.Params();
    Inputs in = RandomInputs(p);
    const Vec& w = in.dout;
    Vec out(in.q.size()), lse(size_t(NumElements(p.StatShape()))), delta(lse.size());
    auto loss = [&]() {
      internal::AttentionForwardCpu(prm, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
      double l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * w[i];
      return l;
    };
    loss();
    Vec dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    internal::AttentionBackwardDeltaCpu(prm, out.data(), w.data(), delta.data());
    internal::AttentionBlockBackwardCpu(prm, in.q.data(), in.k.data(), in.v.data(), w.data(),
                                        lse.data(), delta.data(), dq.data(), dk.data(), dv.data());
    auto check = [&](Vec& x, const Vec& grad, const char* name) {
      Vec fd(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i], eps = 1e-5;
        x[i] = x0 + eps;
        const double up = loss();
        x[i] = x0 - eps;
        const double down = loss();
        x[i] = x0;
        fd[i] = (up - down) / (2 * eps);
      }
      EXPECT_LT(RelativeError(grad, fd), 1e-6) << name;
    };
    check(in.q, dq, "dq");
    check(in.k, dk, "dk");
    check(in.v, dv, "dv");
  }
}

// With one key per query, dq and dk are zero in exact arithmetic (why the CUDA tests floor the
// gradient error at 1e-3 ||dv||): the f64 reference gets them to within rounding.
TEST(AttentionCpuTest, SingleKeyGradientsVanish) {
  const Problem p{2, 1, 1, 8, 2, 64, true};
  const internal::AttentionParams prm = p.Params();
  const Inputs in = RandomInputs(p);
  Vec out(in.q.size()), lse(size_t(NumElements(p.StatShape()))), delta(lse.size());
  Vec dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  internal::AttentionForwardCpu(prm, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  internal::AttentionBackwardDeltaCpu(prm, out.data(), in.dout.data(), delta.data());
  internal::AttentionBlockBackwardCpu(prm, in.q.data(), in.k.data(), in.v.data(), in.dout.data(),
                                      lse.data(), delta.data(), dq.data(), dk.data(), dv.data());
  const Vec zero(dq.size(), 0.0);
  EXPECT_GT(RelativeError(dv, Vec(dv.size(), 0.0)), 1.0);  // dv is not zero: the floor is real
  EXPECT_LT(GradientError(dq, zero, dv), 1e-9);
  EXPECT_LT(GradientError(dk, Vec(dk.size(), 0.0), dv), 1e-9);
}

TEST(AttentionCpuTest, KernelVariantFromEnvironment) {
  const char* saved = std::getenv("SG_ATTENTION_KERNEL");
  const std::string keep = saved ? saved : "";
  unsetenv("SG_ATTENTION_KERNEL");
  EXPECT_EQ(internal::AttentionKernelFromEnv().value(), internal::AttentionKernel::kV5);
  setenv("SG_ATTENTION_KERNEL", "v2", 1);
  EXPECT_EQ(internal::AttentionKernelFromEnv().value(), internal::AttentionKernel::kV2);
  setenv("SG_ATTENTION_KERNEL", "v3", 1);
  EXPECT_EQ(internal::AttentionKernelFromEnv().value(), internal::AttentionKernel::kV3);
  setenv("SG_ATTENTION_KERNEL", "v4", 1);
  EXPECT_EQ(internal::AttentionKernelFromEnv().value(), internal::AttentionKernel::kV4);
  setenv("SG_ATTENTION_KERNEL", "v5", 1);
  EXPECT_EQ(internal::AttentionKernelFromEnv().value(), internal::AttentionKernel::kV5);
  setenv("SG_ATTENTION_KERNEL", "generic", 1);
  EXPECT_EQ(internal::AttentionKernelFromEnv().value(), internal::AttentionKernel::kGeneric);
  for (const char* gone : {"fast", "v1", "v3a"}) {  // v1 and v3a: deleted families
    setenv("SG_ATTENTION_KERNEL", gone, 1);
    const auto bad = internal::AttentionKernelFromEnv();
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << gone;
    EXPECT_NE(bad.status().message().find(absl::StrCat("found '", gone, "'")), std::string::npos) << bad.status();
  }
  if (saved) {
    setenv("SG_ATTENTION_KERNEL", keep.c_str(), 1);
  } else {
    unsetenv("SG_ATTENTION_KERNEL");
  }
}

TEST(AttentionCpuTest, ForwardV4VariantFromEnvironment) {
  const char* saved = std::getenv("SG_ATTN_FWD_VARIANT");
  const std::string keep = saved ? saved : "";
  unsetenv("SG_ATTN_FWD_VARIANT");
  EXPECT_EQ(internal::FwdV4VariantFromEnv().value(), internal::FwdV4Variant::kWarpSpecialized);
  for (const internal::FwdV4VariantName& v : internal::kFwdV4Variants) {
    setenv("SG_ATTN_FWD_VARIANT", v.name, 1);
    EXPECT_EQ(internal::FwdV4VariantFromEnv().value(), v.variant) << v.name;
  }
  setenv("SG_ATTN_FWD_VARIANT", "wsi", 1);  // deleted: names it as not found, lists the others
  const auto bad = internal::FwdV4VariantFromEnv();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("found 'wsi'"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("wgmma, ws"), std::string::npos) << bad.status();
  if (saved) {
    setenv("SG_ATTN_FWD_VARIANT", keep.c_str(), 1);
  } else {
    unsetenv("SG_ATTN_FWD_VARIANT");
  }
}

TEST(AttentionCpuTest, Bf16MatchesF32) {
  const Problem p{2, 33, 47, 4, 2, 32, true};
  const Inputs in = RandomInputs(p);
  const Result f = RunAttention(p, in, DType::kF32, Device::Cpu());
  const Result h = RunAttention(p, in, DType::kBF16, Device::Cpu());
  EXPECT_LT(RelativeError(h.out, f.out), 1e-2);
  EXPECT_LT(StatError(h.lse, f.lse), 1e-5);
  EXPECT_LT(RelativeError(h.dq, f.dq), 2e-2);
  EXPECT_LT(RelativeError(h.dk, f.dk), 2e-2);
  EXPECT_LT(RelativeError(h.dv, f.dv), 2e-2);
}

// f16 on the CPU: inputs identical to the f32 run's, so only the f16 rounding of out and the
// gradients (relative 2^-11) differs; odd lengths, grouped heads, causal and not.
TEST(AttentionCpuTest, F16MatchesF32) {
  for (const Problem& p : {Problem{2, 33, 47, 4, 2, 32, true}, Problem{1, 19, 13, 4, 4, 64, false}}) {
    SCOPED_TRACE(p.ToString());
    const Inputs in = RandomInputs(p);
    const Result f = RunAttention(p, in, DType::kF32, Device::Cpu());
    const Result h = RunAttention(p, in, DType::kF16, Device::Cpu());
    EXPECT_LT(RelativeError(h.out, f.out), 2e-3);
    EXPECT_LT(StatError(h.lse, f.lse), 1e-5);
    EXPECT_LT(RelativeError(h.dq, f.dq), 3e-3);
    EXPECT_LT(RelativeError(h.dk, f.dk), 3e-3);
    EXPECT_LT(RelativeError(h.dv, f.dv), 3e-3);
  }
}

// --- Block attention + merge ----------------------------------------------------------------------

// Rows [begin, end) of dim 1 of a [batch, seq, rest...] array.
Vec SliceSeq(const Vec& x, int64_t batch, int64_t seq, int64_t begin, int64_t end) {
  const int64_t row = int64_t(x.size()) / (batch * seq);
  Vec y;
  for (int64_t b = 0; b < batch; ++b) {
    y.insert(y.end(), x.begin() + (b * seq + begin) * row, x.begin() + (b * seq + end) * row);
  }
  return y;
}

// Splits K/V at `cuts`, runs block forward + running merge and block backward with the global
// lse/delta, and compares with the unsplit results on the same device.
void CheckBlocksEqualFull(const Problem& p, const std::vector<int64_t>& cuts, DType dtype,
                          Device device, double fwd_tol, double bwd_tol) {
  SCOPED_TRACE(p.ToString());
  Stream stream = Stream::Create(device).value();
  const Inputs in = RandomInputs(p);
  const Result full = RunAttention(p, in, dtype, device);
  Tensor q = FromHost(in.q, p.QShape(), dtype, device);
  Tensor dout = FromHost(in.dout, p.QShape(), dtype, device);
  // The running merge in f32, as ring attention keeps it.
  Tensor out = FromHost(Vec(in.q.size(), 0.0), p.QShape(), DType::kF32, device);
  Tensor lse = FromHost(Vec(size_t(NumElements(p.StatShape())), -kInf), p.StatShape(), DType::kF32, device);
  Tensor global_lse = FromHost(full.lse, p.StatShape(), DType::kF32, device);
  Tensor global_out = FromHost(full.out, p.QShape(), dtype, device);
  Tensor delta = Output(p.StatShape(), DType::kF32, device);
  ASSERT_TRUE(AttentionBackwardDelta(global_out, dout, delta, stream).ok());
  Vec dq_sum(in.q.size(), 0.0), dk_cat, dv_cat;
  std::vector<Vec> dk_parts, dv_parts;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    Problem bp = p;
    bp.seq_k = cuts[c + 1] - cuts[c];
    bp.k_offset = p.k_offset + cuts[c];
    Tensor k = FromHost(SliceSeq(in.k, p.batch, p.seq_k, cuts[c], cuts[c + 1]), bp.KShape(), dtype, device);
    Tensor v = FromHost(SliceSeq(in.v, p.batch, p.seq_k, cuts[c], cuts[c + 1]), bp.KShape(), dtype, device);
    Tensor bout = Output(p.QShape(), dtype, device), blse = Output(p.StatShape(), DType::kF32, device);
    ASSERT_TRUE(AttentionForward(q, k, v, bp.Options(), bout, blse, stream).ok());
    // Host copies run on the legacy stream: order them after the kernels explicitly.
    ASSERT_TRUE(stream.Synchronize().ok());
    Tensor bout32 = FromHost(ToHost(bout), p.QShape(), DType::kF32, device);
    ASSERT_TRUE(AttentionMerge(out, lse, bout32, blse, out, lse, stream).ok());
    Tensor dq = Output(p.QShape(), dtype, device), dk = Output(bp.KShape(), dtype, device);
    Tensor dv = Output(bp.KShape(), dtype, device);
    ASSERT_TRUE(AttentionBlockBackward(q, k, v, dout, global_lse, delta, bp.Options(), dq, dk, dv, stream).ok());
    ASSERT_TRUE(stream.Synchronize().ok());
    const Vec dqh = ToHost(dq);
    for (size_t i = 0; i < dq_sum.size(); ++i) dq_sum[i] += dqh[i];
    dk_parts.push_back(ToHost(dk));
    dv_parts.push_back(ToHost(dv));
  }
  // Concatenate the per-block dk/dv along seq.
  for (int64_t b = 0; b < p.batch; ++b) {
    for (size_t c = 0; c < dk_parts.size(); ++c) {
      const size_t n = dk_parts[c].size() / size_t(p.batch);
      dk_cat.insert(dk_cat.end(), dk_parts[c].begin() + b * n, dk_parts[c].begin() + (b + 1) * n);
      dv_cat.insert(dv_cat.end(), dv_parts[c].begin() + b * n, dv_parts[c].begin() + (b + 1) * n);
    }
  }
  EXPECT_LT(RelativeError(ToHost(out), full.out), fwd_tol);
  EXPECT_LT(StatError(ToHost(lse), full.lse), 1e-4);
  EXPECT_LT(RelativeError(dq_sum, full.dq), bwd_tol);
  EXPECT_LT(RelativeError(dk_cat, full.dk), bwd_tol);
  EXPECT_LT(RelativeError(dv_cat, full.dv), bwd_tol);
}

TEST(AttentionCpuTest, BlocksMergedEqualFullSequence) {
  // Causal with q_offset 0: the later blocks are fully masked for the first rows (lse = -inf).
  CheckBlocksEqualFull({2, 23, 31, 4, 2, 8, true}, {0, 7, 8, 20, 31}, DType::kF32, Device::Cpu(), 1e-6, 1e-5);
  CheckBlocksEqualFull({1, 19, 40, 4, 1, 16, false}, {0, 13, 40}, DType::kF32, Device::Cpu(), 1e-6, 1e-5);
  CheckBlocksEqualFull({1, 16, 48, 2, 2, 8, true, 32, 0}, {0, 16, 32, 48}, DType::kF32, Device::Cpu(), 1e-6, 1e-5);
  // f16 blocks: each block's output and gradients rounded to f16.
  CheckBlocksEqualFull({2, 23, 31, 4, 2, 8, true}, {0, 7, 8, 20, 31}, DType::kF16, Device::Cpu(), 2e-3, 3e-3);
}

// Merge against a direct formula, including rows where one or both sides saw no keys.
void CheckMerge(DType dtype, Device device) {
  const int64_t batch = 2, seq = 5, heads = 3, dim = 7;
  const Shape os = {batch, seq, heads, dim}, ss = {batch, heads, seq};
  const Vec oa = RandomBf16Values(NumElements(os), 1.0), ob = RandomBf16Values(NumElements(os), 1.0);
  Vec la = RandomBf16Values(NumElements(ss), 3.0), lb = RandomBf16Values(NumElements(ss), 3.0);
  la[0] = lb[0] = -kInf;  // both empty
  la[1] = -kInf;          // only b
  lb[2] = -kInf;          // only a
  Stream stream = Stream::Create(device).value();
  Tensor a = FromHost(oa, os, dtype, device), b = FromHost(ob, os, dtype, device);
  Tensor lsa = FromHost(la, ss, DType::kF32, device), lsb = FromHost(lb, ss, DType::kF32, device);
  // In place into a: the running-merge usage.
  ASSERT_TRUE(AttentionMerge(a, lsa, b, lsb, a, lsa, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  const Vec out = ToHost(a), lse = ToHost(lsa);
  Vec want_out(oa.size()), want_lse(la.size());
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t st = (bi * heads + h) * seq + s, row = ((bi * seq + s) * heads + h) * dim;
        const double z = std::exp(la[st]) + std::exp(lb[st]);
        want_lse[st] = std::log(z);
        for (int64_t d = 0; d < dim; ++d) {
          want_out[row + d] = z > 0 ? (std::exp(la[st]) * oa[row + d] + std::exp(lb[st]) * ob[row + d]) / z : 0.0;
        }
      }
    }
  }
  EXPECT_LT(RelativeError(out, want_out), dtype == DType::kF32 ? 1e-6 : 5e-3);
  EXPECT_LT(StatError(lse, want_lse), 1e-5);
  EXPECT_EQ(lse[0], -kInf);
  for (int64_t d = 0; d < dim; ++d) EXPECT_EQ(out[d], 0.0);
}

TEST(AttentionCpuTest, MergeIsExactAndHandlesEmptyRows) {
  CheckMerge(DType::kF32, Device::Cpu());
  CheckMerge(DType::kBF16, Device::Cpu());
  CheckMerge(DType::kF16, Device::Cpu());
}

// --- Argument errors ------------------------------------------------------------------------------

TEST(AttentionCpuTest, BadArgumentsGiveClearErrors) {
  const Problem p{1, 4, 4, 4, 2, 8, false};
  const Device cpu = Device::Cpu();
  Stream s = Stream::Cpu();
  Tensor q = Output(p.QShape(), DType::kF32, cpu), k = Output(p.KShape(), DType::kF32, cpu);
  Tensor v = Output(p.KShape(), DType::kF32, cpu), out = Output(p.QShape(), DType::kF32, cpu);
  Tensor lse = Output(p.StatShape(), DType::kF32, cpu);
  Tensor k3 = Output({1, 4, 3, 8}, DType::kF32, cpu), kd = Output({1, 4, 2, 16}, DType::kF32, cpu);
  Tensor vb = Output(p.KShape(), DType::kBF16, cpu), bad_lse = Output({1, 4, 5}, DType::kF32, cpu);

  absl::Status st = AttentionForward(q, k3, k3, {}, out, lse, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("must divide heads"), std::string::npos) << st;
  st = AttentionForward(q, kd, kd, {}, out, lse, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("attention k: expected"), std::string::npos) << st;
  st = AttentionForward(q, k, vb, {}, out, lse, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("attention v"), std::string::npos) << st;
  st = AttentionForward(q, k, v, {}, out, bad_lse, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("attention lse"), std::string::npos) << st;
  st = AttentionMerge(out, lse, q, bad_lse, out, lse, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lse_b"), std::string::npos) << st;
  EXPECT_TRUE(AttentionForward(q, k, v, {}, out, lse, s).ok());
#ifndef SG_WITH_CUDA
  // CUDA tensors in a build without CUDA: never dereferenced.
  const TensorView gq(q.data<float>(), DType::kBF16, p.QShape(), Device::Cuda(0));
  const TensorView gk(k.data<float>(), DType::kBF16, p.KShape(), Device::Cuda(0));
  const TensorView gout(out.data<float>(), DType::kBF16, p.QShape(), Device::Cuda(0));
  const TensorView glse(lse.data<float>(), DType::kF32, p.StatShape(), Device::Cuda(0));
  st = AttentionForward(gq, gk, gk, {}, gout, glse, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
#endif
}

// --- The CUDA kernels' tile arithmetic, checked on the host ---------------------------------------

// Every visible (query, key) pair lies in a tile the kernels visit, and a tile they process without
// the per-element mask holds only visible pairs. `block_m` x `block_n` tiles over queries x keys.
void CheckTiling(int seq_q, int seq_k, bool causal, int64_t q_minus_k, int block_m, int block_n) {
  SCOPED_TRACE(absl::StrCat("Sq ", seq_q, " Sk ", seq_k, " causal ", causal, " q-k ", q_minus_k,
                            " tile ", block_m, "x", block_n));
  const int m_tiles = (seq_q + block_m - 1) / block_m;
  auto visible = [&](int64_t i, int64_t j) { return !causal || j <= i + q_minus_k; };
  for (int mt = 0; mt < m_tiles; ++mt) {
    const int m0 = mt * block_m, m_end = std::min(m0 + block_m, seq_q);
    const int key_end = internal::VisibleKeyEnd(m_end, seq_k, causal, q_minus_k);
    for (int n0 = 0; n0 < seq_k; n0 += block_n) {
      const bool forward_visits = n0 < key_end;  // forward: key tiles [0, ceil(key_end / block_n))
      const bool backward_visits =               // backward: query tiles [first, m_tiles)
          mt >= internal::FirstQueryTile(n0, block_m, m_tiles, causal, q_minus_k);
      const bool needs_mask = internal::TileNeedsMask(m0, n0, block_n, seq_k, causal, q_minus_k);
      for (int i = m0; i < m_end; ++i) {
        for (int j = n0; j < n0 + block_n; ++j) {
          const bool live = j < seq_k && visible(i, j);
          if (live) {
            ASSERT_TRUE(forward_visits) << "forward skips pair " << i << "," << j;
            ASSERT_TRUE(backward_visits) << "backward skips pair " << i << "," << j;
          }
          if (!needs_mask) {
            ASSERT_TRUE(live) << "unmasked tile holds masked pair " << i << "," << j;
          }
        }
      }
    }
  }
}

TEST(AttentionTilingTest, TileRangesCoverEveryVisiblePairAndMasksTheRest) {
  for (int seq_q : {1, 17, 130, 257}) {
    for (int seq_k : {1, 63, 200}) {
      CheckTiling(seq_q, seq_k, false, 0, internal::kFwdBlockM, internal::kFwdBlockN);
      CheckTiling(seq_q, seq_k, false, 0, internal::kBwdBlockM, internal::kBwdBlockN);
      CheckTiling(seq_q, seq_k, false, 0, internal::BwdV3BlockM(64), internal::kBwdV3BlockN);
      // Step 7 is coprime with the tile sizes: every offset residue modulo a tile occurs.
      for (int64_t q_minus_k = -300; q_minus_k <= 300; q_minus_k += 7) {
        CheckTiling(seq_q, seq_k, true, q_minus_k, internal::kFwdBlockM, internal::kFwdBlockN);
        CheckTiling(seq_q, seq_k, true, q_minus_k, internal::kBwdBlockM, internal::kBwdBlockN);
        CheckTiling(seq_q, seq_k, true, q_minus_k, internal::BwdV3BlockM(64), internal::kBwdV3BlockN);
      }
    }
  }
}

// The v3 backward reduces whole query tiles into a workspace padded to DqAccumRows rows per head:
// every tile of either head dim must fit, and the workspace must also hold v2's dq layout.
TEST(AttentionTilingTest, DqWorkspaceHoldsWholeTiles) {
  for (int64_t seq_q = 1; seq_q <= 1100; ++seq_q) {
    for (int dim : {64, 128}) {
      const int block_m = internal::BwdV3BlockM(dim);
      ASSERT_EQ(internal::kDqAccumRowAlign % block_m, 0) << "D" << dim;
      const int64_t last_m0 = (seq_q - 1) / block_m * block_m;
      ASSERT_LE(last_m0 + block_m, internal::DqAccumRows(seq_q)) << "Sq " << seq_q << " D" << dim;
      internal::AttentionParams p;
      p.batch = 3, p.seq_q = seq_q, p.heads = 5, p.head_dim = dim;
      ASSERT_GE(internal::DqWorkspaceElems(p), p.batch * p.seq_q * p.heads * p.head_dim);
    }
  }
}

// --- CUDA kernels against the CPU reference --------------------------------------------------------

struct CudaCase {
  int64_t dim, seq_q, seq_k, group;
  bool causal;
};

class AttentionCudaTest : public ::testing::TestWithParam<CudaCase> {};

// Relative L2 bounds of the CUDA outputs and gradients for a dtype (the file comment says why).
struct Tolerance {
  double out, grad;
};
constexpr Tolerance kBf16Tolerance{1e-2, 2e-2}, kF16Tolerance{3e-3, 5e-3};

// The CUDA results against the f32 CPU reference (f64 accumulation) on the same inputs.
void ExpectMatchesReference(const Result& got, const Result& want, Tolerance tol = kBf16Tolerance) {
  EXPECT_LT(RelativeError(got.out, want.out), tol.out);
  EXPECT_LT(StatError(got.lse, want.lse), 2e-3);
  EXPECT_LT(GradientError(got.dq, want.dq, want.dv), tol.grad);
  EXPECT_LT(GradientError(got.dk, want.dk, want.dv), tol.grad);
  EXPECT_LT(RelativeError(got.dv, want.dv), tol.grad);
}

// Sets an environment variable (empty value: unsets it) for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* s = std::getenv(name)) saved_ = s;
    Set(value);
  }
  ~ScopedEnv() { Set(saved_ ? saved_->c_str() : ""); }

 private:
  void Set(const char* value) {
    if (*value == '\0') {
      unsetenv(name_);
    } else {
      setenv(name_, value, 1);
    }
  }
  const char* name_;
  std::optional<std::string> saved_;
};

// One CUDA kernel variant: the family (SG_ATTENTION_KERNEL) and, for v4, the forward variant
// (SG_ATTN_FWD_VARIANT), set for the scope of the object.
struct KernelVariant {
  const char* kernel;
  const char* fwd;
};
class ScopedKernelVariant {
 public:
  explicit ScopedKernelVariant(const KernelVariant& v)
      : kernel_("SG_ATTENTION_KERNEL", v.kernel), fwd_("SG_ATTN_FWD_VARIANT", v.fwd) {}

 private:
  ScopedEnv kernel_, fwd_;
};

std::string VariantName(const KernelVariant& v) {
  return *v.fwd == '\0' ? v.kernel : absl::StrCat(v.kernel, "/", v.fwd);
}

// Every variant, or those SG_ATTENTION_TEST_VARIANTS names (comma-separated, e.g. "v3,v4/wgmma"),
// so that a variant that faults (and takes the CUDA context with it) can be run in a process of
// its own.
std::vector<KernelVariant> AllKernelVariants() {
  std::vector<KernelVariant> all = {{"v2", ""}, {"v3", ""}};
  for (const internal::FwdV4VariantName& v : internal::kFwdV4Variants) all.push_back({"v4", v.name});
  all.push_back({"v5", ""});
  const char* only = std::getenv("SG_ATTENTION_TEST_VARIANTS");
  if (only == nullptr || *only == '\0') return all;
  const std::vector<std::string> names = absl::StrSplit(only, ',');
  std::vector<KernelVariant> chosen;
  for (const KernelVariant& v : all) {
    if (std::find(names.begin(), names.end(), VariantName(v)) != names.end()) chosen.push_back(v);
  }
  EXPECT_EQ(chosen.size(), names.size()) << "SG_ATTENTION_TEST_VARIANTS='" << only
                                         << "' names a variant that does not exist";
  return chosen;
}

TEST(AttentionCpuTest, TestVariantFilterPicksNamedVariants) {
  {
    ScopedEnv only("SG_ATTENTION_TEST_VARIANTS", "v3,v4/wgmma");
    const std::vector<KernelVariant> chosen = AllKernelVariants();
    ASSERT_EQ(chosen.size(), 2u);
    EXPECT_EQ(VariantName(chosen[0]), "v3");
    EXPECT_EQ(VariantName(chosen[1]), "v4/wgmma");
  }
  ScopedEnv all("SG_ATTENTION_TEST_VARIANTS", "");
  EXPECT_EQ(AllKernelVariants().size(), 3 + std::size(internal::kFwdV4Variants));
}

TEST_P(AttentionCudaTest, MatchesCpuReference) {
  SG_SKIP_WITHOUT_CUDA();
  const CudaCase c = GetParam();
  const Problem p{2, c.seq_q, c.seq_k, 8, 8 / c.group, c.dim, c.causal};
  SCOPED_TRACE(p.ToString());
  const Inputs in = RandomInputs(p);
  const Result want = RunAttention(p, in, DType::kF32, Device::Cpu());
  for (const KernelVariant& variant : AllKernelVariants()) {
    SCOPED_TRACE(VariantName(variant));
    ScopedKernelVariant use(variant);
    ExpectMatchesReference(RunAttention(p, in, DType::kBF16, Device::Cuda(0)), want);
  }
}

// The kernel families that run f16: the default (v5: the ws forward and the v5 wgmma backward, the
// variables unset; whatever SG_ATTENTION_TEST_VARIANTS says), v4 (v3's backward) with its default
// forward and with each forward variant (each unless SG_ATTENTION_TEST_VARIANTS is set without
// naming it).
std::vector<KernelVariant> F16Variants() {
  std::vector<KernelVariant> variants = {{"", ""}};
  const char* only = std::getenv("SG_ATTENTION_TEST_VARIANTS");
  const std::vector<std::string> names = absl::StrSplit(only ? only : "", ',');
  auto named = [&](const std::string& name) {
    return only == nullptr || *only == '\0' || std::find(names.begin(), names.end(), name) != names.end();
  };
  if (named("v4")) variants.push_back({"v4", ""});
  for (const internal::FwdV4VariantName& v : internal::kFwdV4Variants) {
    if (named(absl::StrCat("v4/", v.name))) variants.push_back({"v4", v.name});
  }
  return variants;
}

TEST_P(AttentionCudaTest, F16MatchesCpuReference) {
  SG_SKIP_WITHOUT_CUDA();
  const CudaCase c = GetParam();
  const Problem p{2, c.seq_q, c.seq_k, 8, 8 / c.group, c.dim, c.causal};
  SCOPED_TRACE(p.ToString());
  const Inputs in = RandomInputs(p);
  const Result want = RunAttention(p, in, DType::kF32, Device::Cpu());
  for (const KernelVariant& variant : F16Variants()) {
    SCOPED_TRACE(VariantName(variant));
    ScopedKernelVariant use(variant);
    ExpectMatchesReference(RunAttention(p, in, DType::kF16, Device::Cuda(0)), want, kF16Tolerance);
  }
}

std::vector<CudaCase> AllCudaCases() {
  std::vector<CudaCase> cases;
  const std::pair<int64_t, int64_t> seqs[] = {{1, 1}, {17, 17}, {131, 131}, {257, 257}, {77, 200}, {200, 77}};
  for (int64_t dim : {64, 128}) {
    for (bool causal : {false, true}) {
      for (auto [sq, sk] : seqs) {
        for (int64_t group : {1, 4, 8}) cases.push_back({dim, sq, sk, group, causal});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaTest, ::testing::ValuesIn(AllCudaCases()),
                         [](const ::testing::TestParamInfo<CudaCase>& info) {
                           const CudaCase& c = info.param;
                           return absl::StrCat("D", c.dim, "_Sq", c.seq_q, "_Sk", c.seq_k, "_G",
                                               c.group, c.causal ? "_causal" : "");
                         });

// A longer sequence with offsets (many tiles, masks that cut through tiles at odd places).
TEST(AttentionCudaOffsetsTest, OffsetsMatchCpuReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Problem& p : {Problem{1, 300, 700, 4, 1, 128, true, 400, 3},
                           Problem{1, 513, 513, 4, 2, 64, true, 0, 5},
                           Problem{1, 100, 200, 2, 2, 64, true, 0, 150}}) {
    SCOPED_TRACE(p.ToString());
    const Inputs in = RandomInputs(p);
    const Result want = RunAttention(p, in, DType::kF32, Device::Cpu());
    for (const KernelVariant& variant : AllKernelVariants()) {
      SCOPED_TRACE(VariantName(variant));
      ScopedKernelVariant use(variant);
      ExpectMatchesReference(RunAttention(p, in, DType::kBF16, Device::Cuda(0)), want);
    }
    for (const KernelVariant& variant : F16Variants()) {  // f16
      SCOPED_TRACE(VariantName(variant));
      ScopedKernelVariant use(variant);
      ExpectMatchesReference(RunAttention(p, in, DType::kF16, Device::Cuda(0)), want, kF16Tolerance);
    }
  }
}

// f16 on the older families is Unimplemented, naming the family.
TEST(AttentionCudaF16Test, OtherKernelsSayTheyAreBf16Only) {
  SG_SKIP_WITHOUT_CUDA();
  const Problem p{1, 64, 64, 2, 2, 64, true};
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  Tensor q = Output(p.QShape(), DType::kF16, gpu), k = Output(p.KShape(), DType::kF16, gpu);
  Tensor out = Output(p.QShape(), DType::kF16, gpu), lse = Output(p.StatShape(), DType::kF32, gpu);
  Tensor dq = Output(p.QShape(), DType::kF16, gpu), dk = Output(p.KShape(), DType::kF16, gpu);
  for (const KernelVariant& v : {KernelVariant{"v2", ""}, KernelVariant{"v3", ""}}) {
    ScopedKernelVariant use(v);
    const absl::Status st = AttentionForward(q, k, k, p.Options(), out, lse, stream);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << VariantName(v) << ": " << st;
    EXPECT_NE(st.message().find(v.kernel), std::string::npos) << st;
  }
  ScopedKernelVariant use({"v2", ""});
  const absl::Status st = AttentionBackward(q, k, k, out, q, lse, p.Options(), dq, dk, dk, stream);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("v2"), std::string::npos) << st;
}

// The generic kernels (attention_generic.cu): every dtype at head dims the flash kernels do not take
// (8 as in a test's tiny model, 24, 96, 256 the widest), grouped queries, seq_q != seq_k, causal
// masks with offsets that leave the first rows without keys (lse -inf, out 0), against the CPU
// reference. f32 runs f32 arithmetic throughout: its bound is 1e-5 (out) and 1e-4 (gradients).
TEST(AttentionCudaGenericTest, OtherHeadDimsAndF32MatchCpuReference) {
  SG_SKIP_WITHOUT_CUDA();
  constexpr Tolerance kF32Tolerance{1e-5, 1e-4};
  for (int64_t dim : {8, 24, 96, 256}) {
    for (const Problem& p : {Problem{2, 37, 37, 4, 2, dim, true}, Problem{1, 45, 70, 6, 1, dim, false},
                             Problem{1, 40, 90, 2, 2, dim, true, 0, 20}, Problem{1, 33, 50, 4, 4, dim, true, 64, 3}}) {
      SCOPED_TRACE(p.ToString());
      const Inputs in = RandomInputs(p);
      const Result want = RunAttention(p, in, DType::kF32, Device::Cpu());
      ExpectMatchesReference(RunAttention(p, in, DType::kF32, Device::Cuda(0)), want, kF32Tolerance);
      ExpectMatchesReference(RunAttention(p, in, DType::kBF16, Device::Cuda(0)), want);
      ExpectMatchesReference(RunAttention(p, in, DType::kF16, Device::Cuda(0)), want, kF16Tolerance);
    }
  }
}

// SG_ATTENTION_KERNEL=generic at the flash kernels' head dims, against the reference; the generic
// backward is deterministic (no atomics): two runs agree bitwise.
TEST(AttentionCudaGenericTest, ForcedAtFlashHeadDimsAndDeterministic) {
  SG_SKIP_WITHOUT_CUDA();
  ScopedEnv generic("SG_ATTENTION_KERNEL", "generic");
  for (const Problem& p : {Problem{1, 131, 131, 8, 2, 64, true}, Problem{2, 77, 200, 4, 4, 128, false}}) {
    SCOPED_TRACE(p.ToString());
    const Inputs in = RandomInputs(p);
    const Result want = RunAttention(p, in, DType::kF32, Device::Cpu());
    const Result a = RunAttention(p, in, DType::kBF16, Device::Cuda(0));
    ExpectMatchesReference(a, want);
    const Result b = RunAttention(p, in, DType::kBF16, Device::Cuda(0));
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    ExpectMatchesReference(RunAttention(p, in, DType::kF16, Device::Cuda(0)), want, kF16Tolerance);
  }
}

// Ring attention's block steps at a head of 32 in f32 and bf16 (merge and block backward with the
// global statistics), and the widest head's bound.
TEST(AttentionCudaGenericTest, BlocksMergedEqualFullAndWidestHead) {
  SG_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::Cuda(0);
  CheckBlocksEqualFull({2, 23, 31, 4, 2, 32, true}, {0, 7, 8, 20, 31}, DType::kF32, gpu, 1e-5, 1e-4);
  CheckBlocksEqualFull({1, 60, 96, 4, 1, 32, true, 36, 0}, {0, 32, 64, 96}, DType::kBF16, gpu, 1e-2, 2e-2);
  const Problem p{1, 4, 4, 1, 1, kAttentionMaxHeadDim + 8, false};
  Stream stream = Stream::Create(gpu).value();
  Tensor q = Output(p.QShape(), DType::kBF16, gpu), out = Output(p.QShape(), DType::kBF16, gpu);
  Tensor lse = Output(p.StatShape(), DType::kF32, gpu);
  const absl::Status st = AttentionForward(q, q, q, p.Options(), out, lse, stream);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("head_dim up to 256"), std::string::npos) << st;
}

TEST(AttentionCudaMergeTest, MergeIsExactAndHandlesEmptyRows) {
  SG_SKIP_WITHOUT_CUDA();
  CheckMerge(DType::kF32, Device::Cuda(0));
  CheckMerge(DType::kBF16, Device::Cuda(0));
  CheckMerge(DType::kF16, Device::Cuda(0));
}

// On CUDA the blocks' outputs are bf16, so "equal" is up to bf16 rounding of each block's output.
TEST(AttentionCudaMergeTest, BlocksMergedEqualFullSequence) {
  SG_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::Cuda(0);
  for (const KernelVariant& variant : AllKernelVariants()) {
    SCOPED_TRACE(VariantName(variant));
    ScopedKernelVariant use(variant);
    CheckBlocksEqualFull({2, 200, 300, 8, 2, 64, true}, {0, 70, 128, 300}, DType::kBF16, gpu, 1e-2, 2e-2);
    CheckBlocksEqualFull({1, 129, 256, 4, 4, 128, false}, {0, 64, 256}, DType::kBF16, gpu, 1e-2, 2e-2);
    CheckBlocksEqualFull({1, 128, 384, 4, 1, 128, true, 256, 0}, {0, 128, 256, 384}, DType::kBF16, gpu, 1e-2, 2e-2);
  }
  for (const KernelVariant& variant : F16Variants()) {  // f16
    SCOPED_TRACE(VariantName(variant));
    ScopedKernelVariant use(variant);
    CheckBlocksEqualFull({2, 200, 300, 8, 2, 64, true}, {0, 70, 128, 300}, DType::kF16, gpu, 3e-3, 5e-3);
    CheckBlocksEqualFull({1, 129, 256, 4, 4, 128, false}, {0, 64, 256}, DType::kF16, gpu, 3e-3, 5e-3);
  }
}

}  // namespace
}  // namespace sg::kernels
