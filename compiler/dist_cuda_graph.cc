#include "compiler/dist_cuda_graph.h"

#include "absl/strings/str_cat.h"

namespace sg::compiler {

std::string GraphModeExplanation(const CompileOptions& o, const Executor& executor, absl::string_view runtime_reason) {
  if (executor.will_capture()) {
    const int warmup = std::max(o.warmup_steps, kMinDistributedWarmup);
    return absl::StrCat("CUDA graph: the whole step (collectives included) is captured after ", warmup,
                        " eager warm-up steps, then replayed");
  }
  if (!o.device.is_cuda()) return "eager (CPU: no CUDA graphs)";
  if (!o.cuda_graph) return "eager (CompileOptions::cuda_graph is off)";
  if (CudaGraphsDisabledByEnv()) return "eager (SG_CUDA_GRAPH=0)";
  if (!runtime_reason.empty()) return absl::StrCat("eager (", runtime_reason, ")");
  return "eager (a step reads a host value when it is launched, which a graph replay would not see)";
}

absl::Status WaitForStep(const Executor& executor, comm::ProcessGroup* group, absl::Duration timeout) {
  if (group == nullptr || !executor.compute_stream().device().is_cuda()) return executor.Synchronize();
  return group->WaitStream(executor.compute_stream(), absl::Now() + timeout);
}

}  // namespace sg::compiler
