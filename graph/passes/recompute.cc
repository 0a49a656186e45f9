// Activation recompute: forward values read by the backward are either kept alive from the
// forward or recomputed by clones placed right before their first backward use.
#include <functional>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "graph/passes/passes.h"
#include "kernels/core/status.h"

namespace sg::graph {
namespace {

// "layers.3" for scope "layers.3.attention.wq", "" outside the transformer layers.
std::string LayerOf(const std::string& scope) {
  if (!absl::StartsWith(scope, "layers.")) return "";
  const size_t dot = scope.find('.', 7);
  return scope.substr(0, dot);
}

bool Expensive(OpKind op) {
  switch (op) {
    case OpKind::kMatmul:
    case OpKind::kAttention:
    case OpKind::kEmbedding:
    case OpKind::kSoftmaxCrossEntropy:
    case OpKind::kLogSoftmax:
    case OpKind::kNllLoss:
      return true;
    default:
      return false;
  }
}

// Whether forward node i may be recomputed under `policy`. Both policies keep every value that
// crosses a transformer-layer boundary (read by a forward node of another layer, or a graph
// output): recomputing the residual stream would rebuild it from the embedding on. Full recompute
// draws the boundary at the residual add fused into the next layer's norm (ResidualEntry), so the
// two values that add reads (the attention sum and the FFN output) are recomputed and only their
// sum is kept: one [batch, seq, dim] tensor per layer instead of two. Selective
// recompute takes a cheap node only when the backward keeps all its inputs anyway (sources, or
// values a backward node reads): then recomputing frees its output and keeps nothing new
// (rmsnorm of a kept sum, swiglu of the kept w1/w3 outputs), where recomputing rope from the
// matmul output would only trade one stored tensor for another of the same size.
int LayerIndex(const std::string& layer) {
  int i = -1;
  return layer.size() > 7 && absl::SimpleAtoi(layer.substr(7), &i) ? i : -1;
}

// Under full recompute, an add_rmsnorm in layer L reading a value of another layer (not the
// embedding: outside the layers) is the residual add of the layer before, fused into L's first norm: its sum is the residual stream entering L,
// the one value per layer full recompute keeps (its norm output is rebuilt from it, as below).
bool ResidualEntry(const Graph& g, const Node& n, const std::string& layer) {
  if (n.op != OpKind::kAddRmsNorm || layer.empty()) return false;
  for (int k = 0; k < 2; ++k) {
    const Node& p = g.nodes()[g.value(n.inputs[k]).producer];
    const std::string from = LayerOf(p.scope);
    if (p.phase == Phase::kForward && !from.empty() && from != layer) return true;
  }
  return false;
}

std::vector<bool> Recomputable(const Graph& g, RecomputePolicy policy, int swiglu_layers) {
  const auto& nodes = g.nodes();
  std::vector<bool> r(nodes.size(), false);
  if (policy == RecomputePolicy::kNone) return r;
  const auto users = g.Users();
  std::vector<bool> is_output(g.num_value_ids(), false);
  for (const GraphOutput& o : g.outputs()) is_output[o.value] = true;
  std::vector<bool> kept_for_backward(g.num_value_ids(), false);
  for (const Node& n : nodes) {
    if (n.phase == Phase::kForward) continue;
    for (int in : n.inputs) kept_for_backward[in] = true;
  }
  auto inputs_kept = [&](const Node& n) {
    for (int in : n.inputs) {
      if (!kept_for_backward[in] && !Schema(nodes[g.value(in).producer].op).is_source) return false;
    }
    return true;
  };
  // Users come after their producers: deciding from the last node back, a node's users outside
  // its layer are decided before it.
  for (size_t i = nodes.size(); i-- > 0;) {
    const Node& n = nodes[i];
    if (n.phase != Phase::kForward || Schema(n.op).is_source) continue;
    const std::string layer = LayerOf(n.scope);
    if (policy == RecomputePolicy::kFull && (layer.empty() || ResidualEntry(g, n, layer))) continue;
    if (policy == RecomputePolicy::kSelective && (Expensive(n.op) || !inputs_kept(n))) continue;
    if (policy == RecomputePolicy::kSelective && n.op == OpKind::kSwiGLU && swiglu_layers >= 0 &&
        !(LayerIndex(layer) >= 0 && LayerIndex(layer) < swiglu_layers)) {
      continue;
    }
    // Not a layer-boundary value: no forward use outside this layer, or (full recompute) only uses
    // by nodes that are not recomputed, so the backward reads the value only where it is rebuilt
    // (a kept add_rmsnorm's backward reads its own sum, not its inputs).
    bool inside = true;
    for (int o : n.outputs) {
      inside &= !is_output[o];
      for (int u : users[o]) {
        if (nodes[u].phase != Phase::kForward || LayerOf(nodes[u].scope) == layer) continue;
        inside &= policy == RecomputePolicy::kFull && !r[size_t(u)];
      }
    }
    r[i] = inside;
  }
  return r;
}

// add_rmsnorm's outputs are (y, h) with y = rmsnorm(h): when h is kept (a layer boundary), y can be
// rebuilt from it by a plain rmsnorm, the same math on the same value. Under both policies: under
// full recompute the add_rmsnorm whose h crosses into the next layer (a Llama block's ffn_norm) is
// not recomputed, and keeping its y too would hold a third [batch, seq, dim] tensor per layer.
bool NormOutputOfKeptSum(const Graph& g, const std::vector<bool>& recomputable, RecomputePolicy policy, int v) {
  if (policy == RecomputePolicy::kNone) return false;
  const int p = g.value(v).producer;
  const Node& n = g.nodes()[p];
  return n.op == OpKind::kAddRmsNorm && n.phase == Phase::kForward && !recomputable[p] && n.outputs[0] == v;
}

}  // namespace

absl::string_view RecomputePolicyName(RecomputePolicy p) {
  switch (p) {
    case RecomputePolicy::kNone: return "none";
    case RecomputePolicy::kSelective: return "selective";
    case RecomputePolicy::kFull: return "full";
  }
  return "?";
}

absl::StatusOr<Graph> ApplyRecompute(const Graph& g, RecomputePolicy policy, int* recomputed_nodes,
                                     int swiglu_layers) {
  SG_RETURN_IF_ERROR(Verify(g));
  if (recomputed_nodes) *recomputed_nodes = 0;
  bool has_backward = false;
  for (const Node& n : g.nodes()) has_backward |= n.phase == Phase::kBackward;
  if (!has_backward) {
    return absl::InvalidArgumentError("recompute: the graph has no backward nodes; run AppendBackward first");
  }
  const std::vector<bool> recomputable = Recomputable(g, policy, swiglu_layers);
  Graph out;
  for (const SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(out.AddSymbol(s));
  int next_id = g.num_value_ids();
  std::map<int, int> clone_of;  // forward value id -> id of its recomputed copy
  int clones = 0;

  // Returns the id a backward node should read for forward value v, cloning its producer (and
  // recursively the producer's recomputable inputs) on first use.
  std::function<absl::StatusOr<int>(int)> Get = [&](int v) -> absl::StatusOr<int> {
    const int p = g.value(v).producer;
    auto it = clone_of.find(v);
    if (it != clone_of.end()) return it->second;
    if (NormOutputOfKeptSum(g, recomputable, policy, v)) {
      const Node& fused = g.nodes()[p];
      Node n;
      n.op = OpKind::kRmsNorm;
      n.inputs = {fused.outputs[1], fused.inputs[2]};
      n.attrs = fused.attrs;
      n.scope = fused.scope;
      n.phase = Phase::kBackward;
      n.outputs = {next_id};
      clone_of[v] = next_id++;
      SG_RETURN_IF_ERROR(out.AddNodeWithIds(std::move(n), {g.type(v)}));
      ++clones;
      return clone_of.at(v);
    }
    if (!recomputable[p]) return v;
    Node n = g.nodes()[p];
    for (int& in : n.inputs) {
      SG_ASSIGN_OR_RETURN(in, Get(in));
    }
    std::vector<Type> types;
    for (int& o : n.outputs) {
      types.push_back(g.type(o));
      clone_of[o] = next_id;
      o = next_id++;
    }
    n.phase = Phase::kBackward;
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(std::move(n), types));
    ++clones;
    return clone_of.at(v);
  };

  for (const Node& old : g.nodes()) {
    Node n = old;
    if (n.phase != Phase::kForward) {
      for (int& in : n.inputs) {
        SG_ASSIGN_OR_RETURN(in, Get(in));
      }
    }
    std::vector<Type> types;
    for (int o : n.outputs) types.push_back(g.type(o));
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(std::move(n), types));
  }
  out.mutable_outputs() = g.outputs();
  SG_RETURN_IF_ERROR(Verify(out));
  // Forward nodes whose only readers were backward nodes now feed nothing.
  SG_ASSIGN_OR_RETURN(Graph pruned, Dce(out));
  if (recomputed_nodes) *recomputed_nodes = clones;
  return pruned;
}

}  // namespace sg::graph
