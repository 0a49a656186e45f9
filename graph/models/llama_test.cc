// The Llama definition: parameter names and shapes, the 1B graph verifies, and a few AdamW steps of
// the captured train step, run by the interpreter, lower the loss on a fixed batch.
#include "graph/models/llama.h"

#include <cmath>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "graph/interpreter.h"
#include "graph/ops.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::graph {
namespace {

TEST(LlamaTest, ParameterNamesAndShapes) {
  LlamaConfig c = LlamaConfig::Tiny();
  Llama model(c);
  auto params = model.NamedParameters();
  ASSERT_EQ(params.size(), 1 + 9 * c.n_layers + 2);
  EXPECT_EQ(params[0].first, "tok_embeddings.weight");
  EXPECT_EQ(params[1].first, "layers.0.attention_norm.weight");
  EXPECT_EQ(params[3].first, "layers.0.attention.wk.weight");
  EXPECT_EQ(SymShapeToString(params[3].second->shape), "[8,16]");  // [kv_heads*head_dim, dim]
  EXPECT_EQ(params.back().first, "output.weight");
  LlamaConfig bad = c;
  bad.n_kv_heads = 3;
  EXPECT_THAT(std::string(BuildLlamaForward(bad).status().message()),
              ::testing::HasSubstr("n_heads=4 is not a multiple of n_kv_heads=3"));
}

TEST(LlamaTest, OneBillionTrainStepVerifies) {
  auto g = BuildLlamaTrainStep(LlamaConfig::Llama1B(), {});
  ASSERT_TRUE(g.ok()) << g.status();
  int adamw = 0;
  for (const Node& n : g->nodes()) adamw += n.op == OpKind::kAdamW;
  EXPECT_EQ(adamw, 1 + 9 * 16 + 2);
  EXPECT_GE(g->FindOutput("update:layers.15.feed_forward.w2.weight"), 0);
  EXPECT_GE(g->FindOutput("grad_norm"), 0);
}

TEST(LlamaTest, InterpretedAdamWStepsLowerTheLoss) {
  LlamaConfig c = LlamaConfig::Tiny();
  Graph step = BuildLlamaTrainStep(c, {}).value();
  auto& rng = testing::Rng();
  Feeds feeds;
  for (const Node& n : step.nodes()) {
    if (n.op != OpKind::kInput && n.op != OpKind::kParameter) continue;
    const std::string& name = AttrString(n, "name");
    const Type& t = step.type(n.outputs[0]);
    Shape s = Evaluate(t.shape, {{"batch", 2}, {"seq", 6}}).value();
    HostTensor h = HostTensor::Random(s, t.dtype, rng, 0.1, c.vocab);
    if (absl::StartsWith(name, "opt.")) h = HostTensor::Zeros(s, t.dtype);
    if (absl::StrContains(name, "norm")) std::fill(h.data.begin(), h.data.end(), 1.0);
    feeds[name] = h;
  }
  feeds["lr"].data = {3e-2};
  std::vector<double> losses;
  for (int i = 1; i <= 5; ++i) {
    feeds["step"].data = {double(i)};
    Feeds out = Interpret(step, feeds).value();
    losses.push_back(out["loss"].data[0]);
    EXPECT_GT(out["grad_norm"].data[0], 0);
    for (const auto& [name, v] : out) {
      if (absl::StartsWith(name, "update:")) feeds[name.substr(7)] = v;
    }
  }
  EXPECT_NEAR(losses[0], std::log(double(c.vocab)), 0.5);  // small init: near-uniform predictions
  EXPECT_LT(losses.back(), losses[0] - 0.1) << "loss did not decrease";
}

}  // namespace
}  // namespace sg::graph
