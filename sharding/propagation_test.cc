// One or more cases per op of the closed set (the last test checks that every OpKind has one).
// Each case: the op built with the graph builder, the placements its inputs arrive with on a
// 1-D mesh of 4 ranks, and the expected "required inputs -> outputs" (plus internal collectives).
#include "sharding/propagation.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "gtest/gtest.h"

namespace sg::sharding {
namespace {

using graph::Attrs;
using graph::Builder;
using graph::Dim;
using graph::OpKind;
using graph::Value;

// "S(0) R -> P(sum) [sum,max]" for a 1-D mesh.
std::string Show(const OpSharding& s) {
  auto join = [](const std::vector<Placements>& v) {
    return absl::StrJoin(v, " ", [](std::string* o, const Placements& p) {
      o->append(p.size() == 1 ? p[0].ToString() : PlacementsToString(p));
    });
  };
  std::string out = absl::StrCat(join(s.inputs), " -> ", join(s.outputs));
  if (!s.internal.empty()) {
    out += absl::StrCat(" [", absl::StrJoin(s.internal, ",", [](std::string* o,
                                                                 const InternalCollective& c) {
                          o->append(std::string(ReduceOpName(c.op)));
                        }), "]");
  }
  return out;
}

struct Case {
  OpKind op;
  // Builds the op's inputs and returns them (with attrs for Emit).
  std::function<std::vector<Value>(Builder&)> inputs;
  Attrs attrs;
  std::string in;    // arriving placements, space separated, one per input
  std::string want;  // Show() of the result
  ConflictPolicy policy = ConflictPolicy::kGatherWeights;
};

const Dim kB = 8, kS = 16, kD = 32, kH = 4, kHd = 8, kV = 64, kF = 48;

Value F(Builder& b, const char* name, graph::SymShape s) { return b.Input(name, DType::kF32, s); }
Value I(Builder& b, const char* name, graph::SymShape s) { return b.Input(name, DType::kI32, s); }
Value Sc(Builder& b, const char* name) { return F(b, name, {}); }

Attrs Mm(bool ta, bool tb, const char* epi = "none") {
  return {{"trans_a", ta}, {"trans_b", tb}, {"epilogue", std::string(epi)},
          {"prologue", std::string("")}};
}

std::vector<Case> Cases() {
  auto x3 = [](Builder& b) { return std::vector<Value>{F(b, "x", {kB, kS, kD})}; };
  auto x3x3 = [](Builder& b) {
    return std::vector<Value>{F(b, "x", {kB, kS, kD}), F(b, "y", {kB, kS, kD})};
  };
  auto q4 = [](Builder& b) { return std::vector<Value>{F(b, "q", {kB, kS, kH, kHd})}; };
  auto qkv = [](Builder& b) {
    return std::vector<Value>{F(b, "q", {kB, kS, kH, kHd}), F(b, "k", {kB, kS, 4, kHd}),
                              F(b, "v", {kB, kS, 4, kHd})};
  };
  auto qkv_gqa2 = [](Builder& b) {  // 2 kv heads cannot split over 4 ranks
    return std::vector<Value>{F(b, "q", {kB, kS, kH, kHd}), F(b, "k", {kB, kS, 2, kHd}),
                              F(b, "v", {kB, kS, 2, kHd})};
  };
  auto attn_bwd = [](Builder& b) {
    return std::vector<Value>{F(b, "do", {kB, kS, kH, kHd}), F(b, "q", {kB, kS, kH, kHd}),
                              F(b, "k", {kB, kS, kH, kHd}), F(b, "v", {kB, kS, kH, kHd}),
                              F(b, "o", {kB, kS, kH, kHd})};
  };
  auto mm = [](Builder& b) {  // x[B,S,D] x w[F,D]^T
    return std::vector<Value>{F(b, "x", {kB, kS, kD}), F(b, "w", {kF, kD})};
  };
  auto mm_bias = [](Builder& b) {
    return std::vector<Value>{F(b, "x", {kB, kS, kD}), F(b, "w", {kF, kD}), F(b, "bias", {kF})};
  };
  auto mm_res = [](Builder& b) {
    return std::vector<Value>{F(b, "x", {kB, kS, kF}), F(b, "w", {kD, kF}),
                              F(b, "r", {kB, kS, kD})};
  };
  auto wgrad = [](Builder& b) {  // dy[B,S,F]^T x x[B,S,D] -> dW[F,D]
    return std::vector<Value>{F(b, "dy", {kB, kS, kF}), F(b, "x", {kB, kS, kD})};
  };
  auto emb = [](Builder& b) {
    return std::vector<Value>{F(b, "table", {kV, kD}), I(b, "ids", {kB, kS})};
  };
  auto emb_bwd = [](Builder& b) {
    return std::vector<Value>{F(b, "dy", {kB, kS, kD}), I(b, "ids", {kB, kS})};
  };
  auto norm = [](Builder& b) { return std::vector<Value>{F(b, "x", {kB, kS, kD}), F(b, "w", {kD})}; };
  auto norm_bwd = [](Builder& b) {
    return std::vector<Value>{F(b, "dy", {kB, kS, kD}), F(b, "x", {kB, kS, kD}), F(b, "w", {kD})};
  };
  auto add_norm = [](Builder& b) {
    return std::vector<Value>{F(b, "x", {kB, kS, kD}), F(b, "r", {kB, kS, kD}), F(b, "w", {kD})};
  };
  auto add_norm_bwd = [](Builder& b) {
    return std::vector<Value>{F(b, "dy", {kB, kS, kD}), F(b, "dh", {kB, kS, kD}),
                              F(b, "h", {kB, kS, kD}), F(b, "w", {kD})};
  };
  auto logits = [](Builder& b) {
    return std::vector<Value>{F(b, "logits", {kB, kS, kV}), I(b, "t", {kB, kS})};
  };
  auto logits_bwd = [](Builder& b) {
    return std::vector<Value>{Sc(b, "dl"), F(b, "logits", {kB, kS, kV}), I(b, "t", {kB, kS})};
  };
  auto bias_add = [](Builder& b) {
    return std::vector<Value>{F(b, "x", {kB, kS, kD}), F(b, "bias", {kD})};
  };
  auto three = [](Builder& b) {
    return std::vector<Value>{F(b, "dy", {kB, kS, kD}), F(b, "g", {kB, kS, kD}),
                              F(b, "u", {kB, kS, kD})};
  };
  auto adamw = [](Builder& b) {
    return std::vector<Value>{F(b, "p", {kD, kD}), F(b, "g", {kD, kD}), F(b, "m", {kD, kD}),
                              F(b, "v", {kD, kD}), Sc(b, "step"), Sc(b, "lr"), Sc(b, "gs")};
  };
  auto grads = [](Builder& b) {
    return std::vector<Value>{F(b, "g1", {kD, kD}), F(b, "g2", {kD}), F(b, "g3", {kF, kD})};
  };
  auto none = [](Builder&) { return std::vector<Value>{}; };
  const Attrs src = {{"name", std::string("w")}, {"shape", graph::SymShape{kD}},
                     {"dtype", DType::kF32}};
  Attrs param = src;
  param["trainable"] = true;
  Attrs fill = {{"value", 1.0}, {"shape", graph::SymShape{kD}}, {"dtype", DType::kF32}};
  const Attrs eps = {{"eps", 1e-5}};
  const Attrs attn = {{"causal", true}, {"scale", 0.0}};
  const Attrs ign = {{"ignore_index", int64_t(-100)}};
  const Attrs rope = {{"theta", 1e4}};
  const auto M = ConflictPolicy::kMoveActivations;
  return {
      {OpKind::kParameter, none, param, "", " -> R"},
      {OpKind::kInput, none, src, "", " -> R"},
      {OpKind::kFill, none, fill, "", " -> R"},
      // Embedding: vocab parallel, dim parallel, data parallel; FSDP gathers a sharded table.
      {OpKind::kEmbedding, emb, {}, "S(0) R", "S(0) R -> P(sum)"},
      {OpKind::kEmbedding, emb, {}, "S(1) R", "S(1) R -> S(2)"},
      {OpKind::kEmbedding, emb, {}, "R S(0)", "R S(0) -> S(0)"},
      {OpKind::kEmbedding, emb, {}, "S(0) S(0)", "R S(0) -> S(0)"},
      {OpKind::kEmbedding, emb, {}, "S(0) S(1)", "S(0) R -> P(sum)", M},
      {OpKind::kEmbeddingBackward, emb_bwd, {{"num_embeddings", int64_t(64)}}, "S(0) S(0)",
       "S(0) S(0) -> P(sum)"},
      {OpKind::kEmbeddingBackward, emb_bwd, {{"num_embeddings", int64_t(64)}}, "S(2) R",
       "S(2) R -> S(1)"},
      {OpKind::kEmbeddingBackward, emb_bwd, {{"num_embeddings", int64_t(64)}}, "P(sum) R",
       "P(sum) R -> P(sum)"},
      // Matmul: data parallel, column, row, FSDP gather, Megatron SP gather, partial in.
      {OpKind::kMatmul, mm, Mm(false, true), "S(0) R", "S(0) R -> S(0)"},
      {OpKind::kMatmul, mm, Mm(false, true), "R S(0)", "R S(0) -> S(2)"},
      {OpKind::kMatmul, mm, Mm(false, true), "S(2) S(1)", "S(2) S(1) -> P(sum)"},
      {OpKind::kMatmul, mm, Mm(false, true), "S(0) S(0)", "S(0) R -> S(0)"},
      {OpKind::kMatmul, mm, Mm(false, true), "S(1) S(0)", "R S(0) -> S(2)", M},
      {OpKind::kMatmul, mm, Mm(false, true), "S(1) S(1)", "S(2) S(1) -> P(sum)", M},
      {OpKind::kMatmul, mm, Mm(false, true), "P(sum) R", "P(sum) R -> P(sum)"},
      {OpKind::kMatmul, mm, Mm(false, true), "P(max) R", "R R -> R"},
      {OpKind::kMatmul, mm, Mm(false, true), "S(2) R", "S(2) S(1) -> P(sum)"},
      {OpKind::kMatmul, mm_bias, Mm(false, true, "bias"), "R S(0) R", "R S(0) S(0) -> S(2)"},
      {OpKind::kMatmul, mm_bias, Mm(false, true, "bias"), "S(2) S(1) R",
       "S(2) S(1) P(sum) -> P(sum)"},
      {OpKind::kMatmul, mm_res, Mm(false, true, "residual"), "S(2) S(1) R",
       "S(2) S(1) P(sum) -> P(sum)"},
      {OpKind::kMatmul, mm_res, Mm(false, true, "residual"), "S(0) R S(0)",
       "S(0) R S(0) -> S(0)"},
      // Weight gradients (trans_a).
      {OpKind::kMatmul, wgrad, Mm(true, false), "S(0) S(0)", "S(0) S(0) -> P(sum)"},
      {OpKind::kMatmul, wgrad, Mm(true, false), "S(2) R", "S(2) R -> S(0)"},
      {OpKind::kMatmul, wgrad, Mm(true, false), "R S(2)", "R S(2) -> S(1)"},
      {OpKind::kMatmul, wgrad, Mm(true, false), "S(2) S(1)", "S(2) R -> S(0)", M},
      {OpKind::kMatmul, wgrad, Mm(true, false), "S(2) S(1)", "S(1) S(1) -> P(sum)"},
      // Norms need the normalized dim whole.
      {OpKind::kRmsNorm, norm, eps, "S(1) R", "S(1) R -> S(1)"},
      {OpKind::kRmsNorm, norm, eps, "S(2) R", "R R -> R"},
      {OpKind::kRmsNorm, norm, eps, "P(sum) S(0)", "R R -> R"},
      {OpKind::kRmsNormBackward, norm_bwd, eps, "S(0) S(0) R", "S(0) S(0) R -> S(0) P(sum)"},
      {OpKind::kRmsNormBackward, norm_bwd, eps, "P(sum) R R", "P(sum) R R -> P(sum) P(sum)"},
      {OpKind::kAddRmsNorm, add_norm, eps, "P(sum) S(1) R", "S(1) S(1) R -> S(1) S(1)"},
      {OpKind::kAddRmsNorm, add_norm, eps, "P(sum) R R", "R R R -> R R"},
      {OpKind::kAddRmsNormBackward, add_norm_bwd, eps, "S(1) R S(1) R",
       "S(1) S(1) S(1) R -> S(1) P(sum)"},
      {OpKind::kAddRmsNormBackward, add_norm_bwd, eps, "P(sum) R R R",
       "P(sum) P(sum) R R -> P(sum) P(sum)"},
      // RoPE: positions are global, so a sequence shard is gathered.
      {OpKind::kRope, q4, rope, "S(2)", "S(2) -> S(2)"},
      {OpKind::kRope, q4, rope, "S(1)", "R -> R"},
      {OpKind::kRopeBackward, q4, rope, "P(sum)", "P(sum) -> P(sum)"},
      // Attention by heads (GQA kv heads must split too) or by batch.
      {OpKind::kAttention, qkv, attn, "S(2) S(2) R", "S(2) S(2) S(2) -> S(2)"},
      {OpKind::kAttention, qkv_gqa2, attn, "S(2) S(2) S(2)", "R R R -> R"},
      {OpKind::kAttention, qkv, attn, "S(0) R R", "S(0) S(0) S(0) -> S(0)"},
      {OpKind::kAttention, qkv, attn, "S(1) S(1) S(1)", "R R R -> R"},
      {OpKind::kAttentionBackward, attn_bwd, attn, "S(2) S(2) S(2) S(2) S(2)",
       "S(2) S(2) S(2) S(2) S(2) -> S(2) S(2) S(2)"},
      {OpKind::kSwiGLU, x3x3, {}, "S(2) S(2)", "S(2) S(2) -> S(2)"},
      {OpKind::kSwiGLU, x3x3, {}, "P(sum) R", "R R -> R"},
      {OpKind::kSwiGLUBackward, three, {}, "P(sum) R R", "P(sum) R R -> P(sum) P(sum)"},
      {OpKind::kSwiGLUBackward, three, {}, "R S(1) R", "S(1) S(1) S(1) -> S(1) S(1)"},
      // Losses: rows sharded (global count all-reduced), vocab parallel (the special rule).
      {OpKind::kSoftmaxCrossEntropy, logits, ign, "S(0) S(0)", "S(0) S(0) -> P(sum) [sum]"},
      {OpKind::kSoftmaxCrossEntropy, logits, ign, "S(2) R", "S(2) R -> R [max,sum,sum]"},
      {OpKind::kSoftmaxCrossEntropy, logits, ign, "P(sum) R", "R R -> R"},
      {OpKind::kSoftmaxCrossEntropyBackward, logits_bwd, ign, "R S(2) R",
       "R S(2) R -> S(2) [max,sum]"},
      {OpKind::kSoftmaxCrossEntropyBackward, logits_bwd, ign, "R S(1) S(1)",
       "R S(1) S(1) -> S(1) [sum]"},
      {OpKind::kLogSoftmax, x3, {}, "S(2)", "R -> R"},
      {OpKind::kLogSoftmax, x3, {}, "S(1)", "S(1) -> S(1)"},
      {OpKind::kLogSoftmaxBackward, x3x3, {}, "P(sum) R", "P(sum) R -> P(sum)"},
      {OpKind::kNllLoss, logits, ign, "S(2) R", "S(2) R -> P(sum)"},
      {OpKind::kNllLoss, logits, ign, "S(0) R", "S(0) S(0) -> P(sum) [sum]"},
      {OpKind::kNllLossBackward, logits_bwd, ign, "R S(2) R", "R S(2) R -> S(2)"},
      // Elementwise.
      {OpKind::kAdd, x3x3, {}, "P(sum) R", "P(sum) P(sum) -> P(sum)"},
      {OpKind::kAdd, x3x3, {}, "P(sum) S(1)", "S(1) S(1) -> S(1)"},
      {OpKind::kAdd, bias_add, {}, "S(2) R", "S(2) S(0) -> S(2)"},
      {OpKind::kAdd, bias_add, {}, "S(0) R", "S(0) R -> S(0)"},
      {OpKind::kSub, x3x3, {}, "P(sum) P(max)", "R R -> R"},
      {OpKind::kMul, x3x3, {}, "R P(sum)", "R P(sum) -> P(sum)"},
      {OpKind::kMul, x3x3, {}, "P(sum) P(sum)", "P(sum) R -> P(sum)"},
      {OpKind::kDiv, x3x3, {}, "R P(sum)", "R R -> R"},
      {OpKind::kDiv, x3x3, {}, "P(avg) R", "P(avg) R -> P(avg)"},
      {OpKind::kNeg, x3, {}, "P(max)", "R -> R"},
      {OpKind::kNeg, x3, {}, "S(1)", "S(1) -> S(1)"},
      {OpKind::kScale, x3, {{"factor", 2.0}}, "P(max)", "P(max) -> P(max)"},
      {OpKind::kScale, x3, {{"factor", -2.0}}, "P(sum)", "P(sum) -> P(sum)"},
      {OpKind::kSilu, x3, {}, "P(sum)", "R -> R"},
      {OpKind::kSilu, x3, {}, "S(2)", "S(2) -> S(2)"},
      {OpKind::kSiluBackward, x3x3, {}, "P(sum) R", "P(sum) R -> P(sum)"},
      {OpKind::kExp, x3, {}, "S(0)", "S(0) -> S(0)"},
      {OpKind::kLog, x3, {}, "P(avg)", "R -> R"},
      {OpKind::kRsqrt, x3, {}, "S(1)", "S(1) -> S(1)"},
      {OpKind::kCast, x3, {{"dtype", DType::kBF16}}, "P(max)", "P(max) -> P(max)"},
      // Layout.
      {OpKind::kReshape, x3, {{"shape", graph::SymShape{kB * kS, kD}}}, "S(0)", "S(0) -> S(0)"},
      {OpKind::kReshape, x3, {{"shape", graph::SymShape{kB * kS, kD}}}, "S(1)", "R -> R"},
      {OpKind::kReshape, x3, {{"shape", graph::SymShape{kB, kS, kH, kHd}}}, "S(2)",
       "S(2) -> S(2)"},
      {OpKind::kReshape, q4, {{"shape", graph::SymShape{kB, kS, kH * kHd}}}, "S(2)",
       "S(2) -> S(2)"},
      {OpKind::kReshape, q4, {{"shape", graph::SymShape{kB, kS, kH * kHd}}}, "S(3)", "R -> R"},
      {OpKind::kReshape, x3, {{"shape", graph::SymShape{kB, kS, 2, 16}}}, "S(2)", "R -> R"},
      {OpKind::kReshape, x3, {{"shape", graph::SymShape{kB, kS, kD}}}, "P(sum)",
       "P(sum) -> P(sum)"},
      {OpKind::kTranspose, q4, {{"perm", graph::IntList{0, 2, 1, 3}}}, "S(2)", "S(2) -> S(1)"},
      {OpKind::kReduceSum, x3, {{"dims", graph::IntList{0, 1}}}, "S(1)", "S(1) -> P(sum)"},
      {OpKind::kReduceSum, x3, {{"dims", graph::IntList{0}}}, "S(2)", "S(2) -> S(1)"},
      {OpKind::kReduceSum, x3, {{"dims", graph::IntList{0}}}, "P(max)", "R -> R"},
      {OpKind::kBroadcast, norm_bwd, {}, "", ""},  // placeholder replaced below
      // Optimizer: ZeRO (sharded p pulls a reduce-scatter of P grads), DDP (all-reduce).
      {OpKind::kGradNorm, grads, {{"max_norm", 1.0}}, "S(0) R P(sum)", "S(0) R R -> R R [sum]"},
      {OpKind::kAdamW, adamw, {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.1}},
       "S(0) P(sum) S(0) S(0) R R R", "S(0) S(0) S(0) S(0) R R R -> S(0) S(0) S(0)"},
      {OpKind::kAdamW, adamw, {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.1}},
       "R P(sum) R R R R R", "R R R R R R R -> R R R"},
  };
}

