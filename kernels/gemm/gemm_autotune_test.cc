// Autotuned cuBLASLt GEMMs (GemmAlgo::kTuned): the tuned algorithm computes the same product as
// the heuristic's (both against the CPU's Eigen GEMM on the same inputs), each problem is timed
// once and its choice recorded in the process's Tuner, a recorded choice is reused without
// timing, and with a CostMeter and RerankPolicy::variants the configurations added beside the
// heuristic's list are real algorithms that compute the product. GPU only: skipped without one.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/autotune/tuning_table.h"
#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"

namespace sg::kernels {
namespace {

using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

struct Shape3 {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  DType d;
  bool bias;
  float beta;  // 1: accumulate into d in place
};

Tensor ToDevice(const Tensor& host, Device dev, const Stream& s) {
  Tensor t = Tensor::Empty(host.shape(), host.dtype(), dev).value();
  EXPECT_TRUE(CopyTensor(host.view(), t.view(), s).ok());
  return t;
}

// Runs the GEMM with `algo` on the device from the same initial d, returning d on the host.
std::vector<double> RunOn(const Shape3& c, GemmAlgo algo, const Tensor& a, const Tensor& b, const Tensor& bias,
                          const Tensor& d0, const Stream& s) {
  const Device dev = s.device();
  Tensor d = Tensor::Empty(d0.shape(), d0.dtype(), dev).value();
  if (c.beta != 0.0f) {
    EXPECT_TRUE(CopyTensor(d0.view(), d.view(), s).ok());
  } else {
    Poison(d);
  }
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.d = d;
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.beta = c.beta;
  if (c.bias) g.bias = bias.view();
  g.algo = algo;
  absl::Status st = Gemm(g, s);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(s.Synchronize().ok());
  return ToHost(d);
}

// A forward problem d = a b^T (c.trans_b) with fresh bf16 operands on s's device, and Eigen's
// product of them on the CPU.
struct Forward {
  Tensor a, b, d0;
  std::vector<double> want;
};

Forward MakeForward(const Shape3& c, const Stream& s) {
  const Tensor a = RandomTensor({c.m, c.k}, DType::kBF16, Device::Cpu(), Rng());
  const Tensor b = RandomTensor({c.n, c.k}, DType::kBF16, Device::Cpu(), Rng());
  Tensor ref = Tensor::Empty({c.m, c.n}, c.d, Device::Cpu()).value();
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.d = ref;
  g.trans_b = true;
  EXPECT_TRUE(Gemm(g, Stream::Cpu()).ok());
  return Forward{ToDevice(a, s.device(), s), ToDevice(b, s.device(), s),
                 Tensor::Empty({c.m, c.n}, c.d, s.device()).value(), ToHost(ref)};
}

TEST(GemmAutotune, TunedMatchesHeuristicAndEigenAndIsRecordedOnce) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s = Stream::Create(dev).value();
  // The step's three products at a reduced Llama size: forward with bias (bf16 out), dgrad, and
  // wgrad into f32 (overwritten, and accumulated as micro-batches do).
  const std::vector<Shape3> cases = {
      {"forward", 512, 384, 256, false, true, DType::kBF16, true, 0.f},
      {"dgrad", 512, 256, 384, false, false, DType::kBF16, false, 0.f},
      {"wgrad_f32", 384, 256, 512, true, false, DType::kF32, false, 0.f},
      {"wgrad_f32_accumulate", 384, 256, 512, true, false, DType::kF32, false, 1.f},
  };
  autotune::Tuner& tuner = autotune::Tuner::Global();
  for (const Shape3& c : cases) {
    SCOPED_TRACE(c.name);
    const Stream cpu = Stream::Cpu();
    Tensor a = RandomTensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, DType::kBF16, Device::Cpu(), Rng());
    Tensor b = RandomTensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, DType::kBF16, Device::Cpu(), Rng());
    Tensor bias = RandomTensor({c.n}, c.d, Device::Cpu(), Rng());
    Tensor d0 = RandomTensor({c.m, c.n}, c.d, Device::Cpu(), Rng());
    // The reference: Eigen on the same rounded inputs (f32 accumulation).
    Tensor ref = Tensor::Empty({c.m, c.n}, c.d, Device::Cpu()).value();
    ASSERT_TRUE(CopyTensor(d0.view(), ref.view(), cpu).ok());
    GemmArgs g;
    g.a = a;
    g.b = b;
    g.d = ref;
    g.trans_a = c.ta;
    g.trans_b = c.tb;
    g.beta = c.beta;
    if (c.bias) g.bias = bias.view();
    ASSERT_TRUE(Gemm(g, cpu).ok());
    const std::vector<double> want = ToHost(ref);

    Tensor da = ToDevice(a, dev, s), db = ToDevice(b, dev, s), dbias = ToDevice(bias, dev, s),
           dd0 = ToDevice(d0, dev, s);
    const std::vector<double> heuristic = RunOn(c, GemmAlgo::kHeuristic, da, db, dbias, dd0, s);
    const int64_t before = tuner.tunings();
    const std::vector<double> tuned = RunOn(c, GemmAlgo::kTuned, da, db, dbias, dd0, s);
    EXPECT_EQ(tuner.tunings(), before + 1) << "each new problem is timed once";
    const std::vector<double> again = RunOn(c, GemmAlgo::kTuned, da, db, dbias, dd0, s);
    EXPECT_EQ(tuner.tunings(), before + 1) << "a tuned problem is not timed again";

