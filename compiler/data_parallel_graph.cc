#include "compiler/data_parallel_graph.h"

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compiler/training_graph.h"
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

// The input source a value is a reshape of, or "".
std::string InputSourceOf(const Graph& g, int v) {
  while (g.has_value(v)) {
    const Node& n = g.nodes()[g.value(v).producer];
    if (n.op == OpKind::kInput) return graph::AttrString(n, "name");
    if (n.op != OpKind::kReshape) return "";
    v = n.inputs[0];
  }
  return "";
}

// The optimizer nodes (adamw, grad_norm), dead in the split graph, and AdamW's hyperparameters and
// updated parameters into `dp`.
absl::Status CollectOptimizer(const Graph& train, DataParallelGraph* dp, std::map<int, int>* param_of_value,
                              std::set<int>* dead) {
  const auto& nodes = train.nodes();
  bool any_adamw = false;
  for (int i = 0; i < int(nodes.size()); ++i) {
    const Node& n = nodes[i];
    if (n.op == OpKind::kGradNorm) {
      dp->max_grad_norm = graph::AttrFloat(n, "max_norm");
      dead->insert(i);
    }
    if (n.op != OpKind::kAdamW) continue;
    any_adamw = true;
    dead->insert(i);
    const Node& p = nodes[train.value(n.inputs[0]).producer];
    if (p.op != OpKind::kParameter) {
      return absl::InvalidArgumentError(absl::StrCat("adamw node ", i, " updates a ", graph::OpName(p.op),
                                                     ", expected a parameter"));
    }
    (*param_of_value)[n.inputs[0]] = int(dp->params.size());
    dp->params.push_back({graph::AttrString(p, "name"), graph::AttrFloat(n, "weight_decay")});
    dp->beta1 = graph::AttrFloat(n, "beta1");
    dp->beta2 = graph::AttrFloat(n, "beta2");
    dp->eps = graph::AttrFloat(n, "eps");
  }
  if (!any_adamw) return absl::InvalidArgumentError("SplitOptimizer: the graph has no adamw nodes");
  return absl::OkStatus();
}

// Kept outputs: the loss and every updated parameter's gradient. Also the loss's ignore_index and
// targets input into `dp`.
absl::StatusOr<std::vector<graph::GraphOutput>> KeptOutputs(const Graph& train, const std::string& loss,
                                                            DataParallelGraph* dp) {
  const auto& nodes = train.nodes();
  const int loss_index = train.FindOutput(loss);
  if (loss_index < 0) return absl::InvalidArgumentError(absl::StrCat("SplitOptimizer: no output '", loss, "'"));
  const int loss_value = train.outputs()[loss_index].value;
  const Node& loss_node = nodes[train.value(loss_value).producer];
  if (loss_node.op != OpKind::kSoftmaxCrossEntropy && loss_node.op != OpKind::kNllLoss) {
    return absl::UnimplementedError(absl::StrCat(
        "distributed training needs the loss '", loss, "' to be a softmax_cross_entropy or nll_loss output "
        "(to normalize by the global token count), found ", graph::OpName(loss_node.op)));
  }
  dp->ignore_index = graph::AttrInt(loss_node, "ignore_index");
  dp->targets = InputSourceOf(train, loss_node.inputs[1]);
  if (dp->targets.empty()) {
    return absl::UnimplementedError("distributed training needs the loss targets to be a graph input (or a reshape of one)");
  }
  std::vector<graph::GraphOutput> kept = {{loss, loss_value}};
  for (const DataParallelParam& p : dp->params) {
    const int o = train.FindOutput("grad:" + p.name);
    if (o < 0) return absl::InvalidArgumentError(absl::StrCat("SplitOptimizer: no output 'grad:", p.name, "'"));
    kept.push_back(train.outputs()[o]);
  }
  return kept;
}

// Dead code: the optimizer nodes and whatever only they read (moments, step, lr, ...). A
// parameter nothing live reads goes too: the full-size AdamW moments would otherwise stay in the
// lowered program's state (8 bytes per parameter on every rank, beside the runtime's shards).
void MarkDead(const Graph& train, const std::vector<graph::GraphOutput>& kept,
              const std::map<int, int>& param_of_value, std::set<int>* dead) {
  const auto& nodes = train.nodes();
  std::vector<int> uses(train.num_value_ids(), 0);
  for (const graph::GraphOutput& o : kept) ++uses[o.value];
  for (int i = int(nodes.size()) - 1; i >= 0; --i) {
    const Node& n = nodes[i];
    bool live = !dead->count(i);
    if (live && !(n.op == OpKind::kParameter && param_of_value.count(n.outputs[0]))) {
      live = false;
      for (int v : n.outputs) live = live || uses[v] > 0;
    }
    if (!live) {
      dead->insert(i);
      continue;
    }
    for (int v : n.inputs) ++uses[v];
  }
}