OpSharding RunCase(const Case& c, const DeviceMesh& mesh) {
  Builder b;
  std::vector<Value> inputs = c.inputs(b);
  EXPECT_TRUE(b.status().ok()) << b.status();
  std::vector<Value> outs = b.Emit(c.op, inputs, c.attrs);
  EXPECT_TRUE(b.status().ok()) << graph::OpName(c.op) << ": " << b.status();
  if (outs.empty()) return {};
  const graph::Node& node = b.graph().nodes().back();
  std::vector<graph::Type> types;
  for (int id : node.inputs) types.push_back(b.graph().type(id));
  std::vector<Placements> in;
  for (absl::string_view p : absl::StrSplit(c.in, ' ', absl::SkipEmpty())) {
    in.push_back(ParsePlacements(p).value());
  }
  PropagationOptions options;
  options.policy = {c.policy};
  absl::StatusOr<OpSharding> s = Propagate(node, types, in, mesh, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : OpSharding{};
}

TEST(Propagation, EveryOpHasARuleAndACase) {
  const DeviceMesh mesh = DeviceMesh::Parse("tp=4").value();
  std::vector<Case> cases = Cases();
  // broadcast [D] -> [B,S,D] along dims {0,1}.
  for (Case& c : cases) {
    if (c.op != OpKind::kBroadcast) continue;
    c.inputs = [](Builder& b) { return std::vector<Value>{F(b, "bias", {kD})}; };
    c.attrs = {{"shape", graph::SymShape{kB, kS, kD}}, {"dims", graph::IntList{0, 1}}};
    c.in = "S(0)";
    c.want = "S(0) -> S(2)";
  }
  std::set<OpKind> covered;
  for (const Case& c : cases) {
    covered.insert(c.op);
    EXPECT_EQ(Show(RunCase(c, mesh)), c.want) << graph::OpName(c.op) << " with " << c.in;
  }
  for (int k = 0; k < graph::kNumOpKinds; ++k) {
    EXPECT_TRUE(covered.count(OpKind(k))) << "no propagation case for " << graph::OpName(OpKind(k));
  }
}

TEST(Propagation, MeshDimsAreIndependent) {
  // FSDP x TP on dp=2,tp=4: x [S(0),R] (batch over dp), wq [S(0),S(0)] (rows over dp then tp).
  const DeviceMesh mesh = DeviceMesh::Parse("dp=2,tp=4").value();
  Builder b;
  Value x = F(b, "x", {kB, kS, kD});
  Value w = F(b, "w", {kF, kD});
  b.Matmul(x, w, graph::MatmulOptions::TransB());
  ASSERT_TRUE(b.status().ok()) << b.status();
  const graph::Node& node = b.graph().nodes().back();
  PropagationOptions o;
  o.policy = {ConflictPolicy::kGatherWeights, ConflictPolicy::kMoveActivations};
  OpSharding s = Propagate(node, {b.type(x), b.type(w)},
                           {ParsePlacements("[S(0),R]").value(), ParsePlacements("[S(0),S(0)]").value()},
                           mesh, o)
                     .value();
  EXPECT_EQ(PlacementsToString(s.inputs[0]), "[S(0),R]");
  EXPECT_EQ(PlacementsToString(s.inputs[1]), "[R,S(0)]");  // gathered over dp only
  EXPECT_EQ(PlacementsToString(s.outputs[0]), "[S(0),S(2)]");
}

TEST(Propagation, VocabParallelRowsDividedByOtherShards) {
  const DeviceMesh mesh = DeviceMesh::Parse("dp=2,tp=4").value();
  Builder b;
  Value l = F(b, "logits", {kB, kS, kV});
  Value t = I(b, "t", {kB, kS});
  b.SoftmaxCrossEntropy(l, t);
  const graph::Node& node = b.graph().nodes().back();
  OpSharding s = Propagate(node, {b.type(l), b.type(t)},
                           {ParsePlacements("[S(0),S(2)]").value(), ParsePlacements("[S(0),R]").value()},
                           mesh)
                     .value();
  EXPECT_EQ(PlacementsToString(s.outputs[0]), "[P(sum),R]");
  ASSERT_EQ(s.internal.size(), 4u);
  EXPECT_EQ(s.internal[0].mesh_dim, 0);  // the count, over dp
  EXPECT_EQ(s.internal[1].mesh_dim, 1);
  EXPECT_EQ(s.internal[1].op, ReduceOp::kMax);
  EXPECT_EQ(s.internal[1].elements, kB * kS);
  EXPECT_EQ(s.internal[1].divisor, 2);  // rows split over dp
}

TEST(Propagation, RejectsMismatchedPlacements) {
  const DeviceMesh mesh = DeviceMesh::Parse("dp=2,tp=4").value();
  Builder b;
  Value x = F(b, "x", {kB, kD});
  b.Neg(x);
  const graph::Node& node = b.graph().nodes().back();
  absl::Status s = Propagate(node, {b.type(x)}, {{Placement::Shard(0)}}, mesh).status();
  EXPECT_NE(s.message().find("expected one placement per dim of mesh dp=2,tp=4"), std::string::npos)
      << s;
  s = Propagate(node, {b.type(x)}, {{Placement::Shard(2), Placement()}}, mesh).status();
  EXPECT_NE(s.message().find("S(2) is beyond the rank"), std::string::npos) << s;
}

}  // namespace
}  // namespace sg::sharding
