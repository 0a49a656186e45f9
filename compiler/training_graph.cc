#include "compiler/training_graph.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/autodiff.h"
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

const std::string& SourceName(const Graph& g, int value) {
  return graph::AttrString(g.nodes()[g.value(value).producer], "name");
}

}  // namespace

bool IsTrainingGraph(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kAdamW) return true;
  }
  return false;
}

absl::StatusOr<Graph> ToMixedPrecision(const Graph& forward) {
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
    // The cast sits in the forward phase at the top level: it is the bf16 compute copy.
    return cast_of[v.id] = b.Cast(v, DType::kBF16);
  };
  for (const Node& n : forward.nodes()) {
    auto scope = b.EnterScope(n.scope);
    b.set_phase(n.phase);
    if (n.op == OpKind::kParameter) {
      map[n.outputs[0]] = b.Parameter(graph::AttrString(n, "name"), graph::AttrDType(n, "dtype"),
                                      graph::AttrShape(n, "shape"), graph::AttrBool(n, "trainable"));
      continue;
    }
    if (n.op == OpKind::kInput) {
      map[n.outputs[0]] = b.Input(graph::AttrString(n, "name"), graph::AttrDType(n, "dtype"),
                                  graph::AttrShape(n, "shape"));
      continue;
    }
    graph::Attrs attrs = n.attrs;
    if (n.op == OpKind::kFill && graph::AttrDType(n, "dtype") == DType::kF32) {
      attrs["dtype"] = DType::kBF16;
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

absl::StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const TrainingGraphOptions& options) {
  if (IsTrainingGraph(forward)) {
    return absl::InvalidArgumentError(
        "BuildTrainingGraph: expected a forward graph, found one that already has adamw nodes");
  }
  if (forward.FindOutput(options.loss) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BuildTrainingGraph: the forward graph has no output named '", options.loss, "'"));
  }
  Graph fwd = forward;
  if (options.precision == Precision::kBF16Mixed) {
    SG_ASSIGN_OR_RETURN(fwd, ToMixedPrecision(forward));
  }
  graph::BackwardOptions bo;
  bo.loss = options.loss;
  SG_ASSIGN_OR_RETURN(graph::BackwardResult r, graph::AppendBackward(fwd, bo));

  const Graph& g = r.graph;
  Builder b(r.graph);
  b.set_phase(graph::Phase::kOptimizer);
  auto scope = b.EnterScope("optimizer");
  const AdamWOptions& o = options.adamw;
  Value step = b.Parameter(kStepName, DType::kF32, {}, /*trainable=*/false);
  Value lr = b.Parameter(kLrName, DType::kF32, {}, /*trainable=*/false);
  Value next_step = b.Add(step, b.Fill(1.0, DType::kF32, {}));
  b.Output(absl::StrCat("update:", kStepName), next_step);
  std::vector<Value> grads;
  for (const auto& [param, grad] : r.grads) grads.push_back(Value{grad});
  auto [norm, clip] = b.GradNorm(grads, o.max_grad_norm);
  b.Output("grad_norm", norm);
  for (const auto& [param, grad] : r.grads) {
    const std::string& name = SourceName(g, param);
    const graph::Type& t = g.type(param);
    if (t.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BuildTrainingGraph: parameter '", name, "' is ", t.ToString(),
          "; expected f32 master weights (use Precision::kBF16Mixed for bf16 compute)"));
    }
    Value m = b.Parameter(AdamMName(name), DType::kF32, t.shape, false);
    Value v = b.Parameter(AdamVName(name), DType::kF32, t.shape, false);
    const bool decay = o.decay_vectors || t.rank() >= 2;
    std::vector<Value> outs = b.Emit(OpKind::kAdamW, {Value{param}, Value{grad}, m, v, next_step, lr, clip},
                                     {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
                                      {"weight_decay", decay ? o.weight_decay : 0.0}});
    SG_RETURN_IF_ERROR(b.status());
    b.Output("update:" + name, outs[0]);
    b.Output("update:" + AdamMName(name), outs[1]);
    b.Output("update:" + AdamVName(name), outs[2]);
  }
  return b.Finish();
}

}  // namespace sg::compiler
