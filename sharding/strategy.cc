#include "sharding/strategy.h"

#include <map>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::sharding {
namespace {

using graph::OpKind;

std::string StripOptimizerPrefix(absl::string_view name) {
  absl::ConsumePrefix(&name, "opt.m.") || absl::ConsumePrefix(&name, "opt.v.");
  return std::string(name);
}

bool IsOptimizerState(absl::string_view name) {
  return absl::StartsWith(name, "opt.m.") || absl::StartsWith(name, "opt.v.");
}

// The tensor dim of `param` that column (N) or row (K) parallelism splits, from a matmul that reads
// it as its `b` operand; -1 when no such matmul exists.
int MatmulDim(const graph::Graph& g, int param, bool column) {
  for (const graph::Node& n : g.nodes()) {
    if (n.op != OpKind::kMatmul || n.inputs.size() < 2 || n.inputs[1] != param) continue;
    if (graph::AttrBool(n, "trans_a")) continue;
    const bool tb = graph::AttrBool(n, "trans_b");
    return column == tb ? 0 : 1;  // b[N,K] when trans_b, else b[K,N]
  }
  return -1;
}

bool ShardsParamsOn(const Strategy& s, int mesh_dim, int ndim) {
  switch (s.kind) {
    case StrategyKind::kReplicate:
    case StrategyKind::kTensorParallel: return false;
    case StrategyKind::kFsdp: return true;
    case StrategyKind::kHybridShard: return mesh_dim == ndim - 1;
    case StrategyKind::kFsdpTp: return mesh_dim != ndim - 1;
  }
  return false;
}

bool HasTpDim(const Strategy& s) {
  return s.kind == StrategyKind::kTensorParallel || s.kind == StrategyKind::kFsdpTp;
}

std::string Where(const graph::Graph& g, const graph::Node& n, int input) {
  std::string s = absl::StrCat(n.scope.empty() ? "" : n.scope + " ", graph::OpName(n.op),
                               " input ", input);
  const int v = n.inputs[input];
  const graph::Node& producer = g.nodes()[g.value(v).producer];
  if (graph::Schema(producer.op).is_source && producer.op != OpKind::kFill) {
    absl::StrAppend(&s, " (", graph::AttrString(producer, "name"), ")");
  }
  return s;
}

}  // namespace

absl::string_view StrategyName(StrategyKind k) {
  switch (k) {
    case StrategyKind::kReplicate: return "replicate";
    case StrategyKind::kFsdp: return "fsdp";
    case StrategyKind::kHybridShard: return "hybrid_shard";
    case StrategyKind::kTensorParallel: return "tp";
    case StrategyKind::kFsdpTp: return "fsdp_tp";
  }
  return "?";
}

absl::StatusOr<StrategyKind> ParseStrategy(absl::string_view name) {
  for (StrategyKind k : kAllStrategies) {
    if (name == StrategyName(k)) return k;
  }
  if (name == "ddp" || name == "none") return StrategyKind::kReplicate;
  return absl::InvalidArgumentError(absl::StrCat(
      "strategy: expected replicate (ddp), fsdp, hybrid_shard, tp or fsdp_tp, found '", name, "'"));
}

TpRole TpRoleOf(absl::string_view param_name) {
  const std::string name = StripOptimizerPrefix(param_name);
  for (absl::string_view part : absl::StrSplit(name, '.')) {
    if (part == "wq" || part == "wk" || part == "wv" || part == "w1" || part == "w3" ||
        part == "w_gate" || part == "w_up" || part == "output" || part == "lm_head") {
      return TpRole::kColumn;
    }
    if (part == "wo" || part == "w2" || part == "w_down") return TpRole::kRow;
    if (part == "tok_embeddings" || part == "embed_tokens" || part == "embedding") {
      return TpRole::kVocab;
    }
  }
  return TpRole::kReplicated;
}

