// ShardedDataParallelStep's plan, made once at compile time from the forward+backward graph: the
// units (a parameter's unit is compiler/UnitOf's), the node each unit's collectives are issued at
// and waited for, the lowering with the parameters as transient buffers, and the deferred
// optimizer's host units and slots. Build runs the rest (fsdp.cc: allocation, schedule, executor).
#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/fsdp.h"
#include "compiler/fsdp_internal.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::compiler {

using graph::Phase;

absl::Status ShardedDataParallelStep::Build(const graph::Graph& train, const CompileOptions& o) {
  per_parameter_collectives_ = o.fsdp_per_parameter_collectives;
  host_gradient_units_ = o.fsdp_host_gradient_units;
  wgrad_stream_ = o.wgrad_stream;
  bf16_gradients_ = o.bf16_gradients;
  SG_ASSIGN_OR_RETURN(dp_, SplitOptimizer(train, o.loss));
  // Mixed precision: parameters gathered (and read by the program) in the compute dtype.
  SG_ASSIGN_OR_RETURN(dp_, GatherInComputeDType(std::move(dp_)));
  if (layout_.rewrite_graph) {
    SG_ASSIGN_OR_RETURN(dp_, layout_.rewrite_graph(std::move(dp_)));
  }
  CollectUnits();
  PlanIssuePoints(o.binding);
  LowerOptions lo = PlanLowering(o);
  SG_ASSIGN_OR_RETURN(const graph::Binding binding, MicroBatchBinding(o));
  SG_RETURN_IF_ERROR(PlanDeferredUpdate());
  lo.plan_only = plan_only_;
  lo.offload_activations = o.offload_activations;
  lo.bf16_gradients = bf16_gradients_;
  SG_ASSIGN_OR_RETURN(program_, Lower(dp_.graph, binding, o.device, lo));
  if (plan_only_) return SizeBuffers();
  if (layout_.rewrite_program) SG_RETURN_IF_ERROR(layout_.rewrite_program(*program_));
  for (const auto& p : params_) parameter_names_.push_back(p->name);
  SG_RETURN_IF_ERROR(Allocate());
  SG_RETURN_IF_ERROR(Schedule());
  ExplainPlan();
  return StartExecutor(o);
}

void ShardedDataParallelStep::CollectUnits() {
  const graph::Graph& g = dp_.graph;
  const std::vector<std::vector<int>> users = g.Users();
  std::map<std::string, int> unit_of;
  for (const DataParallelParam& dpp : dp_.params) {
    auto p = std::make_unique<Param>();
    p->name = dpp.name;
    p->weight_decay = dpp.weight_decay;
    const std::string unit = UnitOf(dpp.name);
    auto [it, added] = unit_of.emplace(unit, int(units_.size()));
    if (added) {
      units_.push_back(std::make_unique<Unit>());
      units_.back()->name = unit;
    }
    p->unit = it->second;
    Unit& u = *units_[p->unit];
    u.params.push_back(int(params_.size()));
    for (const bool bwd : {false, true}) {
      const int v = g.FindSource(bwd ? dpp.name + kBackwardSuffix : dpp.name);
      if (v < 0) continue;
      for (int n : users[v]) {
        (bwd ? u.bwd_first : u.fwd_first) = std::min(bwd ? u.bwd_first : u.fwd_first, n);
        (bwd ? p->bwd_last : p->fwd_last) = std::max(bwd ? p->bwd_last : p->fwd_last, n);
      }
    }
    const int go = g.FindOutput("grad:" + dpp.name);
    p->grad_from = g.value(g.outputs()[go].value).producer;
    u.grad_done = std::max(u.grad_done, p->grad_from);
    param_index_[p->name] = int(params_.size());
    params_.push_back(std::move(p));
  }
}

