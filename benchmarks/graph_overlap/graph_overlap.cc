#include "benchmarks/graph_overlap/graph_overlap.h"

#include "absl/status/status.h"

namespace sg::benchmarks {

#ifdef SG_WITH_CUDA
absl::StatusOr<double> RunOverlapProbeCuda(const OverlapProbe& p);  // graph_overlap.cu
#endif

absl::StatusOr<double> RunOverlapProbe(const OverlapProbe& p) {
#ifdef SG_WITH_CUDA
  return RunOverlapProbeCuda(p);
#else
  (void)p;
  return absl::FailedPreconditionError("RunOverlapProbe: built without CUDA");
#endif
}

}  // namespace sg::benchmarks