// The inputs of the copy of live node `n`: the loss backward's constant seed becomes the
// kLossScaleName input (counted in `seeds`), an updated parameter read outside the forward its
// non-trainable "<p>" + kBackwardSuffix copy (one per parameter, in `bwd_copy`).
std::vector<Value> CopyInputs(const Graph& train, const Node& n, const std::map<int, int>& param_of_value,
                              const std::vector<Value>& map, Builder& b, std::map<int, Value>* bwd_copy,
                              Value* loss_scale, int* seeds) {
  const auto& nodes = train.nodes();
  std::vector<Value> ins;
  for (int k = 0; k < int(n.inputs.size()); ++k) {
    const int v = n.inputs[k];
    if (IsLossBackward(n.op) && k == 0 && nodes[train.value(v).producer].op == OpKind::kFill) {
      if (!loss_scale->valid()) *loss_scale = b.Input(kLossScaleName, DType::kF32, {});
      ins.push_back(*loss_scale);
      ++*seeds;
      continue;
    }
    auto p = param_of_value.find(v);
    if (p != param_of_value.end() && n.phase != graph::Phase::kForward) {
      auto c = bwd_copy->find(v);
      if (c == bwd_copy->end()) {
        const Node& src = nodes[train.value(v).producer];
        c = bwd_copy->emplace(v, b.Parameter(graph::AttrString(src, "name") + kBackwardSuffix,
                                             graph::AttrDType(src, "dtype"), graph::AttrShape(src, "shape"),
                                             /*trainable=*/false)).first;
      }
      ins.push_back(c->second);
      continue;
    }
    ins.push_back(map[v]);
  }
  return ins;
}

// The live nodes of `train` copied in order into a new graph with the `kept` outputs.
absl::StatusOr<Graph> CopyLive(const Graph& train, const std::set<int>& dead, const std::map<int, int>& param_of_value,
                               const std::vector<graph::GraphOutput>& kept) {
  const auto& nodes = train.nodes();
  Graph start;
  for (const graph::SymbolInfo& s : train.symbols()) SG_RETURN_IF_ERROR(start.AddSymbol(s));
  Builder b(std::move(start));
  std::vector<Value> map(train.num_value_ids());
  std::map<int, Value> bwd_copy;
  Value loss_scale;
  int seeds = 0;
  for (int i = 0; i < int(nodes.size()); ++i) {
    const Node& n = nodes[i];
    if (dead.count(i)) continue;
    auto scope = b.EnterScope(n.scope);
    b.set_phase(n.phase);
    if (Value v; CopySourceNode(b, n, &v)) {
      map[n.outputs[0]] = v;  // a parameter or input
      continue;
    }
    std::vector<Value> ins = CopyInputs(train, n, param_of_value, map, b, &bwd_copy, &loss_scale, &seeds);
    std::vector<Value> outs = b.Emit(n.op, ins, n.attrs);
    SG_RETURN_IF_ERROR(b.status());
    for (size_t k = 0; k < outs.size(); ++k) map[n.outputs[k]] = outs[k];
  }
  if (seeds != 1) {
    return absl::UnimplementedError(absl::StrCat("distributed training expects exactly one constant seed into the "
                                                 "loss's backward, found ", seeds));
  }
  for (const graph::GraphOutput& o : kept) b.Output(o.name, map[o.value]);
  return b.Finish();
}

}  // namespace

std::string UnitOf(const std::string& param) {
  std::vector<std::string> parts = absl::StrSplit(param, '.');
  if (parts.size() >= 2 && parts[0] == "layers") return absl::StrCat(parts[0], ".", parts[1]);
  return parts[0];
}

absl::StatusOr<DataParallelGraph> SplitOptimizer(const Graph& train, const std::string& loss) {
  DataParallelGraph dp;
  std::map<int, int> param_of_value;  // parameter value id -> index in dp.params
  std::set<int> dead;
  SG_RETURN_IF_ERROR(CollectOptimizer(train, &dp, &param_of_value, &dead));
  SG_ASSIGN_OR_RETURN(const std::vector<graph::GraphOutput> kept, KeptOutputs(train, loss, &dp));
  MarkDead(train, kept, param_of_value, &dead);
  SG_ASSIGN_OR_RETURN(dp.graph, CopyLive(train, dead, param_of_value, kept));
  return dp;
}