void ShardedDataParallelStep::PlanIssuePoints(const graph::Binding& binding) {
  const graph::Graph& g = dp_.graph;
  const int num_nodes = int(g.nodes().size());
  int first_backward = num_nodes;
  for (int i = 0; i < num_nodes; ++i) {
    if (g.nodes()[i].phase != Phase::kForward) {
      first_backward = i;
      break;
    }
  }
  // Issue points: each unit's gather when the previous unit (in use order) starts computing.
  auto order_by = [&](int Unit::*key) {
    std::vector<Unit*> order;
    for (auto& u : units_) {
      if (u.get()->*key != INT_MAX && u.get()->*key >= 0) order.push_back(u.get());
    }
    std::stable_sort(order.begin(), order.end(), [&](Unit* a, Unit* b) { return a->*key < b->*key; });
    return order;
  };
  std::vector<Unit*> fwd = order_by(&Unit::fwd_first), bwd = order_by(&Unit::bwd_first),
                     grads = order_by(&Unit::grad_done);
  for (size_t k = 0; k < fwd.size(); ++k) fwd[k]->fwd_at = k == 0 ? 0 : fwd[k - 1]->fwd_first;
  // A backward gather is issued once the unit before it has released half of its gathered bytes
  // (its parameters' last backward uses), not when that unit starts: a transformer layer's
  // backward begins with its widest part (the FFN's, under full recompute with the layer's
  // recomputed forward alive), and a prefetch issued at its start held two layers' weights through
  // it. What is left of the layer (the attention's backward and matmuls) still hides the gather.
  auto half_released = [&](const Unit& u) {
    std::vector<std::pair<int, int64_t>> last;  // (last backward use, bytes gathered)
    int64_t total = 0;
    for (int i : u.params) {
      const Param& p = *params_[i];
      if (p.bwd_last < 0) continue;
      const int v = g.FindSource(p.name + kBackwardSuffix);
      const int64_t bytes = graph::Evaluate(graph::NumElements(g.type(v).shape), binding).value_or(0);
      last.push_back({p.bwd_last, bytes});
      total += bytes;
    }
    std::sort(last.begin(), last.end());
    int64_t freed = 0;
    for (const auto& [node, bytes] : last) {
      freed += bytes;
      if (2 * freed >= total) return node + 1;  // issued after that use: the two never overlap
    }
    return u.bwd_first;
  };
  for (size_t k = 0; k < bwd.size(); ++k) {
    bwd[k]->bwd_at = k == 0 ? std::min(first_backward, bwd[0]->bwd_first)
                            : std::min(bwd[k]->bwd_first, std::max(bwd[k - 1]->bwd_first, half_released(*bwd[k - 1])));
  }
  for (size_t k = 0; k < grads.size(); ++k) grads[k]->rs_at = grads[k]->grad_done + 1;
  for (size_t k = 0; k < grads.size(); ++k) {
    grads[k]->rs_wait_at = k + 1 < grads.size() ? std::max(grads[k + 1]->rs_at, grads[k]->rs_at) : num_nodes;
  }
  // A packed unit's full gradients are only read by the copies into the bucket at the start of its
  // reduce-scatter: compute waits for those after the kMatmulsBeforePackedWait-th matmul from there
  // (which the copies overlap), and the buffers are reused from then on instead of living until the next unit's
  // reduce-scatter (at 7b a transformer layer's f32 gradients, 772 MiB, off the backward's peak).
  for (const auto& p : params_) {
    const int v = g.FindSource(p->name);
    const graph::SymShape& shape = g.type(v >= 0 ? v : g.FindSource(p->name + kBackwardSuffix)).shape;
    p->rows = shape.empty() ? 1 : graph::Evaluate(shape[0], binding).value_or(0);
  }
  constexpr int kMatmulsBeforePackedWait = 2;  // 1b FSDP, 2 H200s: 3.55 -> 1.43 ms of waits a step
  for (Unit* u : grads) {
    u->packed_at = u->rs_wait_at;
    if (Direct(*u)) continue;
    for (int i = u->rs_at, matmuls = 0; i < u->rs_wait_at && i < num_nodes; ++i) {
      if (g.nodes()[i].op != graph::OpKind::kMatmul || ++matmuls < kMatmulsBeforePackedWait) continue;
      u->packed_at = std::min(u->rs_wait_at, i + 1);
      break;
    }
  }
  // A per-parameter unit (PerParameter) reduce-scatters each parameter's gradient on its own as soon as it exists (at 7b
  // the FFN's f32 gradients, 516 MiB, were alive through the attention's backward waiting for the
  // layer's last gradient, and the layer's rank-major f32 bucket took 772 MiB). Compute waits for
  // it after the second matmul from its issue: the collective (0.3-0.6 ms for a 7b weight over
  // NVLink) overlaps two matmuls (0.4-1.1 ms each at 7b) rather than one.
  constexpr int kMatmulsBeforeWait = 2;
  for (auto& p : params_) {
    const Unit& u = *units_[p->unit];
    if (!PerParameter(u) || p->grad_from < 0) continue;
    p->rs_at = p->grad_from + 1;
    p->rs_wait_at = num_nodes;
    for (int i = p->rs_at, matmuls = 0; i < num_nodes; ++i) {
      if (g.nodes()[i].op == graph::OpKind::kMatmul && ++matmuls == kMatmulsBeforeWait) {
        p->rs_wait_at = i + 1;
        break;
      }
    }
  }
  // A backward prefetch issued just before a reduce-scatter of the unit it follows would hold that
  // reduce-scatter (and compute, which waits for it two matmuls later) behind the whole gather:
  // issue it after that reduce-scatter instead (a node or two later).
  for (size_t k = 1; k < bwd.size(); ++k) {
    const Unit& prev = *bwd[k - 1];
    if (!PerParameter(prev)) continue;
    int after = INT_MAX;
    for (int i : prev.params) {
      const int at = params_[size_t(i)]->rs_at;
      if (at >= bwd[k]->bwd_at && at < after) after = at;
    }
    if (after + 1 < bwd[k]->bwd_first && after <= bwd[k]->bwd_at + 1) bwd[k]->bwd_at = after + 1;
  }
}

