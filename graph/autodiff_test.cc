// Every forward op's VJP rule against central finite differences through the interpreter (f64).
#include "graph/autodiff.h"

#include <cmath>
#include <functional>
#include <set>

#include "gmock/gmock.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/ops.h"
#include "graph/text.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::graph {
namespace {

struct Case {
  std::string name;
  std::vector<OpKind> covers;
  std::function<std::vector<Value>(Builder&)> build;
  bool positive = false;  // float inputs in [0.5, 1.5) (log, div, rsqrt)
  int64_t int_max = 5;    // integer inputs in [0, int_max)
};

// loss = sum_i sum(out_i * r_i) with fixed random r_i, so every output element matters.
Graph WithLoss(Builder& b, const std::vector<Value>& outs) {
  Value loss;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Type t = b.type(outs[i]);
    Value r = b.Input("r" + std::to_string(i), t.dtype, t.shape);
    IntList all;
    for (int d = 0; d < t.rank(); ++d) all.push_back(d);
    Value p = b.Mul(outs[i], r);
    Value s = all.empty() ? p : b.ReduceSum(p, all);
    loss = loss.valid() ? b.Add(loss, s) : s;
  }
  b.Output("loss", loss);
  auto g = b.Finish();
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

Feeds RandomFeeds(const Graph& g, const Case& c, std::mt19937_64& rng) {
  Feeds feeds;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::kInput && n.op != OpKind::kParameter) continue;
    const Type& t = g.type(n.outputs[0]);
    HostTensor h = HostTensor::Random(Evaluate(t.shape, {}).value(), t.dtype, rng, 1.0, c.int_max);
    if (c.positive && IsFloating(t.dtype) && AttrString(n, "name")[0] != 'r') {
      for (double& v : h.data) v = 1.0 + 0.5 * v;
    }
    // Loss weights r* at least 0.5 in magnitude: a scalar output's weight near 0 made its gradient
    // ~0 and tripped the "cannot fail" guard below (softmax_cross_entropy_ignore, seed
    // 13540033879590853608: max |fd| 1.6e-4).
    if (AttrString(n, "name")[0] == 'r' && IsFloating(t.dtype)) {
      for (double& v : h.data) v = (v < 0 ? -1.0 : 1.0) * (0.5 + 0.5 * std::abs(v));
    }
    feeds[AttrString(n, "name")] = h;
  }
  return feeds;
}

