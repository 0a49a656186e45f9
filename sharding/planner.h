// The automatic planner: builds every candidate strategy's ShardingPlan for a graph on a mesh,
// costs it (cost_model.h) and picks the fastest modelled step that fits the per-device memory
// budget, explaining the choice in plain words.
//
//   SG_ASSIGN_OR_RETURN(PlannerResult r, ChooseStrategy(step_graph, mesh, {{"batch", 8}, {"seq", 4096}}, {}));
//   const ShardingPlan& plan = r.candidates[r.chosen].plan;   // hand to the compiler
//   std::cout << r.explanation;
//
// The choice is per model (one strategy for every layer): the communication/computation ratio
// decides it. Parameter traffic (DDP all-reduce, FSDP gathers and reduce-scatters) scales with
// the parameter count and hides under compute when compute is long enough (large batch);
// tensor-parallel traffic scales with activations and never hides, but does not grow with the
// parameters. So a small model with a large batch gets replicate/FSDP, and a huge layer with a
// small batch gets TP. Modelled step times within 1% count as a tie, broken by the smaller memory
// footprint (e.g. FSDP over HYBRID_SHARD when both hide their traffic). Candidates that do not fit are discarded; when none fits, the one with the
// least memory is returned with `fits == false` and an explanation saying so.
#ifndef SGTRAIN_SHARDING_PLANNER_H_
#define SGTRAIN_SHARDING_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "sharding/cost_model.h"
#include "sharding/strategy.h"

namespace sg::sharding {

struct PlannerOptions {
  std::vector<StrategyKind> candidates;  // empty: every strategy the mesh allows
  bool placement = true;  // consider the placement strategies above
  // Also consider context parallelism / pipeline parallelism (parallel_cost.h) over the mesh's
  // last dimension, the other dimensions data parallel. Off by default: they have no ShardingPlan
  // (the compiler runs them through compiler/context_parallel and compiler/pipeline), so a caller
  // that executes the chosen plan must not get one unasked.
  bool context_parallel = false;
  bool pipeline = false;
  double memory_budget_bytes = 140e9;    // per device (H200: 141 GB)
  CostParams cost;
};

struct Candidate {
  Strategy strategy;
  // "cp=4" or "pp=4" for a context/pipeline-parallel candidate (its `plan` is empty and
  // `strategy` meaningless); empty for a placement strategy.
  std::string label;
  std::string Name() const;  // the label, or StrategyName(strategy.kind)
  std::string skipped;  // non-empty: why this strategy does not apply (then plan/cost are empty)
  ShardingPlan plan;
  PlanCost cost;
  bool fits = false;
};

struct PlannerResult {
  std::vector<Candidate> candidates;
  int chosen = -1;
  bool fits = false;
  std::string explanation;
};

// InvalidArgument when the binding misses the graph's symbols, or no candidate applies.
absl::StatusOr<PlannerResult> ChooseStrategy(const graph::Graph& g, const DeviceMesh& mesh,
                                             const graph::Binding& binding,
                                             const PlannerOptions& options);

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_PLANNER_H_