absl::StatusOr<Placements> SourcePlacements(const graph::Graph& g, const graph::Node& source,
                                            const DeviceMesh& mesh, const Strategy& strategy) {
  const int n = mesh.ndim();
  if (strategy.kind == StrategyKind::kHybridShard && n < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hybrid_shard needs a 2-D mesh (replicate x shard), found ", mesh.ToString()));
  }
  if (HasTpDim(strategy) && n < 1) {
    return absl::InvalidArgumentError("tensor parallelism needs a mesh with a tp dim");
  }
  Placements p = Replicated(n);
  if (source.op == OpKind::kFill) return p;
  const std::string& name = graph::AttrString(source, "name");
  const graph::Type& type = g.type(source.outputs[0]);
  const int tp = HasTpDim(strategy) ? n - 1 : -1;
  const bool is_param = source.op == OpKind::kParameter || IsOptimizerState(name);
  if (!is_param) {
    // Data: the batch (dim 0) splits over every data-parallel dim; scalars (step, lr) replicate.
    if (type.rank() == 0) return p;
    for (int m = 0; m < n; ++m) {
      if (m != tp) p[m] = Placement::Shard(0);
    }
    return p;
  }
  // The parameter this state belongs to decides; its matmul tells column from row.
  const std::string param = StripOptimizerPrefix(name);
  const int param_value = g.FindSource(param);
  const TpRole role = TpRoleOf(param);
  int tp_dim = -1;
  if (tp >= 0 && type.rank() >= 1) {
    switch (role) {
      case TpRole::kReplicated: break;
      case TpRole::kVocab: tp_dim = 0; break;
      case TpRole::kColumn:
      case TpRole::kRow: {
        const int d = param_value >= 0 ? MatmulDim(g, param_value, role == TpRole::kColumn) : -1;
        tp_dim = d >= 0 ? d : (role == TpRole::kColumn ? 0 : 1);  // [out, in] by default
        break;
      }
    }
    if (tp_dim >= type.rank()) tp_dim = -1;
    if (tp_dim >= 0) p[tp] = Placement::Shard(tp_dim);
  }
  // FSDP shards a dim tensor parallelism leaves whole, so gathering it never disturbs the TP shard.
  const int fsdp_dim = tp_dim == 0 && type.rank() >= 2 ? 1 : 0;
  for (int m = 0; m < n; ++m) {
    if (m != tp && type.rank() >= 1 && ShardsParamsOn(strategy, m, n)) {
      p[m] = Placement::Shard(fsdp_dim);
    }
  }
  return p;
}

absl::StatusOr<TensorSpec> ShardingPlan::Spec(const graph::Graph& g, int v,
                                              const graph::Binding& b) const {
  SG_CHECK_ARG(g.has_value(v) && v < int(placements.size()), "sharding plan: no value ", v);
  SG_ASSIGN_OR_RETURN(Shape shape, graph::Evaluate(g.type(v).shape, b));
  return TensorSpec::Create(mesh, placements[v], std::move(shape));
}

std::string ShardingPlan::Summary() const {
  std::map<std::string, int> counts;
  for (const ValueRedistribution& r : redistributions) {
    for (const RedistributeStep& s : r.plan.steps) {
      if (!IsCollective(s.kind)) continue;
      ++counts[absl::StrCat(StepKindName(s.kind), "(", mesh.dim_name(s.mesh_dim), ")")];
    }
  }
  for (const NodeCollective& c : internal) {
    ++counts[absl::StrCat("in-kernel all-reduce(", mesh.dim_name(c.collective.mesh_dim), ")")];
  }
  if (counts.empty()) return "no communication";
  return absl::StrJoin(counts, ", ", [](std::string* o, const std::pair<const std::string, int>& c) {
    absl::StrAppend(o, c.first, " x ", c.second);
  });
}