std::vector<Case> Cases() {
  using K = OpKind;
  const DType f = DType::kF32;
  return {
      {"embedding", {K::kEmbedding},
       [=](Builder& b) {
         return std::vector<Value>{b.Embedding(b.Parameter("table", f, {5, 3}),
                                               b.Input("ids", DType::kI32, {2, 4}))};
       }},
      {"matmul", {K::kMatmul},
       [=](Builder& b) {
         return std::vector<Value>{b.Matmul(b.Input("a", f, {2, 3, 4}), b.Input("b", f, {4, 5}))};
       }},
      {"matmul_trans_b_bias_residual", {K::kMatmul},
       [=](Builder& b) {
         MatmulOptions o = MatmulOptions::TransB();
         o.bias = b.Input("bias", f, {5});
         o.residual = b.Input("res", f, {2, 3, 5});
         return std::vector<Value>{b.Matmul(b.Input("a", f, {2, 3, 4}), b.Input("b", f, {5, 4}), o)};
       }},
      {"matmul_trans_a", {K::kMatmul},
       [=](Builder& b) {
         MatmulOptions o = MatmulOptions::TransA();
         o.bias = b.Input("bias", f, {5});
         return std::vector<Value>{b.Matmul(b.Input("a", f, {2, 3, 4}), b.Input("b", f, {2, 3, 5}), o)};
       }},
      {"rmsnorm", {K::kRmsNorm},
       [=](Builder& b) {
         return std::vector<Value>{b.RmsNorm(b.Input("x", f, {3, 6}), b.Input("w", f, {6}), 1e-5)};
       }},
      {"add_rmsnorm", {K::kAddRmsNorm},
       [=](Builder& b) {
         auto [y, h] = b.AddRmsNorm(b.Input("x", f, {2, 2, 6}), b.Input("res", f, {2, 2, 6}),
                                    b.Input("w", f, {6}), 1e-5);
         return std::vector<Value>{y, h};
       }},
      {"rope", {K::kRope},
       [=](Builder& b) { return std::vector<Value>{b.Rope(b.Input("x", f, {2, 5, 2, 6}), 10000.0)}; }},
      {"attention_causal_gqa", {K::kAttention},
       [=](Builder& b) {
         return std::vector<Value>{b.Attention(b.Input("q", f, {2, 4, 4, 3}), b.Input("k", f, {2, 4, 2, 3}),
                                               b.Input("v", f, {2, 4, 2, 3}), true)};
       }},
      {"attention_full", {K::kAttention},
       [=](Builder& b) {
         return std::vector<Value>{b.Attention(b.Input("q", f, {1, 3, 2, 4}), b.Input("k", f, {1, 3, 2, 4}),
                                               b.Input("v", f, {1, 3, 2, 4}), false, 0.7)};
       }},
      {"swiglu", {K::kSwiGLU},
       [=](Builder& b) {
         return std::vector<Value>{b.SwiGLU(b.Input("g", f, {3, 4}), b.Input("u", f, {3, 4}))};
       }},
      {"softmax_cross_entropy_ignore", {K::kSoftmaxCrossEntropy},
       [=](Builder& b) {
         return std::vector<Value>{b.SoftmaxCrossEntropy(b.Input("logits", f, {2, 6, 5}),
                                                         b.Input("t", DType::kI64, {2, 6}), 0)};
       }},
      {"log_softmax_nll", {K::kLogSoftmax, K::kNllLoss},
       [=](Builder& b) {
         Value lp = b.LogSoftmax(b.Input("x", f, {6, 5}));
         return std::vector<Value>{lp, b.NllLoss(lp, b.Input("t", DType::kI32, {6}), 1)};
       }},
      {"add_sub_mul_broadcast", {K::kAdd, K::kSub, K::kMul},
       [=](Builder& b) {
         Value x = b.Input("x", f, {2, 3, 4}), y = b.Input("y", f, {4}), z = b.Input("z", f, {3, 4});
         return std::vector<Value>{b.Add(x, y), b.Sub(z, x), b.Mul(y, x), b.Mul(x, x)};
       }},
      {"div_log_rsqrt", {K::kDiv, K::kLog, K::kRsqrt},
       [=](Builder& b) {
         Value x = b.Input("x", f, {2, 4}), y = b.Input("y", f, {4});
         return std::vector<Value>{b.Div(x, y), b.Div(y, x), b.Log(x), b.Rsqrt(y)};
       },
       true},
      {"unary", {K::kNeg, K::kScale, K::kSilu, K::kExp},
       [=](Builder& b) {
         Value x = b.Input("x", f, {3, 4});
         return std::vector<Value>{b.Neg(x), b.Scale(x, -1.7), b.Silu(x), b.Exp(x)};
       }},
      {"layout", {K::kReshape, K::kTranspose, K::kCast},
       [=](Builder& b) {
         Value x = b.Input("x", f, {2, 3, 4});
         return std::vector<Value>{b.Transpose(b.Reshape(x, {6, 4}), {1, 0}),
                                   b.Transpose(x, {2, 0, 1}), b.Cast(x, DType::kF32)};
       }},
      {"reduce_broadcast", {K::kReduceSum, K::kBroadcast},
       [=](Builder& b) {
         Value x = b.Input("x", f, {2, 3, 4});
         return std::vector<Value>{b.ReduceSum(x, {0, 2}),
                                   b.Broadcast(b.Input("y", f, {3}), {2, 3, 4}, {0, 2})};
       }},
  };
}

// Forward ops with no inputs, and ops that are never differentiated (VJPs and optimizer).
const std::set<OpKind> kNoVjpNeeded = {
    OpKind::kParameter, OpKind::kInput, OpKind::kFill, OpKind::kEmbeddingBackward,
    OpKind::kRmsNormBackward, OpKind::kAddRmsNormBackward, OpKind::kRopeBackward,
    OpKind::kAttentionBackward, OpKind::kSwiGLUBackward, OpKind::kSoftmaxCrossEntropyBackward,
    OpKind::kLogSoftmaxBackward, OpKind::kNllLossBackward, OpKind::kSiluBackward,
    OpKind::kGradNorm, OpKind::kAdamW};

