// Cost model of a ShardingPlan: communication time per collective (alpha-beta, ring formulas),
// compute time from FLOPs at a measured rate, and memory per rank by category.
//
//   SG_ASSIGN_OR_RETURN(PlanCost c, EstimateCost(graph, plan, {{"batch", 8}, {"seq", 4096}}, {}));
//   c.step_s; c.memory.Total(); c.comm["all-gather(dp)"].bytes; std::cout << c.ToString();
//
// Collective times for a buffer of n bytes (the full, gathered / pre-scatter size per rank) over
// p ranks, bandwidth B (bus bandwidth, as nccl-tests reports it) and latency alpha per hop:
//   all-reduce       2(p-1)/p * n/B_allreduce + 2(p-1) alpha
//   all-gather       (p-1)/p * n/B_allgather + (p-1) alpha       (reduce-scatter the same)
//   all-to-all       (p-1)/p * n/B_p2p + (p-1) alpha             (each block crosses one link)
// Defaults are H200 NVLink numbers (316 GB/s all-reduce bus bandwidth, 357 GB/s P2P, 10 us);
// override them with the comm layer's collectives_benchmark results (CostParams fields / flags).
// Compute: 2*M*N*K per matmul and 4*b*s^2*h*d per attention (halved when causal; backward 2x the
// forward), over the whole step, divided evenly over the ranks, at `flops_per_s`.
// Overlap: collectives that move parameters (FSDP gathers) or reduce gradients are issued ahead /
// in the background and hide under compute; everything else (tensor-parallel activations,
// in-kernel all-reduces) is on the critical path:
//   step = compute + critical_comm + max(0, overlappable_comm - compute).
// Memory per rank (the largest shard, rank 0's):
//   parameters       the graph's parameter sources, local bytes in their placements.
//   gradients        each gradient in its reduced placement (the parameter's), in the graph dtype.
//   optimizer        AdamW m and v (the graph's opt.m./opt.v. sources) + an f32 master copy of
//                    non-f32 parameters when `f32_master` (the usual mixed-precision runtime).
//   activations      the graph's memory plan (graph/passes/memory_plan.h: planned arena peak of the
//                    unsharded step) less the full gradients (the arena holds them: all are live
//                    where clipping reads them; they are counted above), scaled by the mean shard
//                    fraction of the graph's other non-source values under the plan. An estimate:
//                    it assumes the peak scales like the mean. On one device the total matches the
//                    measured peak of a compiled CPU step within 1% (sharding/memory_estimate_test).
//   transient        the largest parameter gathered at once, twice (prefetch of the next layer).
#ifndef SGTRAIN_SHARDING_COST_MODEL_H_
#define SGTRAIN_SHARDING_COST_MODEL_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "sharding/redistribute.h"
#include "sharding/strategy.h"

namespace sg::sharding {

struct CostParams {
  double alpha_s = 10e-6;
  double allreduce_busbw = 316e9;  // bytes/s
  double allgather_busbw = 316e9;  // all-gather and reduce-scatter
  double p2p_bw = 357e9;
  double flops_per_s = 600e12;     // measured bf16 GEMM rate (H200 default)
  bool f32_master = true;
};

// Seconds for one collective of `bytes` (full buffer) over `p` ranks. 0 for local steps or p == 1.
double CollectiveSeconds(StepKind kind, int64_t bytes, int p, const CostParams& params);

struct MemoryBreakdown {
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0, transient = 0;
  int64_t Total() const { return parameters + gradients + optimizer + activations + transient; }
};

struct CommVolume {
  int64_t count = 0;
  int64_t bytes = 0;  // summed full-buffer sizes per rank
  double seconds = 0;
};

struct PlanCost {
  MemoryBreakdown memory;
  std::map<std::string, CommVolume> comm;  // "all-gather(dp)", "in-kernel all-reduce(tp)", ...
  double flops = 0;            // whole step, all ranks
  double compute_s = 0;        // per rank
  double overlappable_comm_s = 0, critical_comm_s = 0;
  double step_s = 0;
  // Several lines: memory by category, communication by collective, times.
  std::string ToString() const;
};

// The FLOPs of one node at `binding`'s shapes, as EstimateCost counts them: 2 M N K for a matmul,
// 4 b s^2 h d for attention (halved when causal, the backward twice the forward), 0 otherwise.
absl::StatusOr<double> NodeFlops(const graph::Graph& g, const graph::Node& n, const graph::Binding& binding);

// InvalidArgument when the binding misses a symbol of `g`.
absl::StatusOr<PlanCost> EstimateCost(const graph::Graph& g, const ShardingPlan& plan,
                                      const graph::Binding& binding, const CostParams& params);

// "1.23 GB", "456 MB", "12 KB".
std::string HumanBytes(double bytes);

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_COST_MODEL_H_
