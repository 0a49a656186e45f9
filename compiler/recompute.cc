// Recompute (activation checkpointing) as a graph rewrite on the training graph. Until the graph
// layer's recompute pass lands this is the compiler's own; its contract is ApplyRecompute's in
// compile.h.
#include <functional>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

using graph::Graph;
using graph::Node;
using graph::OpKind;

bool IsSource(OpKind op) { return op == OpKind::kParameter || op == OpKind::kInput; }

// "layers.3" for scope "layers.3.attention.wq", "" outside the repeated blocks.
std::string LayerOf(const std::string& scope) {
  if (!absl::StartsWith(scope, "layers.")) return "";
  const size_t dot = scope.find('.', 7);
  return dot == std::string::npos ? scope : scope.substr(0, dot);
}

}  // namespace

absl::StatusOr<Graph> ApplyRecompute(const Graph& g, RecomputePolicy policy) {
  if (policy == RecomputePolicy::kNone) return g;
  const auto& nodes = g.nodes();
  const std::vector<std::vector<int>> users = g.Users();

  // kFull keeps the values that cross a layer boundary (the residual stream) and recomputes
  // everything inside a layer; kSelective recomputes only cheap pointwise and layout ops.
  auto recomputable = [&](const Node& n) {
    if (n.phase != graph::Phase::kForward || IsSource(n.op) || n.op == OpKind::kFill) return false;
    if (policy == RecomputePolicy::kSelective) {
      return graph::Schema(n.op).is_elementwise || n.op == OpKind::kRope || n.op == OpKind::kReshape;
    }
    const std::string layer = LayerOf(n.scope);
    if (layer.empty()) return false;
    for (int v : n.outputs) {
      for (int u : users[v]) {
        if (nodes[u].phase == graph::Phase::kForward && LayerOf(nodes[u].scope) != layer) return false;
      }
    }
    return true;
  };

  Graph out;
  for (const graph::SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(out.AddSymbol(s));
  int next_id = g.num_value_ids();
  std::map<int, int> recomputed;  // forward value -> its recomputed copy
  auto types_of = [&](const Node& n) {
    std::vector<graph::Type> t;
    for (int v : n.outputs) t.push_back(g.type(v));
    return t;
  };
  std::function<absl::StatusOr<int>(int)> copy_of = [&](int v) -> absl::StatusOr<int> {
    auto it = recomputed.find(v);
    if (it != recomputed.end()) return it->second;
    const Node& n = nodes[g.value(v).producer];
    if (!recomputable(n)) return v;
    Node c = n;
    c.phase = graph::Phase::kBackward;
    for (int& in : c.inputs) {
      SG_ASSIGN_OR_RETURN(in, copy_of(in));
    }
    for (size_t k = 0; k < c.outputs.size(); ++k) {
      recomputed[n.outputs[k]] = next_id;
      c.outputs[k] = next_id++;
    }
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(c, types_of(n)));
    return recomputed.at(v);
  };
  for (const Node& n : nodes) {
    Node c = n;
    if (n.phase == graph::Phase::kBackward) {
      for (int& in : c.inputs) {
        SG_ASSIGN_OR_RETURN(in, copy_of(in));
      }
    }
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(c, types_of(n)));
  }
  for (const graph::GraphOutput& o : g.outputs()) out.AddOutput(o.name, o.value);
  SG_RETURN_IF_ERROR(graph::Verify(out));
  return out;
}

}  // namespace sg::compiler
