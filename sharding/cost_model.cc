#include "sharding/cost_model.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/ops.h"
#include "graph/passes/memory_plan.h"
#include "kernels/core/status.h"

namespace sg::sharding {
namespace {

using graph::OpKind;

// Bytes of `rank` 0's piece of value `v` with placements `p` (rank 0 holds the largest chunk).
absl::StatusOr<int64_t> LocalBytes(const graph::Graph& g, int v, const Placements& p,
                                   const DeviceMesh& mesh, const graph::Binding& b) {
  SG_ASSIGN_OR_RETURN(Shape shape, graph::Evaluate(g.type(v).shape, b));
  SG_ASSIGN_OR_RETURN(TensorSpec s, TensorSpec::Create(mesh, p, shape));
  return NumElements(s.LocalShape(0)) * int64_t(SizeOf(g.type(v).dtype));
}

}  // namespace

absl::StatusOr<double> NodeFlops(const graph::Graph& g, const graph::Node& n,
                                 const graph::Binding& b) {
  auto shape = [&](int v) { return graph::Evaluate(g.type(v).shape, b); };
  if (n.op == OpKind::kMatmul) {
    SG_ASSIGN_OR_RETURN(Shape a, shape(n.inputs[0]));
    SG_ASSIGN_OR_RETURN(Shape out, shape(n.outputs[0]));
    const int64_t k = graph::AttrBool(n, "trans_a") ? NumElements(a) / a.back() : a.back();
    return 2.0 * double(NumElements(out)) * double(k);
  }
  if (n.op == OpKind::kAttention || n.op == OpKind::kAttentionBackward) {
    SG_ASSIGN_OR_RETURN(Shape q, shape(n.inputs[n.op == OpKind::kAttention ? 0 : 1]));
    const double fwd = 4.0 * double(q[0]) * double(q[1]) * double(q[1]) * double(q[2]) *
                       double(q[3]) * (graph::AttrBool(n, "causal") ? 0.5 : 1.0);
    return n.op == OpKind::kAttention ? fwd : 2.0 * fwd;
  }
  return 0.0;
}

double CollectiveSeconds(StepKind kind, int64_t bytes, int p, const CostParams& c) {
  if (p <= 1 || !IsCollective(kind)) return 0;
  const double n = double(bytes), f = double(p - 1) / p;
  switch (kind) {
    case StepKind::kAllReduce: return 2 * f * n / c.allreduce_busbw + 2 * (p - 1) * c.alpha_s;
    case StepKind::kAllGather:
    case StepKind::kReduceScatter: return f * n / c.allgather_busbw + (p - 1) * c.alpha_s;
    case StepKind::kAllToAll: return f * n / c.p2p_bw + (p - 1) * c.alpha_s;
    default: return 0;
  }
}

std::string HumanBytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.1f KB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

absl::StatusOr<PlanCost> EstimateCost(const graph::Graph& g, const ShardingPlan& plan,
                                      const graph::Binding& binding, const CostParams& params) {
  PlanCost cost;
  const DeviceMesh& mesh = plan.mesh;
  // Memory: sources by category.
  for (const graph::Node& n : g.nodes()) {
    if (n.op != OpKind::kParameter && n.op != OpKind::kInput) continue;
    const int v = n.outputs[0];
    const std::string& name = graph::AttrString(n, "name");
    SG_ASSIGN_OR_RETURN(int64_t bytes, LocalBytes(g, v, plan.placements[v], mesh, binding));
    if (absl::StartsWith(name, "opt.")) {
      cost.memory.optimizer += bytes;
    } else if (n.op == OpKind::kParameter) {
      cost.memory.parameters += bytes;
      if (params.f32_master && g.type(v).dtype != DType::kF32) {
        cost.memory.optimizer += bytes / int64_t(SizeOf(g.type(v).dtype)) * 4;
      }
    }
  }
  // Gradients: each adamw's gradient input, in the parameter's placement.
  std::vector<bool> is_gradient(g.num_value_ids(), false);
  int64_t full_gradients = 0;
  for (const graph::Node& n : g.nodes()) {
    if (n.op != OpKind::kAdamW) continue;
    const int grad = n.inputs[1];
    SG_ASSIGN_OR_RETURN(int64_t bytes,
                        LocalBytes(g, grad, plan.placements[n.inputs[0]], mesh, binding));
    cost.memory.gradients += bytes;
    if (!is_gradient[grad]) {
      is_gradient[grad] = true;
      SG_ASSIGN_OR_RETURN(int64_t full, LocalBytes(g, grad, Replicated(mesh.ndim()), mesh, binding));
      full_gradients += full;
    }
  }
  // Activations: the planned arena peak of the unsharded graph holds every non-source value, the
  // gradients included (they are all live at once where clipping reads them), so the gradients,
  // counted above, come out of it; the rest is scaled by the mean shard fraction of the other
  // non-source values.
  SG_ASSIGN_OR_RETURN(graph::MemoryPlan mp, graph::PlanMemory(g, binding));
  double global = 0, local = 0;
  for (const graph::Node& n : g.nodes()) {
    if (graph::Schema(n.op).is_source) continue;
    for (int v : n.outputs) {
      if (is_gradient[v]) continue;
      SG_ASSIGN_OR_RETURN(int64_t full, LocalBytes(g, v, Replicated(mesh.ndim()), mesh, binding));
      SG_ASSIGN_OR_RETURN(int64_t mine, LocalBytes(g, v, plan.placements[v], mesh, binding));
      global += double(full);
      local += double(mine);
    }
  }
  const int64_t non_gradient_arena = std::max<int64_t>(0, mp.arena_bytes - full_gradients);
  cost.memory.activations =
      int64_t(double(non_gradient_arena) * (global > 0 ? local / global : 1.0));
  // Communication.
  int64_t largest_gathered_param = 0;
  for (const ValueRedistribution& r : plan.redistributions) {
    const bool moves_source = graph::Schema(g.nodes()[g.value(r.value).producer].op).is_source;
    const bool overlappable = moves_source || absl::StartsWith(r.where, "gradient of");
    for (const RedistributeStep& s : r.plan.steps) {
      if (!IsCollective(s.kind)) continue;
      const bool gathers = s.kind == StepKind::kAllGather;
      SG_ASSIGN_OR_RETURN(int64_t bytes, LocalBytes(g, r.value, gathers ? s.after : s.before,
                                                    mesh, binding));
      if (moves_source && gathers) largest_gathered_param = std::max(largest_gathered_param, bytes);
      const double t = CollectiveSeconds(s.kind, bytes, mesh.dim_size(s.mesh_dim), params);
      CommVolume& c = cost.comm[absl::StrCat(StepKindName(s.kind), "(", mesh.dim_name(s.mesh_dim), ")")];
      ++c.count;
      c.bytes += bytes;
      c.seconds += t;
      (overlappable ? cost.overlappable_comm_s : cost.critical_comm_s) += t;
    }
  }
  cost.memory.transient = 2 * largest_gathered_param;
  for (const NodeCollective& nc : plan.internal) {
    SG_ASSIGN_OR_RETURN(int64_t elements, graph::Evaluate(nc.collective.elements, binding));
    const int64_t bytes = elements / nc.collective.divisor * 4;
    const double t = CollectiveSeconds(StepKind::kAllReduce, bytes,
                                       mesh.dim_size(nc.collective.mesh_dim), params);
    CommVolume& c = cost.comm[absl::StrCat("in-kernel all-reduce(",
                                           mesh.dim_name(nc.collective.mesh_dim), ")")];
    ++c.count;
    c.bytes += bytes;
    c.seconds += t;
    cost.critical_comm_s += t;
  }
  // Compute.
  for (const graph::Node& n : g.nodes()) {
    SG_ASSIGN_OR_RETURN(double f, NodeFlops(g, n, binding));
    cost.flops += f;
  }
  cost.compute_s = cost.flops / mesh.size() / params.flops_per_s;
  cost.step_s = cost.compute_s + cost.critical_comm_s +
                std::max(0.0, cost.overlappable_comm_s - cost.compute_s);
  return cost;
}

std::string PlanCost::ToString() const {
  std::string s = absl::StrFormat(
      "  memory/rank: params %s, grads %s, optimizer %s, activations %s, transient %s = %s\n",
      HumanBytes(memory.parameters), HumanBytes(memory.gradients), HumanBytes(memory.optimizer),
      HumanBytes(memory.activations), HumanBytes(memory.transient), HumanBytes(memory.Total()));
  if (comm.empty()) absl::StrAppend(&s, "  communication: none\n");
  for (const auto& [name, c] : comm) {
    absl::StrAppend(&s, absl::StrFormat("  %-28s x%-5d %10s/step  %8.2f ms\n", name, c.count,
                                        HumanBytes(double(c.bytes)), c.seconds * 1e3));
  }
  absl::StrAppend(&s, absl::StrFormat(
                          "  compute %.2f ms (%.3g TFLOP/step), comm %.2f ms hideable + %.2f ms "
                          "critical -> step %.2f ms\n",
                          compute_s * 1e3, flops / 1e12, overlappable_comm_s * 1e3,
                          critical_comm_s * 1e3, step_s * 1e3));
  return s;
}

}  // namespace sg::sharding
