#include "compiler/pipeline/graph_split.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/autodiff.h"
#include "graph/ops.h"
#include "graph/passes/passes.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::Phase;

constexpr int kFree = -1;  // copied into every stage that uses it

// Layer index of "layers.<i>.*", or -1.
int64_t LayerOf(const std::string& name) {
  if (!absl::StartsWith(name, "layers.")) return -1;
  const std::string rest = name.substr(7);
  int64_t i = -1;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find('.')), &i)) return -1;
  return i;
}

std::string Describe(const Graph& g, int v) {
  const Node& n = g.nodes()[size_t(g.value(v).producer)];
  return absl::StrCat("%", v, " (", graph::OpName(n.op), " @", n.scope, ")");
}

// The gradient of h_out that autodiff derives from "vjp" is `cotangent` times a broadcast one:
// read "cotangent" directly instead and drop the helper nodes, so the stage program holds only
// the model's ops (a mul/reduce_sum of the size of the activations, without a CUDA kernel, gone).
absl::StatusOr<Graph> SeedWithCotangent(Graph g) {
  const int cot = g.FindSource("cotangent");
  if (cot < 0) return g;
  int grad_h = -1, readers = 0;
  for (const Node& n : g.nodes()) {
    if (n.phase == Phase::kBackward && n.op == OpKind::kMul &&
        std::find(n.inputs.begin(), n.inputs.end(), cot) != n.inputs.end()) {
      grad_h = n.outputs[0];
      ++readers;
    }
  }
  if (readers != 1 || g.type(grad_h) != g.type(cot)) return g;
  for (Node& n : g.mutable_nodes()) {
    for (int& v : n.inputs) {
      if (v == grad_h) v = cot;
    }
  }
  auto& outs = g.mutable_outputs();
  outs.erase(std::remove_if(outs.begin(), outs.end(), [](const graph::GraphOutput& o) { return o.name == "vjp"; }),
             outs.end());
  for (graph::GraphOutput& o : outs) {
    if (o.value == grad_h) o.value = cot;
  }
  return graph::Dce(g);
}

// The number of layers: one more than the highest "layers.<i>" parameter.
int64_t CountLayers(const std::vector<Node>& nodes) {
  int64_t n_layers = 0;
  for (const Node& n : nodes) {
    if (n.op == OpKind::kParameter) n_layers = std::max(n_layers, LayerOf(graph::AttrString(n, "name")) + 1);
  }
  return n_layers;
}

// Stage of every node (kFree for sources other than parameters and what reads only them).
// `param_stage`: the stage of each parameter node read by some node.
std::vector<int> AssignStages(const Graph& g, const std::vector<int>& layer_stage, int stages,
                              std::map<int, int>* param_stage) {
  const std::vector<Node>& nodes = g.nodes();
  std::vector<int> node_stage(nodes.size(), kFree);
  bool seen_layer = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == OpKind::kInput || n.op == OpKind::kFill) continue;
    int s = kFree;
    for (int v : n.inputs) {
      const int p = g.value(v).producer;
      if (nodes[size_t(p)].op == OpKind::kParameter) {
        const int64_t layer = LayerOf(graph::AttrString(nodes[size_t(p)], "name"));
        if (layer >= 0) seen_layer = true;
        const int ps = layer >= 0 ? layer_stage[size_t(layer)] : (seen_layer ? stages - 1 : 0);
        auto [it, added] = param_stage->emplace(p, ps);
        s = std::max(s, it->second);
      } else {
        s = std::max(s, node_stage[size_t(p)]);
      }
    }
    if (n.op == OpKind::kParameter) continue;  // placed by its readers
    node_stage[i] = s;
  }
  for (const auto& [p, ps] : *param_stage) node_stage[size_t(p)] = ps;
  return node_stage;
}

// A parameter read on a later stage than its own (tied weights) cannot be split.
absl::Status CheckUntiedParameters(const Graph& g, const std::vector<int>& node_stage,
                                   const std::map<int, int>& param_stage) {
  const std::vector<Node>& nodes = g.nodes();
  const std::vector<std::vector<int>> users = g.Users();
  for (const auto& [p, ps] : param_stage) {
    for (int u : users[size_t(nodes[size_t(p)].outputs[0])]) {
      if (node_stage[size_t(u)] != ps) {
        return absl::UnimplementedError(absl::StrCat("pipeline: parameter '", graph::AttrString(nodes[size_t(p)], "name"),
                                                     "' is read on stages ", ps, " and ", node_stage[size_t(u)],
                                                     " (tied weights are not split across stages)"));
      }
    }
  }
  return absl::OkStatus();
}

