// The graph layer's standard compile pipeline for a training step, and the artifact it caches:
// fuse -> autodiff -> AdamW -> fuse (backward epilogues) -> CSE -> DCE -> recompute -> memory plan.
//
//   PipelineOptions po; po.recompute = RecomputePolicy::kSelective;
//   CacheRequest req = CacheRequest::For(forward); req.options = po.CacheOptions();
//   auto art = cache->GetOrCompile(req, binding, [&](const Specialization& s) {
//     return CompileTrainStep(forward, po, s);
//   });
//
// The compiler layer may run its own pipeline on OptimizeTrainStep's graph and put its schedule
// in the plan blob instead; this one's blob is the memory plan (see SerializePlan).
#ifndef SGTRAIN_GRAPH_PIPELINE_H_
#define SGTRAIN_GRAPH_PIPELINE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "graph/cache.h"
#include "graph/ir.h"
#include "graph/optimizer.h"
#include "graph/passes/memory_plan.h"
#include "graph/passes/passes.h"

namespace sg::graph {

struct PipelineOptions {
  bool fuse = true;
  RecomputePolicy recompute = RecomputePolicy::kSelective;
  int recompute_swiglu_layers = -1;  // see ApplyRecompute
  TrainStepOptions train;
  // Every option as text, for the cache key.
  std::map<std::string, std::string> CacheOptions() const;
};

// The optimized fwd+bwd+optimizer graph for a forward graph with a "loss" output.
absl::StatusOr<Graph> OptimizeTrainStep(const Graph& forward, const PipelineOptions& options);

// OptimizeTrainStep + PlanMemory at the specialization's planning binding.
absl::StatusOr<Artifact> CompileTrainStep(const Graph& forward, const PipelineOptions& options,
                                          const Specialization& spec);

// "arena <bytes>\n" then one "%<id> <offset> <bytes>" line per arena buffer.
std::string SerializePlan(const MemoryPlan& plan);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_PIPELINE_H_
