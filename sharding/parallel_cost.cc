#include "sharding/parallel_cost.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "kernels/core/status.h"
#include "sharding/mesh.h"
#include "sharding/strategy.h"

namespace sg::sharding {
namespace {

using graph::OpKind;

struct AttentionLayer {
  int64_t batch, seq, kv_heads, head_dim, elem_bytes;
  double flops;  // forward + backward
};

absl::StatusOr<std::vector<AttentionLayer>> AttentionLayers(const graph::Graph& g, const graph::Binding& b) {
  std::vector<AttentionLayer> out;
  for (const graph::Node& n : g.nodes()) {
    if (n.op != OpKind::kAttention) continue;
    SG_ASSIGN_OR_RETURN(Shape q, graph::Evaluate(g.type(n.inputs[0]).shape, b));
    SG_ASSIGN_OR_RETURN(Shape k, graph::Evaluate(g.type(n.inputs[1]).shape, b));
    const double fwd = 4.0 * double(q[0]) * double(q[1]) * double(q[1]) * double(q[2]) * double(q[3]) *
                       (graph::AttrBool(n, "causal") ? 0.5 : 1.0);
    out.push_back({k[0], k[1], k[2], k[3], SizeOf(g.type(n.inputs[1]).dtype), 3.0 * fwd});
  }
  return out;
}

void AddComm(PlanCost& c, const std::string& name, int64_t count, int64_t bytes, double seconds) {
  CommVolume& v = c.comm[name];
  v.count += count;
  v.bytes += bytes;
  v.seconds += seconds;
}

// Gradient all-reduce over `ranks` (full gradient bytes per rank), overlapped as in DDP.
void GradientAllReduce(PlanCost& c, int64_t grad_bytes, int ranks, const std::string& dim,
                       const CostParams& params) {
  if (ranks <= 1) return;
  const double t = CollectiveSeconds(StepKind::kAllReduce, grad_bytes, ranks, params);
  AddComm(c, absl::StrCat("all-reduce(", dim, ")"), 1, grad_bytes, t);
  c.overlappable_comm_s += t;
}

int64_t Batch(const graph::Binding& b) {
  auto it = b.find("batch");
  return it == b.end() ? 1 : it->second;
}

}  // namespace

int CountLayers(const graph::Graph& g) {
  std::set<int64_t> layers;
  for (const graph::Node& n : g.nodes()) {
    if (n.op != OpKind::kParameter) continue;
    absl::string_view name = graph::AttrString(n, "name");
    if (!absl::StartsWith(name, "layers.")) continue;
    name.remove_prefix(7);
    int64_t i = 0;
    if (absl::SimpleAtoi(name.substr(0, name.find('.')), &i)) layers.insert(i);
  }
  return int(layers.size());
}

absl::StatusOr<PlanCost> SingleDeviceCost(const graph::Graph& g, const graph::Binding& binding,
                                          const CostParams& params) {
  SG_ASSIGN_OR_RETURN(DeviceMesh one, DeviceMesh::Create({"dp"}, {1}));
  SG_ASSIGN_OR_RETURN(ShardingPlan plan, BuildShardingPlan(g, one, {StrategyKind::kReplicate}));
  return EstimateCost(g, plan, binding, params);
}

absl::StatusOr<PlanCost> EstimateContextParallelCost(const graph::Graph& g, const graph::Binding& binding,
                                                     const ContextParallelShape& s, const PlanCost& single,
                                                     const CostParams& params) {
  const int64_t batch = Batch(binding);
  auto seq_it = binding.find("seq");
  SG_CHECK_ARG(seq_it != binding.end(), "context parallel cost: the binding has no 'seq'");
  const int64_t seq = seq_it->second;
  SG_CHECK_ARG(s.cp >= 1 && s.dp >= 1, "context parallel cost: cp and dp must be >= 1, found ", s.cp, ", ", s.dp);
  SG_CHECK_ARG(seq >= 2 * s.cp, "context parallel cost: seq ", seq, " is shorter than 2*cp = ", 2 * s.cp,
               " chunks");
  SG_CHECK_ARG(batch % s.dp == 0, "context parallel cost: batch ", batch, " does not split over ", s.dp,
               " data-parallel ranks");
  PlanCost c;
  c.memory = single.memory;
  c.memory.activations = single.memory.activations / (int64_t(s.cp) * s.dp);
  c.memory.transient = 0;
  c.flops = single.flops;
  const int ranks = s.cp * s.dp;
  c.compute_s = single.flops / ranks / params.flops_per_s;
  SG_ASSIGN_OR_RETURN(std::vector<AttentionLayer> layers, AttentionLayers(g, binding));
  if (s.cp > 1) {
    for (const AttentionLayer& l : layers) {
      const int64_t block = 2 * (l.batch / s.dp) * ((l.seq + s.cp - 1) / s.cp) * l.kv_heads * l.head_dim * l.elem_bytes;
      const int64_t transfers = 3 * int64_t(s.cp) - 2;  // fwd cp-1, bwd cp-1 blocks + cp accumulators
      const double t = double(transfers) * (double(block) / params.p2p_bw + params.alpha_s);
      AddComm(c, "ring p2p(cp)", transfers, transfers * block, t);
      const double attention_s = l.flops / ranks / params.flops_per_s;
      c.critical_comm_s += std::max(0.0, t - attention_s);
    }
  }
  GradientAllReduce(c, single.memory.gradients, ranks, "cp x dp", params);
  c.step_s = c.compute_s + c.critical_comm_s + std::max(0.0, c.overlappable_comm_s - c.compute_s);
  return c;
}

absl::StatusOr<PlanCost> EstimatePipelineCost(const graph::Graph& g, const graph::Binding& binding,
                                              const PipelineShape& s, const PlanCost& single,
                                              const CostParams& params) {
  const int64_t batch = Batch(binding);
  const int layers = CountLayers(g);
  SG_CHECK_ARG(s.pp >= 1 && s.dp >= 1, "pipeline cost: pp and dp must be >= 1, found ", s.pp, ", ", s.dp);
  SG_CHECK_ARG(layers >= s.pp, "pipeline cost: ", layers, " layers cannot fill ", s.pp, " stages");
  SG_CHECK_ARG(batch % s.dp == 0, "pipeline cost: batch ", batch, " does not split over ", s.dp,
               " data-parallel ranks");
  const int64_t m = batch / s.dp;
  PlanCost c;
  c.memory.parameters = single.memory.parameters / s.pp;
  c.memory.gradients = single.memory.gradients / s.pp;
  c.memory.optimizer = single.memory.optimizer / s.pp;
  c.memory.activations = int64_t(double(single.memory.activations) * double(std::min<int64_t>(s.pp, m)) /
                                 (double(s.dp) * double(m) * s.pp));
  c.flops = single.flops;
  const double compute = single.flops / (double(s.pp) * s.dp) / params.flops_per_s;
  c.compute_s = compute * double(m + s.pp - 1) / double(m);  // with the bubble
  if (s.pp > 1) {
    SG_ASSIGN_OR_RETURN(std::vector<AttentionLayer> attn, AttentionLayers(g, binding));
    int64_t dim = 0;
    for (const graph::Node& n : g.nodes()) {
      if (n.op == OpKind::kParameter && graph::AttrString(n, "name") == "tok_embeddings.weight") {
        SG_ASSIGN_OR_RETURN(Shape e, graph::Evaluate(g.type(n.outputs[0]).shape, binding));
        dim = e[1];
      }
    }
    SG_CHECK_ARG(dim > 0 && !attn.empty(), "pipeline cost: the graph has no tok_embeddings.weight or attention");
    const int64_t act = attn[0].seq * dim * attn[0].elem_bytes;  // one micro-batch of one sequence
    const double t = double(act) / params.p2p_bw + params.alpha_s;
    AddComm(c, "stage p2p(pp)", 2 * m, 2 * m * act, 2.0 * double(m) * t);
    c.critical_comm_s += 2.0 * (s.pp - 1) * t;
    c.overlappable_comm_s += 2.0 * double(m) * t;
  }
  GradientAllReduce(c, c.memory.gradients, s.dp, "dp", params);
  c.step_s = c.compute_s + c.critical_comm_s + std::max(0.0, c.overlappable_comm_s - c.compute_s);
  return c;
}

}  // namespace sg::sharding
