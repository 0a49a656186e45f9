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

}  // namespace sg::compiler
