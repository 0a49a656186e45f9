// Fused cross-entropy against a double loop (log-sum-exp loss, softmax - onehot gradient), central
// finite differences of the mean loss, CUDA against the reference (both row-kernel paths: rows held
// in registers and the chunked online path), ignore_index, in place, and bad targets.
// Fresh random inputs; outputs poisoned before each run.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

struct Ref {
  double loss = 0;
  int valid = 0;
  std::vector<double> dlogits;
};

Ref DoubleReference(const std::vector<double>& x, const std::vector<double>& t, int64_t rows, int64_t vocab,
                    int64_t ignore, double grad_scale) {
  Ref r;
  r.dlogits.assign(x.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i) r.valid += int64_t(t[size_t(i)]) != ignore;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t ti = int64_t(t[size_t(i)]);
    if (ti == ignore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, x[size_t(i * vocab + j)]);
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(x[size_t(i * vocab + j)] - m);
    const double lse = m + std::log(s);
    r.loss += (lse - x[size_t(i * vocab + ti)]) / r.valid;
    for (int64_t j = 0; j < vocab; ++j) {
      r.dlogits[size_t(i * vocab + j)] =
          grad_scale / r.valid * (std::exp(x[size_t(i * vocab + j)] - lse) - (j == ti ? 1.0 : 0.0));
    }
  }
  return r;
}

struct Case {
  int64_t rows, vocab;
  DType dtype, targets;
  bool in_place;
};

std::string Name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.vocab) + " " + std::string(DTypeName(c.dtype)) +
         (c.in_place ? " in place" : "");
}

// dlogits: f32 ~1e-6; bf16 (f16) one rounding per element (~3e-3 (~4e-4) in L2). Loss: f32 sums of exp (1e-5
// relative), computed from the same rounded logits for both dtypes.
double GradTolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