    const double tol = c.d == DType::kBF16 ? 1e-2 : 1e-5;
    EXPECT_LT(RelativeError(heuristic, want), tol);
    EXPECT_LT(RelativeError(tuned, want), tol);
    EXPECT_LT(RelativeError(again, want), tol);
  }
}

// A second process start, in one process: tune, keep the table's text, forget every choice (the
// Tuner's and the GEMM's per-problem cache), install the text: the GEMM runs the recorded algorithm
// without timing anything, and still computes the product.
TEST(GemmAutotune, InstalledChoiceIsReusedWithoutTiming) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s = Stream::Create(dev).value();
  autotune::Tuner& tuner = autotune::Tuner::Global();
  const Shape3 c{"forward", 256 + 64 * int64_t(Rng()() % 4), 320, 192, false, true, DType::kBF16, false, 0.f};
  const Forward f = MakeForward(c, s);
  const Tensor &da = f.a, &db = f.b, &d0 = f.d0;
  const Tensor none;
  const std::vector<double>& want = f.want;

  const std::vector<double> first = RunOn(c, GemmAlgo::kTuned, da, db, none, d0, s);
  const std::string text = tuner.Snapshot().Serialize();
  tuner.Clear();
  ResetGemmAlgorithmCache();
  absl::StatusOr<autotune::TuningTable> table = autotune::TuningTable::Parse(text);
  ASSERT_TRUE(table.ok()) << table.status();
  tuner.Install(*table);
  const std::vector<double> second = RunOn(c, GemmAlgo::kTuned, da, db, none, d0, s);
  EXPECT_EQ(tuner.tunings(), 0) << "the installed choice must be used, not re-timed";
  EXPECT_LT(RelativeError(first, want), 1e-2);
  EXPECT_LT(RelativeError(second, want), 1e-2);

  // The same table on another device model is not used: that GPU would tune again.
  autotune::TuningTable elsewhere;
  for (const auto& [k, choice] : table->entries()) {
    autotune::TuningKey moved = k;
    moved.device = "Some Other GPU";
    elsewhere.Put(moved, choice);
  }
  tuner.Clear();
  ResetGemmAlgorithmCache();
  tuner.Install(elsewhere);
  const std::vector<double> third = RunOn(c, GemmAlgo::kTuned, da, db, none, d0, s);
  EXPECT_EQ(tuner.tunings(), 1) << "a choice from another device model must not be used";
  EXPECT_LT(RelativeError(third, want), 1e-2);
}

// A meter that prefers whichever candidate it sees last (the slowest it is offered), so the
// choice is far from the heuristic's first: the configurations AlgoVariants adds must be real
// algorithms for the problem.
class LastWinsMeter : public autotune::CostMeter {
 public:
  std::string unit() const override { return "order"; }
  absl::StatusOr<double> CostPerCall(const std::function<absl::StatusOr<double>(int64_t)>& run, double) override {
    absl::StatusOr<double> ms = run(2);
    if (!ms.ok()) return ms.status();
    ++seen_;
    return -double(seen_);
  }

 private:
  int seen_ = 0;
};

TEST(GemmAutotune, MeteredVariantsAddCheckedConfigurationsThatComputeTheProduct) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s = Stream::Create(dev).value();
  autotune::Tuner& tuner = autotune::Tuner::Global();
  const Shape3 c{"forward", 1024, 1024 + 128 * int64_t(Rng()() % 4), 1024, false, true, DType::kBF16, false, 0.f};
  const Forward f = MakeForward(c, s);
  const Tensor &da = f.a, &db = f.b, &d0 = f.d0;
  const Tensor none;
  const std::vector<double>& want = f.want;

  // Tunes the problem afresh with `variants` and returns the recorded choice.
  auto tune = [&](int variants, std::vector<double>* got) -> autotune::Choice {
    tuner.Clear();
    ResetGemmAlgorithmCache();
    autotune::RerankPolicy policy;
    policy.min_us = 0;
    policy.within = 1e9;
    policy.max_candidates = 1000;
    policy.variants = variants;
    tuner.set_meter(std::make_shared<LastWinsMeter>(), policy);
    *got = RunOn(c, GemmAlgo::kTuned, da, db, none, d0, s);
    tuner.set_meter(nullptr);
    const autotune::TuningTable table = tuner.Snapshot();
    EXPECT_EQ(table.size(), 1u);
    return table.entries().empty() ? autotune::Choice() : table.entries().begin()->second;
  };
  std::vector<double> listed_out, varied_out;
  const autotune::Choice listed = tune(0, &listed_out);
  const autotune::Choice varied = tune(48, &varied_out);
  tuner.Clear();
  ResetGemmAlgorithmCache();
  EXPECT_GT(varied.candidates, listed.candidates) << "the variants must add configurations the heuristic left out";
  EXPECT_LE(varied.candidates, listed.candidates + 48);
  EXPECT_EQ(varied.cost_unit, "order");
  EXPECT_LT(RelativeError(listed_out, want), 1e-2);
  EXPECT_LT(RelativeError(varied_out, want), 1e-2) << DescribeCublasLtChoice(varied.variant);
  EXPECT_NE(DescribeCublasLtChoice(varied.variant).find("cluster"), std::string::npos);
  EXPECT_EQ(DescribeCublasLtChoice("not an algorithm"), "");
}

}  // namespace
}  // namespace sg::kernels
