// Cost model of the two strategies that cut the step itself rather than place its values:
// context parallelism (ring attention over the sequence) and pipeline parallelism (1F1B over
// layer stages). Both start from the single-device cost of the same train-step graph (EstimateCost
// with a replicated plan on one rank) and apply their own formulas, so the pre-flight report can
// list them beside the placement strategies.
//
//   SG_ASSIGN_OR_RETURN(PlanCost one, SingleDeviceCost(step_graph, binding, params));
//   SG_ASSIGN_OR_RETURN(PlanCost cp, EstimateContextParallelCost(step_graph, binding, {4, 2}, one, params));
//
// Context parallel, cp ranks in a ring x dp data-parallel replicas (batch split over dp):
//   memory       parameters, gradients, optimizer as replicated; activations / (cp * dp)
//   ring p2p     per attention layer per rank: forward cp-1 key/value blocks, backward cp-1 blocks
//                and cp dK/dV accumulators; block = 2 * (batch/dp) * (seq/cp) * kv_heads * head_dim
//                elements. Each transfer overlaps attention on the block held: only the part
//                longer than the attention compute is on the critical path.
//   gradients    all-reduce over cp * dp ranks (overlapped with the backward, as DDP)
// Pipeline parallel, pp stages x dp replicas, m = batch/dp micro-batches of one sequence:
//   memory       parameters, gradients, optimizer / pp (layers split evenly; the embedding and
//                output make the end stages heavier, not modelled); activations of min(pp, m)
//                micro-batches in flight over 1/pp of the layers: activations * min(pp, m) / (dp*m*pp)
//   stage p2p    per micro-batch one activation forward and one gradient backward of
//                seq * dim elements per boundary; the 2*(pp-1) transfers of fill and drain are on
//                the critical path, the rest overlap
//   bubble       compute * (m + pp - 1) / m (1F1B: bubble fraction (pp-1)/(m+pp-1))
//   gradients    all-reduce over dp within each stage
#ifndef SGTRAIN_SHARDING_PARALLEL_COST_H_
#define SGTRAIN_SHARDING_PARALLEL_COST_H_

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "sharding/cost_model.h"

namespace sg::sharding {

// EstimateCost of the step replicated on a single rank: the whole step's memory and FLOPs.
absl::StatusOr<PlanCost> SingleDeviceCost(const graph::Graph& g, const graph::Binding& binding,
                                          const CostParams& params);

struct ContextParallelShape {
  int cp = 2;
  int dp = 1;
};
// InvalidArgument when seq < 2*cp or the batch does not split over dp.
absl::StatusOr<PlanCost> EstimateContextParallelCost(const graph::Graph& g, const graph::Binding& binding,
                                                     const ContextParallelShape& shape, const PlanCost& single,
                                                     const CostParams& params);

struct PipelineShape {
  int pp = 2;
  int dp = 1;
};
// InvalidArgument when the graph has fewer layers than stages or the batch does not split over dp.
absl::StatusOr<PlanCost> EstimatePipelineCost(const graph::Graph& g, const graph::Binding& binding,
                                              const PipelineShape& shape, const PlanCost& single,
                                              const CostParams& params);

// Transformer layers of a train-step graph: distinct "layers.<i>." parameter prefixes.
int CountLayers(const graph::Graph& g);

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_PARALLEL_COST_H_
