#include "graph/pipeline.h"

#include "absl/strings/str_cat.h"
#include "graph/text.h"
#include "kernels/core/status.h"

namespace sg::graph {

std::map<std::string, std::string> PipelineOptions::CacheOptions() const {
  const AdamWOptions& a = train.adamw;
  return {{"fuse", fuse ? "1" : "0"},
          {"recompute", absl::StrCat(RecomputePolicyName(recompute),
                                     recompute_swiglu_layers >= 0 ? absl::StrCat(":", recompute_swiglu_layers) : "")},
          {"loss", train.loss},
          {"adamw", absl::StrCat(a.beta1, ",", a.beta2, ",", a.eps, ",", a.weight_decay, ",",
                                 a.max_grad_norm, ",", DTypeName(a.state_dtype), ",",
                                 a.keep_grad_outputs)}};
}

absl::StatusOr<Graph> OptimizeTrainStep(const Graph& forward, const PipelineOptions& options) {
  Graph g = forward;
  if (options.fuse) {
    SG_ASSIGN_OR_RETURN(g, FuseForKernels(g));
  }
  SG_ASSIGN_OR_RETURN(g, BuildTrainStep(g, options.train));
  if (options.fuse) {
    SG_ASSIGN_OR_RETURN(g, FuseForKernels(g));
  }
  SG_ASSIGN_OR_RETURN(g, Cse(g));
  SG_ASSIGN_OR_RETURN(g, Dce(g));
  return ApplyRecompute(g, options.recompute, nullptr, options.recompute_swiglu_layers);
}

std::string SerializePlan(const MemoryPlan& plan) {
  std::string s = absl::StrCat("arena ", plan.arena_bytes, "\n");
  for (const BufferAssignment& b : plan.buffers) {
    if (b.offset >= 0) absl::StrAppend(&s, "%", b.value, " ", b.offset, " ", b.bytes, "\n");
  }
  return s;
}

absl::StatusOr<Artifact> CompileTrainStep(const Graph& forward, const PipelineOptions& options,
                                          const Specialization& spec) {
  SG_ASSIGN_OR_RETURN(Graph g, OptimizeTrainStep(forward, options));
  SG_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(g, spec.PlanningBinding()));
  return Artifact{ToText(g), SerializePlan(plan)};
}

}  // namespace sg::graph