TEST(AutodiffTest, EveryOpIsCoveredOrDeclaredNonDifferentiable) {
  std::set<OpKind> covered;
  for (const Case& c : Cases()) covered.insert(c.covers.begin(), c.covers.end());
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpKind op = OpKind(i);
    EXPECT_NE(covered.count(op) > 0, kNoVjpNeeded.count(op) > 0)
        << OpName(op) << ": needs exactly one of a finite-difference case or a no-VJP listing";
    EXPECT_EQ(HasVjp(op), covered.count(op) > 0) << OpName(op);
  }
}

class VjpTest : public ::testing::TestWithParam<Case> {};

TEST_P(VjpTest, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  Builder b;
  Graph g = WithLoss(b, c.build(b));
  auto& rng = testing::Rng();
  Feeds feeds = RandomFeeds(g, c, rng);
  // Differentiate w.r.t. every floating source except the loss weights r*.
  std::vector<int> wrt;
  std::vector<std::string> names;
  for (const Node& n : g.nodes()) {
    if ((n.op == OpKind::kInput || n.op == OpKind::kParameter) &&
        IsFloating(g.type(n.outputs[0]).dtype) && AttrString(n, "name")[0] != 'r') {
      wrt.push_back(n.outputs[0]);
      names.push_back(AttrString(n, "name"));
    }
  }
  auto r = AppendBackward(g, {"loss", wrt});
  ASSERT_TRUE(r.ok()) << r.status();
  for (const Node& n : r->graph.nodes()) {
    if (n.phase == Phase::kBackward) {
      EXPECT_FALSE(Schema(n.op).is_source && n.op != OpKind::kFill) << ToText(r->graph);
    }
  }
  auto grads = Interpret(r->graph, feeds);
  ASSERT_TRUE(grads.ok()) << grads.status() << "\n" << ToText(r->graph);
  auto loss_at = [&](const Feeds& f) { return Interpret(g, f).value().at("loss").data[0]; };
  const double h = 1e-6;
  for (const std::string& name : names) {
    const HostTensor& analytic = grads->at("grad:" + name);
    ASSERT_EQ(analytic.shape, feeds[name].shape) << name;
    double max_abs = 0;
    for (int64_t i = 0; i < analytic.numel(); ++i) {
      Feeds p = feeds, m = feeds;
      p[name].data[i] += h;
      m[name].data[i] -= h;
      const double fd = (loss_at(p) - loss_at(m)) / (2 * h);
      EXPECT_NEAR(analytic.data[i], fd, 1e-6 + 1e-6 * std::abs(fd))
          << c.name << ": d loss / d " << name << "[" << i << "]";
      max_abs = std::max(max_abs, std::abs(fd));
    }
    EXPECT_GT(max_abs, 1e-3) << c.name << ": gradient of " << name << " is ~0; the test cannot fail";
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, VjpTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(AutodiffTest, RejectsBadLossAndNonDifferentiableOps) {
  Builder b;
  Value x = b.Input("x", DType::kF32, {3});
  auto [norm, clip] = b.GradNorm({x}, 1.0);
  b.Output("vec", x);
  b.Output("loss", b.Mul(norm, clip));
  Graph g = b.Finish().value();
  EXPECT_THAT(std::string(AppendBackward(g, {"vec", {}}).status().message()),
              ::testing::HasSubstr("must be a floating scalar, found f32[3]"));
  EXPECT_THAT(std::string(AppendBackward(g, {"nope", {}}).status().message()),
              ::testing::HasSubstr("no graph output named 'nope'"));
  auto st = AppendBackward(g, {"loss", {x.id}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("grad_norm (node 1) has no VJP rule"));
}

TEST(AutodiffTest, UnusedParameterGetsZeroGradientAndSharedValueAccumulates) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {3});
  b.Parameter("unused", DType::kF32, {2});
  b.Output("loss", b.ReduceSum(b.Mul(x, x), {0}));
  auto r = AppendBackward(b.Finish().value(), {});
  ASSERT_TRUE(r.ok()) << r.status();
  auto& rng = testing::Rng();
  Feeds feeds = {{"x", HostTensor::Random({3}, DType::kF32, rng)},
                 {"unused", HostTensor::Random({2}, DType::kF32, rng)}};
  Feeds out = Interpret(r->graph, feeds).value();
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(out["grad:x"].data[i], 2 * feeds["x"].data[i]);
  EXPECT_EQ(out["grad:unused"].data, std::vector<double>(2, 0.0));
}

}  // namespace
}  // namespace sg::graph
