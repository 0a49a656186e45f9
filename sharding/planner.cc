#include "sharding/planner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/ops.h"
#include "sharding/parallel_cost.h"

namespace sg::sharding {
namespace {

// Why `kind` cannot run on `mesh` for this batch, or "".
std::string NotApplicable(StrategyKind kind, const DeviceMesh& mesh, const graph::Binding& b) {
  const bool two_d = mesh.ndim() >= 2;
  if ((kind == StrategyKind::kHybridShard || kind == StrategyKind::kFsdpTp) && !two_d) {
    return absl::StrCat("needs a 2-D mesh, found ", mesh.ToString());
  }
  const bool tp = kind == StrategyKind::kTensorParallel || kind == StrategyKind::kFsdpTp;
  int data = 1;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (!(tp && m == mesh.ndim() - 1)) data *= mesh.dim_size(m);
  }
  auto it = b.find("batch");
  if (it != b.end() && it->second % data != 0) {
    return absl::StrCat("batch ", it->second, " does not split over ", data,
                        " data-parallel ranks");
  }
  return "";
}

// Context- and pipeline-parallel candidates over the mesh's last dimension (dp = the rest).
absl::Status AddCutCandidates(const graph::Graph& g, const DeviceMesh& mesh, const graph::Binding& binding,
                              const PlannerOptions& options, PlannerResult& r) {
  if (!options.context_parallel && !options.pipeline) return absl::OkStatus();
  absl::StatusOr<PlanCost> single = SingleDeviceCost(g, binding, options.cost);
  if (!single.ok()) return single.status();
  const int n = mesh.ndim() == 0 ? 1 : mesh.dim_size(mesh.ndim() - 1);
  const int dp = mesh.size() / n;
  for (int which = 0; which < 2; ++which) {
    if (which == 0 && !options.context_parallel) continue;
    if (which == 1 && !options.pipeline) continue;
    Candidate c;
    c.label = absl::StrCat(which == 0 ? "cp=" : "pp=", n, dp > 1 ? absl::StrCat(" x dp=", dp) : "");
    absl::StatusOr<PlanCost> cost =
        which == 0 ? EstimateContextParallelCost(g, binding, {n, dp}, *single, options.cost)
                   : EstimatePipelineCost(g, binding, {n, dp}, *single, options.cost);
    if (cost.ok()) {
      c.cost = *std::move(cost);
      c.fits = double(c.cost.memory.Total()) <= options.memory_budget_bytes;
    } else if (cost.status().code() == absl::StatusCode::kInvalidArgument) {
      c.skipped = std::string(cost.status().message());
    } else {
      return cost.status();
    }
    r.candidates.push_back(std::move(c));
  }
  return absl::OkStatus();
}

std::string Ms(double s) { return absl::StrFormat("%.2f ms", s * 1e3); }

std::string Explain(const PlannerResult& r, const DeviceMesh& mesh, double budget) {
  const Candidate& c = r.candidates[r.chosen];
  const PlanCost& k = c.cost;
  std::string s = absl::StrCat(
      r.fits ? "chose " : "nothing fits the memory budget; least memory is ",
      c.Name(), " over ", mesh.ToString(), ": ",
      HumanBytes(double(k.memory.Total())), "/rank (params ", HumanBytes(double(k.memory.parameters)),
      ", budget ", HumanBytes(budget), "), ");
  const double hidden = std::min(k.overlappable_comm_s, k.compute_s);
  absl::StrAppend(&s, "comm ", Ms(k.overlappable_comm_s + k.critical_comm_s), " of which ",
                  Ms(hidden), " hidden under ", Ms(k.compute_s), " compute (comm/compute ",
                  absl::StrFormat("%.2f", (k.overlappable_comm_s + k.critical_comm_s) /
                                              std::max(k.compute_s, 1e-12)),
                  "), modelled step ", Ms(k.step_s), ".");
  for (const Candidate& o : r.candidates) {
    if (&o == &c) continue;
    absl::StrAppend(&s, "\n  ", o.Name(), ": ");
    if (!o.skipped.empty()) {
      absl::StrAppend(&s, "not applicable (", o.skipped, ")");
    } else if (!o.fits) {
      absl::StrAppend(&s, "does not fit (", HumanBytes(double(o.cost.memory.Total())), "/rank)");
    } else {
      absl::StrAppend(&s, "step ", Ms(o.cost.step_s), " (", Ms(o.cost.critical_comm_s),
                      " critical comm, ", Ms(std::max(0.0, o.cost.overlappable_comm_s -
                                                               o.cost.compute_s)),
                      " unhidden)");
    }
  }
  return s;
}

}  // namespace

std::string Candidate::Name() const {
  return label.empty() ? std::string(StrategyName(strategy.kind)) : label;
}

absl::StatusOr<PlannerResult> ChooseStrategy(const graph::Graph& g, const DeviceMesh& mesh,
                                             const graph::Binding& binding,
                                             const PlannerOptions& options) {
  PlannerResult r;
  std::vector<StrategyKind> kinds = options.candidates;
  if (kinds.empty()) kinds.assign(std::begin(kAllStrategies), std::end(kAllStrategies));
  if (!options.placement) kinds.clear();
  for (StrategyKind kind : kinds) {
    Candidate c;
    c.strategy.kind = kind;
    c.skipped = NotApplicable(kind, mesh, binding);
    if (c.skipped.empty()) {
      absl::StatusOr<ShardingPlan> plan = BuildShardingPlan(g, mesh, c.strategy);
      if (!plan.ok()) return plan.status();
      absl::StatusOr<PlanCost> cost = EstimateCost(g, *plan, binding, options.cost);
      if (!cost.ok()) return cost.status();
      c.plan = *std::move(plan);
      c.cost = *std::move(cost);
      c.fits = double(c.cost.memory.Total()) <= options.memory_budget_bytes;
    }
    r.candidates.push_back(std::move(c));
  }
  {
    absl::Status s = AddCutCandidates(g, mesh, binding, options, r);
    if (!s.ok()) return s;
  }
  // Fastest that fits; if none fits, the smallest.
  for (int i = 0; i < int(r.candidates.size()); ++i) {
    const Candidate& c = r.candidates[i];
    if (!c.skipped.empty()) continue;
    if (r.chosen < 0) {
      r.chosen = i;
      continue;
    }
    const Candidate& best = r.candidates[r.chosen];
    // Step times within 1% are a tie the model cannot resolve: the smaller footprint wins.
    const bool tie = std::abs(c.cost.step_s - best.cost.step_s) <= 0.01 * best.cost.step_s;
    const bool smaller = c.cost.memory.Total() < best.cost.memory.Total();
    const bool better = c.fits != best.fits ? c.fits
                        : c.fits ? (tie ? smaller : c.cost.step_s < best.cost.step_s)
                                 : smaller;
    if (better) r.chosen = i;
  }
  if (r.chosen < 0) {
    return absl::InvalidArgumentError(absl::StrCat("no strategy applies to mesh ", mesh.ToString()));
  }
  r.fits = r.candidates[r.chosen].fits;
  r.explanation = Explain(r, mesh, options.memory_budget_bytes);
  return r;
}

}  // namespace sg::sharding
