// The forward-only step against the training step's own forward loss (same batch, before the
// update) and the f64 reference interpreter, on a tiny Llama with a "logits" output (CPU).
#include "compiler/eval_step.h"

#include <cmath>

#include "compiler/compile.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/interpreter.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

using graph::Feeds;

constexpr int64_t kBatch = 2, kSeq = 8, kVocab = 32;

// TinyLlama plus an output "logits": the cross-entropy's input.
graph::Graph WithLogits() {
  graph::Graph g = testing::TinyLlama({}).value();
  for (const graph::Node& n : g.nodes()) {
    if (n.op == graph::OpKind::kSoftmaxCrossEntropy) {
      g.AddOutput("logits", n.inputs[0]);
      break;
    }
  }
  EXPECT_EQ(g.outputs().size(), 2u);
  return g;
}

CompileOptions Options() {
  CompileOptions o;
  o.binding = {{"batch", kBatch}, {"seq", kSeq}};
  return o;
}

std::map<std::string, Tensor> OnCpu(const Feeds& f) {
  std::map<std::string, Tensor> t;
  for (const auto& [k, h] : f) t[k] = sg::testing::FromHost(h.data, h.shape, h.dtype, Device::Cpu());
  return t;
}

std::map<std::string, TensorView> Views(const std::map<std::string, Tensor>& t) {
  std::map<std::string, TensorView> v;
  for (const auto& [k, x] : t) v[k] = x.view();
  return v;
}

TEST(EvalStepTest, LossEqualsTheTrainingForwardAndTheInterpreter) {
  const graph::Graph forward = WithLogits();
  const Feeds params = testing::RandomParameters(forward, sg::testing::Rng());
  const Feeds batch = testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng());
  const auto params_cpu = OnCpu(params), batch_cpu = OnCpu(batch);

  auto train = Compile(forward, Options());
  ASSERT_TRUE(train.ok()) << train.status();
  for (const auto& [name, t] : params_cpu) ASSERT_TRUE((*train)->Write(name, t.view()).ok()) << name;
  auto eval = CompileForward(forward, Options());
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ((*eval)->parameter_names().size(), params.size());
  // Poisoned activations: a value the schedule forgets to compute shows up as NaN.
  const DeviceMemory& arena = (*eval)->program().arena;
  if (arena.bytes() > 0) sg::testing::Poison(TensorView(arena.data(), DType::kF32, {arena.bytes() / 4}, Device::Cpu()));
  ASSERT_TRUE((*eval)->CopyParametersFrom(**train).ok());
  ASSERT_TRUE((*eval)->Run(Views(batch_cpu)).ok());
  auto eval_loss = (*eval)->ReadLoss();
  ASSERT_TRUE(eval_loss.ok()) << eval_loss.status();
  Tensor logits = Tensor::Empty({kBatch, kSeq, kVocab}, DType::kF32, Device::Cpu()).value();
  sg::testing::Poison(logits.view());
  ASSERT_TRUE((*eval)->Read("logits", logits.view()).ok());

  std::vector<float> last(kVocab);
  ASSERT_TRUE((*eval)->ReadSlice("logits", (kBatch * kSeq - 1) * kVocab,
                                 TensorView(last.data(), DType::kF32, {kVocab}, Device::Cpu())).ok());
  for (int64_t v = 0; v < kVocab; ++v) EXPECT_EQ(last[v], logits.data<float>()[(kBatch * kSeq - 1) * kVocab + v]);
  EXPECT_FALSE((*eval)->ReadSlice("logits", kBatch * kSeq * kVocab - 1,
                                  TensorView(last.data(), DType::kF32, {kVocab}, Device::Cpu())).ok());

  // The training step's loss is its forward pass on the weights before its update.
  ASSERT_TRUE((*train)->SetLearningRate(1e-2f).ok());
  ASSERT_TRUE((*train)->Run(Views(batch_cpu)).ok());
  auto m = (*train)->ReadMetrics();
  ASSERT_TRUE(m.ok()) << m.status();

  Feeds feeds = params;
  feeds.insert(batch.begin(), batch.end());
  auto ref = graph::Interpret(forward, feeds);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const double want = ref->at("loss").data[0];
  EXPECT_GT(want, 1.0);
  EXPECT_NEAR(*eval_loss, want, 1e-5 * want);
  EXPECT_NEAR(*eval_loss, m->loss, 1e-5 * want);
  EXPECT_LT(sg::testing::RelativeError(sg::testing::ToHost(logits.view()), ref->at("logits").data), 1e-5);

  // After the update the copy is stale until refreshed; refreshed, it follows the new weights.
  ASSERT_TRUE((*eval)->Run(Views(batch_cpu)).ok());
  EXPECT_EQ((*eval)->ReadLoss().value(), *eval_loss);
  ASSERT_TRUE((*eval)->CopyParametersFrom(**train).ok());
  ASSERT_TRUE((*eval)->Run(Views(batch_cpu)).ok());
  EXPECT_NE((*eval)->ReadLoss().value(), *eval_loss);
}

TEST(EvalStepTest, BadInputIsAClearError) {
  const graph::Graph forward = WithLogits();
  auto eval = CompileForward(forward, Options());
  ASSERT_TRUE(eval.ok()) << eval.status();
  Tensor small = Tensor::Empty({1, kSeq}, DType::kI32, Device::Cpu()).value();
  auto st = (*eval)->Run({{"tokens", small.view()}, {"targets", small.view()}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("input 'tokens': expected i32[2,8], found i32[1,8]"), std::string::npos) << st;
  st = (*eval)->Run({{"tokenz", small.view()}});
  EXPECT_NE(st.message().find("no input named 'tokenz'"), std::string::npos) << st;
  CompileOptions o = Options();
  o.loss = "nope";
  EXPECT_EQ(CompileForward(forward, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.strategy = Strategy::kFsdp;
  EXPECT_EQ(CompileForward(forward, o).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace sg::compiler
