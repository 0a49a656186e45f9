#include "graph/autodiff.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::graph {
namespace {

// Everything a VJP rule sees: the builder appending the backward, the forward node, and the
// cotangents of its outputs (invalid Value where an output has none).
struct Ctx {
  Builder& b;
  const Node& n;
  const std::vector<Value>& dout;

  Value in(int i) const { return Value{n.inputs[i]}; }
  Value out(int i) const { return Value{n.outputs[i]}; }
  const Type& in_type(int i) const { return b.type(in(i)); }
  // The cotangent of output i, zeros when nothing downstream used it.
  Value d(int i) const {
    if (dout[i].valid()) return dout[i];
    const Type& t = b.type(out(i));
    return b.Fill(0.0, t.dtype, t.shape);
  }
  // Sums the leading dims of a broadcast operand's cotangent back to `to`'s shape.
  Value SumTo(Value g, int to) const {
    const int extra = b.type(g).rank() - in_type(to).rank();
    if (extra == 0) return g;
    IntList dims;
    for (int i = 0; i < extra; ++i) dims.push_back(i);
    return b.ReduceSum(g, dims);
  }
  std::vector<Value> Emit(OpKind op, std::vector<Value> ins, Attrs attrs) const {
    return b.Emit(op, ins, std::move(attrs));
  }
};

using Grads = std::vector<Value>;  // one per forward input; invalid = no gradient

Grads EmbeddingBackward(const Ctx& c) {
  const Dim v = c.in_type(0).shape[0];
  if (!v.is_constant()) return {};
  return {c.Emit(OpKind::kEmbeddingBackward, {c.d(0), c.in(1)},
                 {{"num_embeddings", v.value()}})[0], Value{}};
}

Grads MatmulBackward(const Ctx& c) {
  const bool ta = AttrBool(c.n, "trans_a"), tb = AttrBool(c.n, "trans_b");
  const std::string& epi = AttrString(c.n, "epilogue");
  Value dy = c.d(0), a = c.in(0), w = c.in(1);
  Grads g(c.n.inputs.size());
  if (!ta && !tb) {
    g[0] = c.b.Matmul(dy, w, MatmulOptions::TransB());
    g[1] = c.b.Matmul(a, dy, MatmulOptions::TransA());
  } else if (!ta) {
    g[0] = c.b.Matmul(dy, w);
    g[1] = c.b.Matmul(dy, a, MatmulOptions::TransA());
  } else {
    g[0] = c.b.Matmul(w, dy, MatmulOptions::TransB());
    g[1] = c.b.Matmul(a, dy);
  }
  size_t next = 2;
  if (epi == "bias" || epi == "bias_residual") {
    IntList lead;
    for (int i = 0; i + 1 < c.b.type(dy).rank(); ++i) lead.push_back(i);
    g[next++] = lead.empty() ? dy : c.b.ReduceSum(dy, lead);
  }
  if (epi == "residual" || epi == "bias_residual") g[next] = dy;
  return g;
}

Grads RmsNormBackward(const Ctx& c) {
  auto r = c.Emit(OpKind::kRmsNormBackward, {c.d(0), c.in(0), c.in(1)}, c.n.attrs);
  return {r[0], r[1]};
}

Grads AddRmsNormBackward(const Ctx& c) {
  auto r = c.Emit(OpKind::kAddRmsNormBackward, {c.d(0), c.d(1), c.out(1), c.in(2)}, c.n.attrs);
  return {r[0], r[0], r[1]};
}

Grads RopeBackward(const Ctx& c) { return {c.Emit(OpKind::kRopeBackward, {c.d(0)}, c.n.attrs)[0]}; }

Grads AttentionBackward(const Ctx& c) {
  auto r = c.Emit(OpKind::kAttentionBackward, {c.d(0), c.in(0), c.in(1), c.in(2), c.out(0)},
                  c.n.attrs);
  return {r[0], r[1], r[2]};
}

Grads SwiGLUBackward(const Ctx& c) {
  auto r = c.Emit(OpKind::kSwiGLUBackward, {c.d(0), c.in(0), c.in(1)}, {});
  return {r[0], r[1]};
}

Grads SoftmaxCrossEntropyBackward(const Ctx& c) {
  return {c.Emit(OpKind::kSoftmaxCrossEntropyBackward, {c.d(0), c.in(0), c.in(1)}, c.n.attrs)[0],
          Value{}};
}

Grads LogSoftmaxBackward(const Ctx& c) {
  return {c.Emit(OpKind::kLogSoftmaxBackward, {c.d(0), c.out(0)}, {})[0]};
}

Grads NllLossBackward(const Ctx& c) {
  return {c.Emit(OpKind::kNllLossBackward, {c.d(0), c.in(0), c.in(1)}, c.n.attrs)[0], Value{}};
}

Grads AddBackward(const Ctx& c) { return {c.SumTo(c.d(0), 0), c.SumTo(c.d(0), 1)}; }
Grads SubBackward(const Ctx& c) { return {c.SumTo(c.d(0), 0), c.SumTo(c.b.Neg(c.d(0)), 1)}; }
Grads MulBackward(const Ctx& c) {
  return {c.SumTo(c.b.Mul(c.d(0), c.in(1)), 0), c.SumTo(c.b.Mul(c.d(0), c.in(0)), 1)};
}
Grads DivBackward(const Ctx& c) {
  // d(a/b)/db = -(a/b)/b = -y/b.
  Value db = c.b.Neg(c.b.Div(c.b.Mul(c.d(0), c.out(0)), c.in(1)));
  return {c.SumTo(c.b.Div(c.d(0), c.in(1)), 0), c.SumTo(db, 1)};
}
Grads NegBackward(const Ctx& c) { return {c.b.Neg(c.d(0))}; }
Grads ScaleBackward(const Ctx& c) { return {c.b.Scale(c.d(0), AttrFloat(c.n, "factor"))}; }
Grads SiluBackward(const Ctx& c) {
  return {c.Emit(OpKind::kSiluBackward, {c.d(0), c.in(0)}, {})[0]};
}
Grads ExpBackward(const Ctx& c) { return {c.b.Mul(c.d(0), c.out(0))}; }
Grads LogBackward(const Ctx& c) { return {c.b.Div(c.d(0), c.in(0))}; }
Grads RsqrtBackward(const Ctx& c) {
  Value y = c.out(0);
  return {c.b.Scale(c.b.Mul(c.d(0), c.b.Mul(y, c.b.Mul(y, y))), -0.5)};
}
Grads ReshapeBackward(const Ctx& c) { return {c.b.Reshape(c.d(0), c.in_type(0).shape)}; }
Grads TransposeBackward(const Ctx& c) {
  const IntList& p = AttrInts(c.n, "perm");
  IntList inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = int64_t(i);
  return {c.b.Transpose(c.d(0), inv)};
}
Grads CastBackward(const Ctx& c) {
  if (!IsFloating(c.in_type(0).dtype)) return {Value{}};
  return {c.b.Cast(c.d(0), c.in_type(0).dtype)};
}
Grads ReduceSumBackward(const Ctx& c) {
  return {c.b.Broadcast(c.d(0), c.in_type(0).shape, AttrInts(c.n, "dims"))};
}
Grads BroadcastBackward(const Ctx& c) { return {c.b.ReduceSum(c.d(0), AttrInts(c.n, "dims"))}; }

using Rule = Grads (*)(const Ctx&);

Rule RuleFor(OpKind op) {
  switch (op) {
    case OpKind::kEmbedding: return EmbeddingBackward;
    case OpKind::kMatmul: return MatmulBackward;
    case OpKind::kRmsNorm: return RmsNormBackward;
    case OpKind::kAddRmsNorm: return AddRmsNormBackward;
    case OpKind::kRope: return RopeBackward;
    case OpKind::kAttention: return AttentionBackward;
    case OpKind::kSwiGLU: return SwiGLUBackward;
    case OpKind::kSoftmaxCrossEntropy: return SoftmaxCrossEntropyBackward;
    case OpKind::kLogSoftmax: return LogSoftmaxBackward;
    case OpKind::kNllLoss: return NllLossBackward;
    case OpKind::kAdd: return AddBackward;
    case OpKind::kSub: return SubBackward;
    case OpKind::kMul: return MulBackward;
    case OpKind::kDiv: return DivBackward;
    case OpKind::kNeg: return NegBackward;
    case OpKind::kScale: return ScaleBackward;
    case OpKind::kSilu: return SiluBackward;
    case OpKind::kExp: return ExpBackward;
    case OpKind::kLog: return LogBackward;
    case OpKind::kRsqrt: return RsqrtBackward;
    case OpKind::kReshape: return ReshapeBackward;
    case OpKind::kTranspose: return TransposeBackward;
    case OpKind::kCast: return CastBackward;
    case OpKind::kReduceSum: return ReduceSumBackward;
    case OpKind::kBroadcast: return BroadcastBackward;
    default: return nullptr;
  }
}

}  // namespace