void Check(const Case& c, Device device) {
  SCOPED_TRACE(Name(c) + " on " + device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  const int64_t ignore = -100;
  Tensor logits = RandomTensor({c.rows, c.vocab}, c.dtype, device, Rng(), 8.0f);
  std::vector<double> tv;
  for (int64_t i = 0; i < c.rows; ++i) tv.push_back(Rng()() % 4 == 0 ? double(ignore) : double(Rng()() % uint64_t(c.vocab)));
  if (c.rows > 1) tv[0] = double(c.vocab - 1);  // the last logit as a target
  Tensor targets = FromHost(tv, {c.rows}, c.targets, device);
  Tensor loss = Tensor::Empty({}, DType::kF32, device).value();
  Tensor valid = Tensor::Empty({1}, DType::kI32, device).value();
  Tensor dlogits = c.in_place ? logits : Tensor::Empty(logits.shape(), c.dtype, device).value();
  const std::vector<double> hx = ToHost(logits);
  Poison(loss);
  Poison(valid);
  if (!c.in_place) Poison(dlogits);
  CrossEntropyOptions opt;
  opt.grad_scale = 0.5f;
  Tensor device_scale = FromHost({2.0}, {}, DType::kF32, device);
  if (c.dtype == DType::kF16) {  // half of the scale from device memory (a dynamic loss scale)
    opt.grad_scale = 0.25f;
    opt.grad_scale_from = device_scale.data<float>();
  }
  ASSERT_TRUE(CrossEntropyForwardBackward(logits, targets, loss, valid, dlogits, opt, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const Ref ref = DoubleReference(hx, tv, c.rows, c.vocab, ignore, 0.5);
  EXPECT_EQ(ToHost(valid)[0], ref.valid);
  EXPECT_NEAR(ToHost(loss)[0], ref.loss, 1e-5 * std::abs(ref.loss) + 1e-6);
  EXPECT_LT(RelativeError(ToHost(dlogits), ref.dlogits), GradTolerance(c.dtype));

  // A scale read from the device when the kernel runs: 0.25 x 2 = the same 0.5.
  if (!c.in_place) {
    Tensor factor = FromHost({2.0}, {1}, DType::kF32, device);
    CrossEntropyOptions from = opt;
    from.grad_scale = 0.25f;
    from.grad_scale_from = factor.view().data<float>();
    Poison(dlogits);
    ASSERT_TRUE(CrossEntropyForwardBackward(logits, targets, loss, valid, dlogits, from, s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_LT(RelativeError(ToHost(dlogits), ref.dlogits), GradTolerance(c.dtype)) << "grad_scale_from";
  }

  // Loss only: same loss, logits untouched when not in place.
  if (!c.in_place) {
    Poison(loss);
    ASSERT_TRUE(CrossEntropyForward(logits, targets, loss, valid, opt, s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_NEAR(ToHost(loss)[0], ref.loss, 1e-5 * std::abs(ref.loss) + 1e-6);
    EXPECT_EQ(ToHost(logits), hx);
  }
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 1, DType::kF32, DType::kI32, false},     {3, 5, DType::kF32, DType::kI64, false},
      {17, 1000, DType::kF32, DType::kI32, false}, {9, 333, DType::kBF16, DType::kI64, false},
      {33, 1024, DType::kBF16, DType::kI32, true}, {5, 4099, DType::kBF16, DType::kI32, false},
      {4, 32000, DType::kBF16, DType::kI32, false}, {3, 20000, DType::kF32, DType::kI64, true},
      {2, 40000, DType::kBF16, DType::kI64, false}, {9, 1000, DType::kF16, DType::kI32, false},
      {5, 4099, DType::kF16, DType::kI64, true},    {3, 32000, DType::kF16, DType::kI32, false},
  };
  return cases;
}

TEST(CrossEntropyCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) Check(c, Device::Cpu());
}

TEST(CrossEntropyCpuTest, AllIgnoredGivesZero) {
  Tensor logits = RandomTensor({3, 7}, DType::kF32, Device::Cpu(), Rng());
  Tensor targets = FromHost({-1, -1, -1}, {3}, DType::kI32, Device::Cpu());
  Tensor loss = Tensor::Empty({1}, DType::kF32, Device::Cpu()).value();
  Tensor valid = Tensor::Empty({1}, DType::kI32, Device::Cpu()).value();
  Tensor d = Tensor::Empty({3, 7}, DType::kF32, Device::Cpu()).value();
  Poison(loss);
  Poison(d);
  CrossEntropyOptions opt;
  opt.ignore_index = -1;
  ASSERT_TRUE(CrossEntropyForwardBackward(logits, targets, loss, valid, d, opt, Stream::Cpu()).ok());
  EXPECT_EQ(ToHost(loss)[0], 0.0);
  EXPECT_EQ(ToHost(valid)[0], 0.0);
  EXPECT_EQ(ToHost(d), std::vector<double>(21, 0.0));
}

// d(mean loss)/dx by central differences in f64 against the f32 kernel's dlogits.
TEST(CrossEntropyCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, vocab = 6;
  std::uniform_real_distribution<double> u(-3, 3);
  std::vector<double> x(rows * vocab);
  for (double& e : x) e = u(Rng());
  const std::vector<double> t = {2, -100, 5, 0};
  Tensor tx = FromHost(x, {rows, vocab}, DType::kF32, Device::Cpu());
  Tensor tt = FromHost(t, {rows}, DType::kI64, Device::Cpu());
  Tensor loss = Tensor::Empty({}, DType::kF32, Device::Cpu()).value();
  Tensor valid = Tensor::Empty({}, DType::kI32, Device::Cpu()).value();
  Tensor d = Tensor::Empty({rows, vocab}, DType::kF32, Device::Cpu()).value();
  Poison(d);
  ASSERT_TRUE(CrossEntropyForwardBackward(tx, tt, loss, valid, d, {}, Stream::Cpu()).ok());
  const std::vector<double> hd = ToHost(d);
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (DoubleReference(xp, t, rows, vocab, -100, 1).loss - DoubleReference(xm, t, rows, vocab, -100, 1).loss) / (2 * h);
    EXPECT_NEAR(hd[i], fd, 1e-6) << i;
  }
}

TEST(CrossEntropyCpuTest, BadArgumentsAreNamed) {
  Tensor logits = Tensor::Empty({2, 5}, DType::kBF16, Device::Cpu()).value();
  Tensor loss = Tensor::Empty({}, DType::kF32, Device::Cpu()).value();
  Tensor valid = Tensor::Empty({}, DType::kI32, Device::Cpu()).value();
  absl::Status st = CrossEntropyForward(logits, FromHost({1, 5}, {2}, DType::kI32, Device::Cpu()), loss, valid, {},
                                        Stream::Cpu());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("targets[1] = 5 is neither ignore_index (-100) nor in the vocabulary [0, 5)"),
            std::string::npos)
      << st;
  st = CrossEntropyForward(logits, FromHost({1, 2, 3}, {3}, DType::kI32, Device::Cpu()), loss, valid, {}, Stream::Cpu());
  EXPECT_NE(st.message().find("targets must be contiguous i32 or i64 [2]@cpu, found i32[3]@cpu"), std::string::npos)
      << st;
  st = CrossEntropyForward(logits, FromHost({1, 2}, {2}, DType::kI32, Device::Cpu()), valid, valid, {}, Stream::Cpu());
  EXPECT_NE(st.message().find("loss must be a one-element f32 tensor on cpu, found i32[]@cpu"), std::string::npos) << st;
}

// Both row kernels (cross_entropy.cu): the default (the register kernel where the row fits, the
// chunked kernel for longer or unaligned rows) and SG_CE_KERNEL=chunked (the chunked kernel for
// every row); rows that fill 8 packs a thread exactly (32768), partly, and with 4 (f32 12000), f32
// rows past the register kernel's 16384, Llama-3's vocabulary, and unaligned rows.
TEST(CrossEntropyCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const char* kernel : {"", "chunked"}) {
    SCOPED_TRACE(std::string("SG_CE_KERNEL=") + kernel);
    if (*kernel == 0) {
      unsetenv("SG_CE_KERNEL");
    } else {
      ASSERT_EQ(setenv("SG_CE_KERNEL", kernel, 1), 0);
    }
    for (const Case& c : Cases()) Check(c, Device::Cuda(0));
    Check({64, 128256, DType::kBF16, DType::kI64, true}, Device::Cuda(0));  // Llama-3 vocabulary: chunked path
    Check({7, 32001, DType::kBF16, DType::kI32, false}, Device::Cuda(0));   // unaligned rows: scalar path
    Check({9, 32768, DType::kBF16, DType::kI64, true}, Device::Cuda(0));
    Check({6, 16392, DType::kBF16, DType::kI32, false}, Device::Cuda(0));
    Check({5, 12000, DType::kF32, DType::kI32, true}, Device::Cuda(0));
    Check({1500, 1000, DType::kBF16, DType::kI32, true}, Device::Cuda(0));
    Check({600, 32000, DType::kBF16, DType::kI64, false}, Device::Cuda(0));
  }
  unsetenv("SG_CE_KERNEL");
}

// CUDA cannot report a bad target without a host sync: the loss becomes NaN instead.
TEST(CrossEntropyCudaTest, BadTargetGivesNanLoss) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  Tensor logits = RandomTensor({2, 64}, DType::kBF16, d, Rng());
  Tensor loss = Tensor::Empty({}, DType::kF32, d).value();
  Tensor valid = Tensor::Empty({}, DType::kI32, d).value();
  ASSERT_TRUE(CrossEntropyForward(logits, FromHost({3, 64}, {2}, DType::kI32, d), loss, valid, {}, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_TRUE(std::isnan(ToHost(loss)[0]));
}

// CrossEntropyCount / Rows / Finish over uneven blocks of rows (the chunked LM head's use), the
// dlogits in place over each block's logits: bitwise the loss, valid and dlogits of one call.
void CheckBlocks(Device device, int64_t rows, int64_t vocab, DType dtype) {
  SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(vocab) + " " + std::string(DTypeName(dtype)) + " on " +
               device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  const int64_t ignore = -100;
  Tensor logits = RandomTensor({rows, vocab}, dtype, device, Rng(), 8.0f);
  std::vector<double> tv;
  for (int64_t i = 0; i < rows; ++i) tv.push_back(Rng()() % 5 == 0 ? double(ignore) : double(Rng()() % uint64_t(vocab)));
  Tensor targets = FromHost(tv, {rows}, DType::kI32, device);
  CrossEntropyOptions opt;
  opt.grad_scale = 0.5f;
  Tensor loss = Tensor::Empty({}, DType::kF32, device).value(), valid = Tensor::Empty({1}, DType::kI32, device).value();
  Tensor whole = Tensor::Empty(logits.shape(), dtype, device).value();
  ASSERT_TRUE(CrossEntropyForwardBackward(logits, targets, loss, valid, whole, opt, s).ok());
  Tensor blocks = FromHost(ToHost(logits), logits.shape(), dtype, device);  // overwritten block by block
  Tensor loss_b = Tensor::Empty({}, DType::kF32, device).value(), valid_b = Tensor::Empty({1}, DType::kI32, device).value();
  Tensor row_loss = Tensor::Empty({rows}, DType::kF32, device).value();
  Poison(loss_b);
  Poison(valid_b);
  Poison(row_loss);
  ASSERT_TRUE(CrossEntropyCount(targets, valid_b, opt, s).ok());
  const int64_t step = rows / 3 + 1;  // 3 blocks, the last shorter
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t r1 = std::min(rows, r0 + step);
    TensorView x = blocks.view().Slice0(r0, r1).value();
    ASSERT_TRUE(CrossEntropyRows(x, targets.view().Slice0(r0, r1).value(), valid_b,
                                 row_loss.view().Slice0(r0, r1).value(), x, opt, s)
                    .ok());
  }
  ASSERT_TRUE(CrossEntropyFinish(row_loss, valid_b, loss_b, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(ToHost(valid_b), ToHost(valid));
  EXPECT_EQ(ToHost(loss_b), ToHost(loss));
  EXPECT_EQ(ToHost(blocks), ToHost(whole));
  // And against the double loop, as one call is.
  const Ref ref = DoubleReference(ToHost(logits), tv, rows, vocab, ignore, 0.5);
  EXPECT_NEAR(ToHost(loss_b)[0], ref.loss, 1e-5 * std::abs(ref.loss) + 1e-6);
}

TEST(CrossEntropyCpuTest, RowBlocksEqualOneCall) {
  CheckBlocks(Device::Cpu(), 10, 333, DType::kF32);
  CheckBlocks(Device::Cpu(), 17, 1000, DType::kBF16);
}

TEST(CrossEntropyCudaTest, RowBlocksEqualOneCall) {
  SG_SKIP_WITHOUT_CUDA();
  CheckBlocks(Device::Cuda(0), 10, 333, DType::kF32);
  CheckBlocks(Device::Cuda(0), 130, 32000, DType::kBF16);
  CheckBlocks(Device::Cuda(0), 40, 40000, DType::kBF16);  // the chunked row kernel
}

TEST(CrossEntropyCpuTest, BlockFunctionsNameBadArguments) {
  Tensor logits = RandomTensor({4, 9}, DType::kF32, Device::Cpu(), Rng());
  Tensor targets = FromHost({1, 2, 3, 4}, {4}, DType::kI32, Device::Cpu());
  Tensor valid = Tensor::Empty({1}, DType::kI32, Device::Cpu()).value();
  Tensor row_loss = Tensor::Empty({3}, DType::kF32, Device::Cpu()).value();
  Tensor loss = Tensor::Empty({}, DType::kF32, Device::Cpu()).value();
  const Stream s = Stream::Cpu();
  const absl::Status rows = CrossEntropyRows(logits, targets, valid, row_loss, logits, {}, s);
  EXPECT_EQ(rows.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rows.message().find("row_loss"), std::string::npos) << rows;
  const absl::Status count = CrossEntropyCount(targets, loss, {}, s);
  EXPECT_NE(count.message().find("valid must be a one-element i32"), std::string::npos) << count;
  const absl::Status finish = CrossEntropyFinish(valid, valid, loss, s);
  EXPECT_NE(finish.message().find("row_loss must be contiguous f32"), std::string::npos) << finish;
}

}  // namespace
}  // namespace sg::kernels