// The boundary values: produced on s, read on a later stage; exactly one per boundary, read on
// s + 1 only.
absl::StatusOr<std::vector<int>> FindCuts(const Graph& g, const std::vector<int>& node_stage, int stages) {
  const std::vector<Node>& nodes = g.nodes();
  std::vector<int> cut(size_t(stages), -1);  // cut[s]: the value leaving stage s
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (int v : nodes[i].inputs) {
      const int ps = node_stage[size_t(g.value(v).producer)];
      const int us = node_stage[i];
      if (ps == kFree || ps == us || nodes[size_t(g.value(v).producer)].op == OpKind::kParameter) continue;
      if (us != ps + 1) {
        return absl::UnimplementedError(absl::StrCat("pipeline: value ", Describe(g, v), " of stage ", ps,
                                                     " is read on stage ", us, " (it would skip a stage)"));
      }
      if (cut[size_t(ps)] >= 0 && cut[size_t(ps)] != v) {
        return absl::UnimplementedError(absl::StrCat("pipeline: stage ", ps, " -> ", us, " would carry two values, ",
                                                     Describe(g, cut[size_t(ps)]), " and ", Describe(g, v),
                                                     " (only the residual stream may cross)"));
      }
      cut[size_t(ps)] = v;
    }
  }
  for (int s = 0; s + 1 < stages; ++s) {
    if (cut[size_t(s)] < 0) return absl::UnimplementedError(absl::StrCat("pipeline: nothing flows from stage ", s));
  }
  return cut;
}

// Nodes of stage s and the free nodes they (transitively) read.
std::vector<bool> StageNodes(const Graph& g, const std::vector<int>& node_stage, int s) {
  const std::vector<Node>& nodes = g.nodes();
  std::vector<bool> take(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    const bool mine = node_stage[i] == s && nodes[i].op != OpKind::kParameter;
    if (!mine && !take[i]) continue;
    take[i] = true;
    for (int v : nodes[i].inputs) {
      const int p = g.value(v).producer;
      if (node_stage[size_t(p)] == kFree || nodes[size_t(p)].op == OpKind::kParameter) take[size_t(p)] = true;
    }
  }
  return take;
}

// Stage s's forward graph: the cut value entering it as kStageInput (after the first stage), the
// nodes `take` selects, and as output the cut value leaving it (kStageOutput) or, last, the loss.
absl::StatusOr<StageGraph> BuildStage(const Graph& g, const std::vector<bool>& take, const std::vector<int>& cut,
                                      const StageSpec& spec, int s, int stages, const std::string& loss,
                                      int loss_value) {
  const std::vector<Node>& nodes = g.nodes();
  StageGraph sg;
  sg.spec = spec;
  Graph& f = sg.forward;
  for (const graph::SymbolInfo& sym : g.symbols()) SG_RETURN_IF_ERROR(f.AddSymbol(sym));
  std::map<int, int> remap;  // old value id -> new
  if (s > 0) {
    const int v = cut[size_t(s - 1)];
    const graph::Type& t = g.type(v);
    graph::Attrs a = {{"name", std::string(kStageInput)}, {"dtype", t.dtype}, {"shape", t.shape}};
    remap[v] = f.AddNode(OpKind::kInput, {}, a, {t})[0];
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!take[i]) continue;
    const Node& n = nodes[i];
    std::vector<int> ins;
    for (int v : n.inputs) ins.push_back(remap.at(v));
    std::vector<graph::Type> types;
    for (int v : n.outputs) types.push_back(g.type(v));
    std::vector<int> outs = f.AddNode(n.op, ins, n.attrs, types, n.scope, n.phase);
    for (size_t k = 0; k < outs.size(); ++k) remap[n.outputs[k]] = outs[k];
    if (n.op == OpKind::kParameter && graph::AttrBool(n, "trainable")) {
      sg.parameters.push_back(graph::AttrString(n, "name"));
    }
  }
  if (s + 1 < stages) {
    f.AddOutput(kStageOutput, remap.at(cut[size_t(s)]));
  } else {
    f.AddOutput(loss, remap.at(loss_value));
  }
  SG_RETURN_IF_ERROR(graph::Verify(f));
  return sg;
}

}  // namespace