bool HasVjp(OpKind op) { return RuleFor(op) != nullptr; }

absl::StatusOr<BackwardResult> AppendBackward(const Graph& forward, const BackwardOptions& options) {
  SG_RETURN_IF_ERROR(Verify(forward));
  const int li = forward.FindOutput(options.loss);
  if (li < 0) {
    return absl::InvalidArgumentError(absl::StrCat("autodiff: no graph output named '",
                                                   options.loss, "'"));
  }
  const int loss = forward.outputs()[li].value;
  const Type& lt = forward.type(loss);
  if (lt.rank() != 0 || !IsFloating(lt.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("autodiff: loss '", options.loss,
                                                   "' must be a floating scalar, found ",
                                                   lt.ToString()));
  }
  std::vector<int> wrt = options.wrt;
  if (wrt.empty()) {
    for (const Node& n : forward.nodes()) {
      if (n.op == OpKind::kParameter && AttrBool(n, "trainable")) wrt.push_back(n.outputs[0]);
    }
  }
  // Only values that depend on a wrt value need cotangents.
  std::vector<bool> needs(forward.num_value_ids(), false);
  for (int w : wrt) {
    if (!forward.has_value(w)) {
      return absl::InvalidArgumentError(absl::StrCat("autodiff: wrt value %", w, " is not defined"));
    }
    needs[w] = true;
  }
  for (const Node& n : forward.nodes()) {
    bool any = false;
    for (int in : n.inputs) any |= needs[in];
    if (any) {
      for (int o : n.outputs) needs[o] = IsFloating(forward.type(o).dtype);
    }
  }

  const int num_forward_nodes = int(forward.nodes().size());
  Builder b{Graph(forward)};
  b.set_phase(Phase::kBackward);
  std::map<int, Value> cot;
  cot[loss] = b.Fill(1.0, lt.dtype, {});
  for (int i = num_forward_nodes - 1; i >= 0; --i) {
    const Node n = b.graph().nodes()[i];  // copy: emitting appends to the node vector
    std::vector<Value> dout;
    bool any = false;
    for (int o : n.outputs) {
      auto it = cot.find(o);
      dout.push_back(it == cot.end() ? Value{} : it->second);
      any |= it != cot.end();
    }
    bool wanted = false;
    for (int in : n.inputs) wanted |= needs[in];
    if (!any || !wanted) continue;
    Rule rule = RuleFor(n.op);
    if (rule == nullptr) {
      return absl::UnimplementedError(absl::StrCat("autodiff: ", OpName(n.op), " (node ", i,
                                                   n.scope.empty() ? "" : " in '" + n.scope + "'",
                                                   ") has no VJP rule but lies on a path from a "
                                                   "differentiated value to the loss"));
    }
    auto scope = b.EnterScope(n.scope);
    Grads g = rule(Ctx{b, n, dout});
    SG_RETURN_IF_ERROR(b.status());
    for (size_t k = 0; k < n.inputs.size() && k < g.size(); ++k) {
      const int in = n.inputs[k];
      if (!g[k].valid() || !needs[in]) continue;
      auto it = cot.find(in);
      if (it == cot.end()) cot[in] = g[k];
      else it->second = b.Add(it->second, g[k]);
    }
  }
  BackwardResult result;
  for (int w : wrt) {
    auto it = cot.find(w);
    const Type& t = forward.type(w);
    Value g = it != cot.end() ? it->second : b.Fill(0.0, t.dtype, t.shape);
    const Node& src = forward.nodes()[forward.value(w).producer];
    const bool is_source = src.op == OpKind::kParameter || src.op == OpKind::kInput;
    b.Output(is_source ? "grad:" + AttrString(src, "name") : absl::StrCat("grad:%", w), g);
    result.grads.push_back({w, g.id});
  }
  SG_ASSIGN_OR_RETURN(result.graph, b.Finish());
  return result;
}

}  // namespace sg::graph