LowerOptions ShardedDataParallelStep::PlanLowering(const CompileOptions& o) const {
  const int num_nodes = int(dp_.graph.nodes().size());
  LowerOptions lo;
  for (const auto& p : params_) {
    const Unit& u = *units_[p->unit];
    if (u.fwd_at != INT_MAX) lo.transient_sources[p->name] = u.fwd_at;
    if (u.bwd_at != INT_MAX) lo.transient_sources[p->name + kBackwardSuffix] = u.bwd_at;
    const int free_at = PerParameter(u) ? p->rs_wait_at : u.packed_at;
    if (free_at < num_nodes) lo.output_live_until["grad:" + p->name] = free_at;
    // The weight-gradient stream's matmuls are joined before the reduce-scatter that reads them.
    const int read_at = PerParameter(u) ? p->rs_at : u.rs_at;
    if (read_at < num_nodes) lo.gradient_read_at["grad:" + p->name] = read_at;
  }
  lo.wgrad_stream = o.wgrad_stream;
  // The loss's backward seed: copied on the device from seeds_ before each micro-batch and read
  // by the cross-entropy kernel when it runs, so the step stays capturable.
  lo.device_scalars.insert(kLossScaleName);
  // A layout that rewrites the program (FSDP x TP: vocabulary-parallel cross-entropy steps) needs
  // the unfused cross-entropy pair to replace.
  lo.fuse_device_scalars = !layout_.rewrite_program;
  return lo;
}

absl::StatusOr<graph::Binding> ShardedDataParallelStep::MicroBatchBinding(const CompileOptions& o) {
  micro_batches_ = o.micro_batches;
  graph::Binding binding = o.binding;
  if (micro_batches_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Compile: micro_batches must be >= 1, found ", micro_batches_));
  }
  if (micro_batches_ > 1) {
    auto b = binding.find("batch");
    if (b == binding.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Compile: micro_batches=", micro_batches_,
                                                     " splits the symbol 'batch', which the binding does not bind"));
    }
    if (b->second % micro_batches_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat("Compile: batch=", b->second, " is not a multiple of micro_batches=",
                                                     micro_batches_));
    }
    b->second /= micro_batches_;
  }
  return binding;
}