absl::StatusOr<std::vector<StageGraph>> SplitIntoStages(const Graph& g, int stages, const std::string& loss) {
  SG_RETURN_IF_ERROR(graph::Verify(g));
  const std::vector<Node>& nodes = g.nodes();
  const int loss_out = g.FindOutput(loss);
  SG_CHECK_ARG(loss_out >= 0, "pipeline: the graph has no output '", loss, "'");
  const int64_t n_layers = CountLayers(nodes);
  SG_ASSIGN_OR_RETURN(std::vector<StageSpec> specs, SplitLayers(n_layers, stages));
  std::vector<int> layer_stage(size_t(n_layers), 0);
  for (const StageSpec& s : specs) {
    for (int64_t l = s.first_layer; l < s.end_layer; ++l) layer_stage[size_t(l)] = s.stage;
  }
  std::map<int, int> param_stage;  // parameter node -> stage
  const std::vector<int> node_stage = AssignStages(g, layer_stage, stages, &param_stage);
  SG_RETURN_IF_ERROR(CheckUntiedParameters(g, node_stage, param_stage));
  const int loss_value = g.outputs()[size_t(loss_out)].value;
  if (node_stage[size_t(g.value(loss_value).producer)] != stages - 1) {
    return absl::UnimplementedError("pipeline: the loss is not computed on the last stage");
  }
  SG_ASSIGN_OR_RETURN(const std::vector<int> cut, FindCuts(g, node_stage, stages));
  std::vector<StageGraph> out;
  for (int s = 0; s < stages; ++s) {
    SG_ASSIGN_OR_RETURN(StageGraph sg, BuildStage(g, StageNodes(g, node_stage, s), cut, specs[size_t(s)], s, stages,
                                                  loss, loss_value));
    out.push_back(std::move(sg));
  }
  return out;
}

absl::StatusOr<Graph> StageTrainingGraph(const StageGraph& stage) {
  Graph g = stage.forward;
  graph::BackwardOptions bo;
  if (!stage.spec.last()) {
    const int h = g.outputs()[0].value;
    const graph::Type t = g.type(h);
    graph::Attrs a = {{"name", std::string("cotangent")}, {"dtype", t.dtype}, {"shape", t.shape}};
    const int cot = g.AddNode(OpKind::kInput, {}, a, {t})[0];
    const int prod = g.AddNode(OpKind::kMul, {h, cot}, {}, {t})[0];
    graph::IntList dims;
    for (int d = 0; d < t.rank(); ++d) dims.push_back(d);
    graph::Attrs ra = {{"dims", dims}};
    SG_ASSIGN_OR_RETURN(std::vector<graph::Type> rt, graph::InferTypes(OpKind::kReduceSum, {t}, ra));
    g.AddOutput("vjp", g.AddNode(OpKind::kReduceSum, {prod}, ra, rt)[0]);
    bo.loss = "vjp";
  } else {
    bo.loss = g.outputs()[0].name;
  }
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kParameter && graph::AttrBool(n, "trainable")) bo.wrt.push_back(n.outputs[0]);
  }
  if (!stage.spec.first()) bo.wrt.push_back(g.FindSource(kStageInput));
  SG_ASSIGN_OR_RETURN(graph::BackwardResult r, graph::AppendBackward(g, bo));
  SG_RETURN_IF_ERROR(graph::Verify(r.graph));
  return std::move(r.graph);
}

absl::StatusOr<Graph> PrepareStageStep(const StageGraph& stage, bool fuse) {
  StageGraph s = stage;
  if (fuse) {
    SG_ASSIGN_OR_RETURN(s.forward, graph::FuseForKernels(s.forward));
  }
  SG_ASSIGN_OR_RETURN(Graph g, StageTrainingGraph(s));
  SG_ASSIGN_OR_RETURN(g, SeedWithCotangent(std::move(g)));
  if (fuse) {
    SG_ASSIGN_OR_RETURN(g, graph::FuseForKernels(g));
  }
  SG_ASSIGN_OR_RETURN(g, graph::Cse(g));
  return graph::Dce(g);
}

}  // namespace sg::compiler
