#include "compiler/training_graph.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::Value;

bool IsLossBackward(OpKind op) {
  return op == OpKind::kSoftmaxCrossEntropyBackward || op == OpKind::kNllLossBackward;
}

}  // namespace

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16Mixed: return "bf16";
    case Precision::kF16Mixed: return "f16";
  }
  return "?";
}

DType ComputeDType(Precision p) {
  switch (p) {
    case Precision::kBF16Mixed: return DType::kBF16;
    case Precision::kF16Mixed: return DType::kF16;
    default: return DType::kF32;
  }
}

bool CopySourceNode(Builder& b, const Node& n, Value* out) {
  if (n.op == OpKind::kParameter) {
    *out = b.Parameter(graph::AttrString(n, "name"), graph::AttrDType(n, "dtype"), graph::AttrShape(n, "shape"),
                       graph::AttrBool(n, "trainable"));
    return true;
  }
  if (n.op == OpKind::kInput) {
    *out = b.Input(graph::AttrString(n, "name"), graph::AttrDType(n, "dtype"), graph::AttrShape(n, "shape"));
    return true;
  }
  return false;
}

bool IsTrainingGraph(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kAdamW) return true;
  }
  return false;
}

absl::StatusOr<Graph> ToMixedPrecision(const Graph& forward, DType compute) {
  if (compute != DType::kBF16 && compute != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("ToMixedPrecision: compute dtype must be bf16 or f16, found ", DTypeName(compute)));
  }
  Graph start;
  for (const graph::SymbolInfo& s : forward.symbols()) SG_RETURN_IF_ERROR(start.AddSymbol(s));
  Builder b(std::move(start));
  std::vector<Value> map(forward.num_value_ids());
  std::map<int, Value> cast_of;  // new source id -> its bf16 copy
  auto use = [&](int old_id) -> Value {
    Value v = map[old_id];
    const Node& producer = forward.nodes()[forward.value(old_id).producer];
    const bool source = producer.op == OpKind::kParameter || producer.op == OpKind::kInput;
    if (!source || b.type(v).dtype != DType::kF32) return v;
    auto it = cast_of.find(v.id);
    if (it != cast_of.end()) return it->second;
    // The cast sits in the forward phase at the top level: it is the 16-bit compute copy.
    return cast_of[v.id] = b.Cast(v, compute);
  };
  for (const Node& n : forward.nodes()) {
    auto scope = b.EnterScope(n.scope);
    b.set_phase(n.phase);
    if (Value v; CopySourceNode(b, n, &v)) {
      map[n.outputs[0]] = v;  // a parameter or input
      continue;
    }
    graph::Attrs attrs = n.attrs;
    if (n.op == OpKind::kFill && graph::AttrDType(n, "dtype") == DType::kF32) {
      attrs["dtype"] = compute;
    }
    std::vector<Value> ins;
    for (int id : n.inputs) ins.push_back(use(id));
    std::vector<Value> outs = b.Emit(n.op, ins, attrs);
    SG_RETURN_IF_ERROR(b.status());
    for (size_t k = 0; k < outs.size(); ++k) map[n.outputs[k]] = outs[k];
  }
  for (const graph::GraphOutput& o : forward.outputs()) b.Output(o.name, map[o.value]);
  return b.Finish();
}

absl::StatusOr<Graph> SeedLossWithScale(const Graph& train) {
  const auto& nodes = train.nodes();
  auto is_seed = [&](const Node& n, int k) {
    return IsLossBackward(n.op) && k == 0 && nodes[train.value(n.inputs[0]).producer].op == OpKind::kFill;
  };
  // Fills read only as seeds are dropped with them.
  std::map<int, int> other_uses;  // fill output -> uses other than as a seed
  for (const Node& n : nodes) {
    for (int k = 0; k < int(n.inputs.size()); ++k) {
      if (!is_seed(n, k)) ++other_uses[n.inputs[k]];
    }
  }
  for (const graph::GraphOutput& o : train.outputs()) ++other_uses[o.value];
  Graph start;
  for (const graph::SymbolInfo& s : train.symbols()) SG_RETURN_IF_ERROR(start.AddSymbol(s));
  Builder b(std::move(start));
  std::vector<Value> map(train.num_value_ids());
  Value scale;
  int seeds = 0;
  for (const Node& n : nodes) {
    auto scope = b.EnterScope(n.scope);
    b.set_phase(n.phase);
    if (Value v; CopySourceNode(b, n, &v)) {
      map[n.outputs[0]] = v;  // a parameter or input
      continue;
    }
    if (n.op == OpKind::kFill && other_uses[n.outputs[0]] == 0) continue;
    std::vector<Value> ins;
    for (int k = 0; k < int(n.inputs.size()); ++k) {
      if (!is_seed(n, k)) {
        ins.push_back(map[n.inputs[k]]);
        continue;
      }
      if (!scale.valid()) scale = b.Input(kLossScaleName, DType::kF32, {});
      ins.push_back(scale);
      ++seeds;
    }
    std::vector<Value> outs = b.Emit(n.op, ins, n.attrs);
    SG_RETURN_IF_ERROR(b.status());
    for (size_t k = 0; k < outs.size(); ++k) map[n.outputs[k]] = outs[k];
  }
  if (seeds != 1) {
    return absl::InvalidArgumentError(absl::StrCat("SeedLossWithScale: expected exactly one constant seed into the "
                                                   "loss's backward (softmax_cross_entropy_backward or "
                                                   "nll_loss_backward), found ", seeds));
  }
  for (const graph::GraphOutput& o : train.outputs()) b.Output(o.name, map[o.value]);
  return b.Finish();
}

}  // namespace sg::compiler