absl::StatusOr<ShardingPlan> BuildShardingPlan(const graph::Graph& g, const DeviceMesh& mesh,
                                               const Strategy& strategy) {
  ShardingPlan plan;
  plan.mesh = mesh;
  plan.strategy = strategy;
  const int tp = HasTpDim(strategy) ? mesh.ndim() - 1 : -1;
  for (int m = 0; m < mesh.ndim(); ++m) {
    plan.options.policy.push_back(m == tp ? ConflictPolicy::kMoveActivations
                                          : ConflictPolicy::kGatherWeights);
  }
  plan.placements.assign(g.num_value_ids(), Placements());
  const std::vector<graph::Node>& nodes = g.nodes();
  // gradient value -> parameter value, from the optimizer's adamw(p, g, ...) nodes.
  absl::flat_hash_map<int, int> param_of_grad;
  for (const graph::Node& n : nodes) {
    if (n.op == OpKind::kAdamW) param_of_grad[n.inputs[1]] = n.inputs[0];
  }
  std::set<std::tuple<int, std::string, graph::Phase>> done;
  for (int idx = 0; idx < int(nodes.size()); ++idx) {
    const graph::Node& node = nodes[idx];
    if (graph::Schema(node.op).is_source) {
      SG_ASSIGN_OR_RETURN(plan.placements[node.outputs[0]],
                          SourcePlacements(g, node, mesh, strategy));
      continue;
    }
    std::vector<graph::Type> types;
    std::vector<Placements> in;
    for (int v : node.inputs) {
      types.push_back(g.type(v));
      in.push_back(plan.placements[v]);
    }
    absl::StatusOr<OpSharding> s = Propagate(node, types, in, mesh, plan.options);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sharding node ", idx, " (", node.scope, " ",
                                                     graph::OpName(node.op), "): ",
                                                     s.status().message()));
    }
    for (int i = 0; i < int(node.inputs.size()); ++i) {
      if (s->inputs[i] == in[i]) continue;
      // One redistributed copy serves every reader in the same phase (q, k and v share one
      // gathered activation); a new phase redistributes again (ZeRO-3 re-gathers in backward).
      auto key = std::make_tuple(node.inputs[i], PlacementsToString(s->inputs[i]), node.phase);
      if (!done.insert(key).second) continue;
      SG_ASSIGN_OR_RETURN(RedistributePlan rp,
                          PlanRedistribute(mesh, in[i], s->inputs[i], types[i].rank()));
      plan.redistributions.push_back({node.inputs[i], idx, i, Where(g, node, i), std::move(rp)});
    }
    for (size_t j = 0; j < node.outputs.size(); ++j) plan.placements[node.outputs[j]] = s->outputs[j];
    // A gradient is reduced into its parameter's placements as soon as it is produced (the DDP /
    // FSDP gradient reduction), so the grad-norm and the optimizer read the reduced shard.
    for (int v : node.outputs) {
      auto it = param_of_grad.find(v);
      if (it == param_of_grad.end() || plan.placements[v] == plan.placements[it->second]) continue;
      SG_ASSIGN_OR_RETURN(RedistributePlan rp,
                          PlanRedistribute(mesh, plan.placements[v], plan.placements[it->second],
                                           g.type(v).rank()));
      const graph::Node& param = nodes[g.value(it->second).producer];
      plan.redistributions.push_back(
          {v, idx + 1, -1, absl::StrCat("gradient of ", graph::AttrString(param, "name")),
           std::move(rp)});
      plan.placements[v] = plan.placements[it->second];
    }
    for (const InternalCollective& c : s->internal) plan.internal.push_back({idx, c});
    // Sequence parallelism: the vocab-parallel embedding's partial output is reduce-scattered
    // over the sequence at once, so the residual stream stays S(seq) on the tp dim.
    if (tp >= 0 && strategy.sequence_parallel && node.op == OpKind::kEmbedding &&
        s->outputs[0][tp].is_partial() && g.type(node.outputs[0]).rank() >= 3) {
      const int v = node.outputs[0];
      Placements sp = plan.placements[v];
      sp[tp] = Placement::Shard(1);
      SG_ASSIGN_OR_RETURN(RedistributePlan rp,
                          PlanRedistribute(mesh, plan.placements[v], sp, g.type(v).rank()));
      plan.redistributions.push_back(
          {v, idx + 1, -1, absl::StrCat(node.scope, " embedding output (sequence parallel)"),
           std::move(rp)});
      plan.placements[v] = sp;
    }
  }
  // In-place updates and gradients go back in their source's placements.
  for (int o = 0; o < int(g.outputs().size()); ++o) {
    const graph::GraphOutput& out = g.outputs()[o];
    absl::string_view name = out.name;
    if (!absl::ConsumePrefix(&name, "update:") && !absl::ConsumePrefix(&name, "grad:")) continue;
    const int src = g.FindSource(name);
    if (src < 0 || plan.placements[out.value] == plan.placements[src]) continue;
    SG_ASSIGN_OR_RETURN(RedistributePlan rp,
                        PlanRedistribute(mesh, plan.placements[out.value], plan.placements[src],
                                         g.type(out.value).rank()));
    plan.redistributions.push_back({out.value, -1, o, absl::StrCat("output ", out.name),
                                    std::move(rp)});
  }
  return plan;
}

}  // namespace sg::sharding
