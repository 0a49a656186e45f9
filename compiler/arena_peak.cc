// FindArenaPeak (compiler/lowering.h): the lowered program's arena at its busiest node.
#include <algorithm>
#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compiler/lowering.h"
#include "graph/ops.h"

namespace sg::compiler {
namespace {

// "layers.12.attention" -> "layers.*.attention": one group for the same buffer in every layer.
std::string AnyLayer(const std::string& s) {
  static const std::regex* layer = new std::regex(R"(layers\.[0-9]+)");
  return std::regex_replace(s, *layer, "layers.*");
}

std::string Describe(const Program& p, int v) {
  if (v < 0) return "side buffers (kernel statistics, scratch)";
  const graph::Graph& g = p.graph;
  const graph::Node& n = g.nodes()[g.value(v).producer];
  const TensorView& view = p.values[v];
  std::string what = graph::OpName(n.op);
  if (n.op == graph::OpKind::kParameter || n.op == graph::OpKind::kInput) {
    absl::StrAppend(&what, " ", AnyLayer(graph::AttrString(n, "name")));
  } else if (!n.scope.empty()) {
    absl::StrAppend(&what, " @", AnyLayer(n.scope));
  }
  if (n.phase == graph::Phase::kBackward) absl::StrAppend(&what, " (bwd)");
  if (n.outputs.size() > 1) absl::StrAppend(&what, " out ", g.value(v).output_index);
  return absl::StrCat(what, " -> ", DTypeName(view.dtype()), ShapeToString(view.shape()));
}

}  // namespace

std::string ArenaPeak::ToString(int max_groups) const {
  std::string s = absl::StrFormat("live %.3f GiB at node %d (%s):\n", live_bytes / 1073741824.0, node, node_name);
  int64_t rest = 0;
  int rest_count = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (int(i) < max_groups) {
      absl::StrAppend(&s, absl::StrFormat("  %9.1f MiB  %3d x %s\n", groups[i].bytes / 1048576.0, groups[i].count,
                                          groups[i].what));
    } else {
      rest += groups[i].bytes;
      rest_count += groups[i].count;
    }
  }
  if (rest_count > 0) absl::StrAppend(&s, absl::StrFormat("  %9.1f MiB  %3d x (the rest)\n", rest / 1048576.0, rest_count));
  return s;
}

ArenaPeak FindArenaPeak(const Program& p) {
  const MemoryPlan& plan = p.plan;
  int end = 0;
  for (int last : plan.last) end = std::max(end, last);
  std::vector<int64_t> delta(size_t(end) + 2, 0);
  for (size_t i = 0; i < plan.bytes.size(); ++i) {
    delta[size_t(plan.first[i])] += plan.bytes[i];
    delta[size_t(plan.last[i]) + 1] -= plan.bytes[i];
  }
  ArenaPeak peak;
  int64_t live = 0;
  const int num_nodes = int(p.graph.nodes().size());
  auto name = [&](int i) {
    const graph::Node& n = p.graph.nodes()[size_t(i)];
    return absl::StrCat(graph::OpName(n.op), n.scope.empty() ? "" : " @", n.scope,
                        n.phase == graph::Phase::kBackward ? " (bwd)" : "");
  };
  for (int i = 0; i <= end; ++i) {
    live += delta[size_t(i)];
    peak.live_by_node.push_back(live);
    peak.node_names.push_back(i < num_nodes ? name(i) : "end");
    if (live > peak.live_bytes) {
      peak.live_bytes = live;
      peak.node = i;
    }
  }
  if (peak.node < 0) return peak;
  if (peak.node < num_nodes) peak.node_name = name(peak.node);
  std::map<std::string, ArenaPeak::Group> by_what;
  for (size_t i = 0; i < plan.bytes.size(); ++i) {
    if (plan.first[i] > peak.node || plan.last[i] < peak.node) continue;
    const int v = i < p.slot_values.size() ? p.slot_values[i] : -1;
    std::string what = Describe(p, v);
    ArenaPeak::Group& grp = by_what[what];
    grp.what = what;
    ++grp.count;
    grp.bytes += plan.bytes[i];
  }
  for (auto& [what, grp] : by_what) peak.groups.push_back(grp);
  std::stable_sort(peak.groups.begin(), peak.groups.end(),
                   [](const ArenaPeak::Group& a, const ArenaPeak::Group& b) { return a.bytes > b.bytes; });
  return peak;
}

}  // namespace sg::compiler