absl::Status ShardedDataParallelStep::PlanDeferredUpdate() {
  if (host_gradient_units_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Compile: fsdp_host_gradient_units must be >= 0, found ", host_gradient_units_));
  }
  if (!Deferred()) return absl::OkStatus();
  if (micro_batches_ > 1) {
    return absl::UnimplementedError(absl::StrCat("Compile: fsdp_host_gradient_units=", host_gradient_units_,
                                                 " defers AdamW to the next step's forward, which micro_batches=",
                                                 micro_batches_, " (gradients accumulated in the shards) does not "
                                                 "support; use one or the other"));
  }
  // Where each unit's update goes (just before its first gather of the step) and after which node
  // its gradient shards are complete (its last reduce-scatter's issue).
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = *units_[k];
    u.index = int(k);
    u.update_at = u.fwd_at != INT_MAX ? u.fwd_at : u.bwd_at != INT_MAX ? u.bwd_at : 0;
    u.reduced_at = u.rs_at;
    if (PerParameter(u)) {
      u.reduced_at = -1;
      for (int i : u.params) {
        if (params_[size_t(i)]->rs_at != INT_MAX) u.reduced_at = std::max(u.reduced_at, params_[size_t(i)]->rs_at);
      }
    }
    if (u.reduced_at < 0 || u.reduced_at == INT_MAX) {
      return absl::InternalError(absl::StrCat("sharded data parallel: unit '", u.name, "' has no reduce-scatter"));
    }
  }
  // The units on the host: the first in backward order (their gradients wait longest for the next
  // forward); the forward's first units, whose gradients come last, stay on the device.
  std::vector<Unit*> host;
  for (auto& u : units_) host.push_back(u.get());
  std::stable_sort(host.begin(), host.end(), [](Unit* a, Unit* b) { return a->grad_done < b->grad_done; });
  host.resize(std::min(host.size(), size_t(host_gradient_units_)));
  std::stable_sort(host.begin(), host.end(), [](Unit* a, Unit* b) { return a->reduced_at < b->reduced_at; });
  constexpr int S = kHostGradientSlots;
  auto first_reduce_scatter = [&](const Unit& u) {
    if (!PerParameter(u)) return u.rs_at;
    int first = INT_MAX;
    for (int i : u.params) first = std::min(first, params_[size_t(i)]->rs_at);
    return first;
  };
  for (size_t i = 0; i < host.size(); ++i) {
    Unit& u = *host[i];
    u.host = true;
    u.bwd_slot = int(i % S);
    if (i < S) continue;
    u.bwd_slot_prev = host[i - S];
    // The slot's previous unit is copied out once its reduce-scatters are all issued: before this
    // unit's first one writes the slot (its wait needs that copy's event recorded first).
    if (u.bwd_slot_prev->reduced_at >= first_reduce_scatter(u)) {
      return absl::UnimplementedError(absl::StrCat(
          "Compile: fsdp_host_gradient_units: unit '", u.name, "' reduce-scatters into a slot (before node ",
          first_reduce_scatter(u), ") while unit '", u.bwd_slot_prev->name,
          "', which used it before, still reduce-scatters (node ", u.bwd_slot_prev->reduced_at, ")"));
    }
  }
  // The last S units in backward order are the last writers of the slots, and (in a transformer)
  // the first S host units in forward order: their gradients are still in their slots when the next
  // forward starts, so those units are updated from there, with no copy back. Only with more than S
  // host units: the next write into a slot is then a copy back, queued on the copy stream after the
  // copies to the host (or a reduce-scatter ordered after such a copy), within one step's schedule.
  const std::vector<Unit*> backward_order = host;
  std::stable_sort(host.begin(), host.end(), [](Unit* a, Unit* b) { return a->update_at < b->update_at; });
  const size_t H = host.size(), resident = std::min<size_t>(S, H);
  bool in_place = H > size_t(S);
  for (size_t j = 0; j < resident; ++j) {
    in_place = in_place && std::find(backward_order.end() - resident, backward_order.end(), host[j]) !=
                               backward_order.end();
  }
  host_order_.clear();
  for (size_t j = 0; j < host.size(); ++j) {
    Unit& u = *host[j];
    u.resident = in_place && j < resident;
    u.fwd_slot = !in_place ? int(j % S) : j < resident ? u.bwd_slot : host[j - S]->fwd_slot;
    u.fwd_slot_prev = j >= S ? host[j - S] : nullptr;
    host_order_.push_back(&u);
    if (j > 0 && host[j - 1]->update_at >= u.update_at) {
      return absl::UnimplementedError(absl::StrCat("Compile: fsdp_host_gradient_units: units '", host[j - 1]->name,
                                                   "' and '", u.name, "' are first gathered at the same node (",
                                                   u.update_at, "); their updates need an order"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler
