#include "compiler/wgrad_stream.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"

namespace sg::compiler {

std::vector<WgradJoin> ChooseWgradJoins(const graph::Graph& g, const std::vector<int>& root,
                                        const std::map<std::string, int>& read_at, int join_matmuls) {
  const auto& nodes = g.nodes();
  const int nn = int(nodes.size());
  std::set<int> grads;
  std::map<int, int> read;  // gradient root -> the first node before which a runtime step reads it
  for (const graph::GraphOutput& o : g.outputs()) {
    if (!absl::StartsWith(o.name, "grad:")) continue;
    grads.insert(root[o.value]);
    if (auto it = read_at.find(o.name); it != read_at.end()) {
      auto [at, fresh] = read.insert({root[o.value], it->second});
      if (!fresh) at->second = std::min(at->second, it->second);
    }
  }
  std::vector<WgradJoin> joins;
  for (int i = 0; i < nn; ++i) {
    const graph::Node& n = nodes[i];
    if (n.op != graph::OpKind::kMatmul || n.phase != graph::Phase::kBackward || !grads.count(root[n.outputs[0]])) {
      continue;
    }
    const int out = root[n.outputs[0]];
    auto touches = [&](const std::vector<int>& values) {
      return std::any_of(values.begin(), values.end(), [&](int v) { return root[v] == out; });
    };
    int join = -1;
    for (int k = i + 1, matmuls = 0; k < nn; ++k) {
      const graph::Node& m = nodes[k];
      if (touches(m.inputs) || touches(m.outputs) || m.phase != graph::Phase::kBackward ||
          (m.op == graph::OpKind::kMatmul && ++matmuls == join_matmuls)) {
        join = k;
        break;
      }
    }
    if (auto it = read.find(out); it != read.end() && (join < 0 || it->second - 1 < join)) join = it->second - 1;
    if (join > i) joins.push_back({i, join});
  }
  return joins;
}

}  // namespace sg::compiler
