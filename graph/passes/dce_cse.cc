// Dead-code and common-subexpression elimination.
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "graph/passes/passes.h"
#include "kernels/core/status.h"

namespace sg::graph {

absl::StatusOr<Graph> Dce(const Graph& g) {
  SG_RETURN_IF_ERROR(Verify(g));
  std::vector<bool> live(g.num_value_ids(), false);
  for (const GraphOutput& o : g.outputs()) live[o.value] = true;
  std::vector<bool> keep(g.nodes().size(), false);
  for (int i = int(g.nodes().size()) - 1; i >= 0; --i) {
    const Node& n = g.nodes()[i];
    bool k = n.op == OpKind::kParameter || n.op == OpKind::kInput;
    for (int o : n.outputs) k |= live[o];
    if (!k) continue;
    keep[i] = true;
    for (int in : n.inputs) live[in] = true;
  }
  Graph out;
  for (const SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(out.AddSymbol(s));
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!keep[i]) continue;
    const Node& n = g.nodes()[i];
    std::vector<Type> types;
    for (int o : n.outputs) types.push_back(g.type(o));
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(n, types));
  }
  out.mutable_outputs() = g.outputs();
  SG_RETURN_IF_ERROR(Verify(out));
  return out;
}

absl::StatusOr<Graph> Cse(const Graph& g) {
  SG_RETURN_IF_ERROR(Verify(g));
  std::vector<int> replace(g.num_value_ids());
  for (int i = 0; i < g.num_value_ids(); ++i) replace[i] = i;
  absl::flat_hash_map<std::string, const Node*> seen;
  Graph out;
  for (const SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(out.AddSymbol(s));
  for (const Node& old : g.nodes()) {
    Node n = old;
    for (int& in : n.inputs) in = replace[in];
    if (n.op != OpKind::kParameter && n.op != OpKind::kInput) {
      std::string key = OpName(n.op);
      for (int in : n.inputs) absl::StrAppend(&key, " %", in);
      for (const auto& [k, v] : n.attrs) absl::StrAppend(&key, " ", k, "=", AttrToString(v));
      auto [it, fresh] = seen.emplace(key, &old);
      if (!fresh) {
        for (size_t k = 0; k < n.outputs.size(); ++k) replace[n.outputs[k]] = it->second->outputs[k];
        continue;
      }
    }
    std::vector<Type> types;
    for (int o : n.outputs) types.push_back(g.type(o));
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(std::move(n), types));
  }
  for (const GraphOutput& o : g.outputs()) out.AddOutput(o.name, replace[o.value]);
  SG_RETURN_IF_ERROR(Verify(out));
  return out;
}

}  // namespace sg::graph