absl::StatusOr<DataParallelGraph> GatherInComputeDType(DataParallelGraph dp) {
  const Graph& g = dp.graph;
  const auto& nodes = g.nodes();
  const std::vector<std::vector<int>> users = g.Users();
  std::vector<bool> is_output(size_t(g.num_value_ids()), false);
  for (const graph::GraphOutput& o : g.outputs()) is_output[size_t(o.value)] = true;
  auto half = [](DType t) { return t == DType::kBF16 || t == DType::kF16; };
  // The 16-bit dtype every reader of source value `v` casts it to, or f32 when some reader is
  // not such a cast (or the source is not f32).
  auto read_as = [&](int v) {
    if (g.type(v).dtype != DType::kF32 || is_output[size_t(v)] || users[size_t(v)].empty()) return DType::kF32;
    DType to = DType::kF32;
    for (int u : users[size_t(v)]) {
      const Node& n = nodes[size_t(u)];
      if (n.op != OpKind::kCast || is_output[size_t(n.outputs[0])]) return DType::kF32;
      const DType t = g.type(n.outputs[0]).dtype;
      if (!half(t) || (to != DType::kF32 && t != to)) return DType::kF32;
      to = t;
    }
    return to;
  };
  // Per (unit, direction): the common dtype, f32 as soon as one source disagrees.
  std::map<std::string, DType> unit_dtype;
  std::map<int, std::string> key_of;  // source value -> its (unit, direction) key
  for (const DataParallelParam& p : dp.params) {
    for (const bool bwd : {false, true}) {
      const int v = g.FindSource(bwd ? p.name + kBackwardSuffix : p.name);
      if (v < 0) continue;
      const std::string key = absl::StrCat(UnitOf(p.name), bwd ? kBackwardSuffix : "");
      key_of[v] = key;
      const DType t = read_as(v);
      auto [it, first] = unit_dtype.emplace(key, t);
      if (!first && it->second != t) it->second = DType::kF32;
    }
  }
  std::map<int, DType> rewritten;  // old source value -> its new dtype
  for (const auto& [v, key] : key_of) {
    if (unit_dtype[key] != DType::kF32) rewritten[v] = unit_dtype[key];
  }
  if (rewritten.empty()) return dp;

  Graph start;
  for (const graph::SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(start.AddSymbol(s));
  Builder b(std::move(start));
  std::vector<Value> map(size_t(g.num_value_ids()));
  for (const Node& n : nodes) {
    auto scope = b.EnterScope(n.scope);
    b.set_phase(n.phase);
    if (n.op == OpKind::kParameter && rewritten.count(n.outputs[0])) {
      map[size_t(n.outputs[0])] = b.Parameter(graph::AttrString(n, "name"), rewritten[n.outputs[0]],
                                              graph::AttrShape(n, "shape"), graph::AttrBool(n, "trainable"));
      continue;
    }
    if (Value v; CopySourceNode(b, n, &v)) {
      map[size_t(n.outputs[0])] = v;
      continue;
    }
    if (n.op == OpKind::kCast && rewritten.count(n.inputs[0])) {
      map[size_t(n.outputs[0])] = map[size_t(n.inputs[0])];  // the source is already in this dtype
      continue;
    }
    std::vector<Value> ins;
    for (int v : n.inputs) ins.push_back(map[size_t(v)]);
    std::vector<Value> outs = b.Emit(n.op, ins, n.attrs);
    SG_RETURN_IF_ERROR(b.status());
    for (size_t k = 0; k < outs.size(); ++k) map[size_t(n.outputs[k])] = outs[k];
  }
  for (const graph::GraphOutput& o : g.outputs()) b.Output(o.name, map[size_t(o.value)]);
  SG_ASSIGN_OR_RETURN(dp.graph, b.Finish());
  return dp;
}

std::vector<int64_t> CountTargetsPerPart(const TensorView& targets, int64_t ignore_index, int64_t parts) {
  const int64_t per = targets.numel() / parts;
  std::vector<int64_t> counts(size_t(parts), 0);
  for (int64_t i = 0; i < parts * per; ++i) {
    const int64_t id = targets.dtype() == DType::kI64 ? static_cast<const int64_t*>(targets.raw())[i]
                                                      : static_cast<const int32_t*>(targets.raw())[i];
    counts[size_t(i / per)] += id != ignore_index;
  }
  return counts;
}

float TokenWeightedLoss(const std::vector<float>& losses, const std::vector<int64_t>& counts) {
  double total = 0, sum = 0;
  for (size_t r = 0; r < losses.size() && r < counts.size(); ++r) {
    sum += double(losses[r]) * double(counts[r]);
    total += double(counts[r]);
  }
  return total > 0 ? float(sum / total) : 0.f;
}

}  // namespace sg::compiler
