#include "compiler/cuda_graph.h"

#include <utility>

#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::compiler {

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    this->~CudaGraph();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

#ifdef SG_WITH_CUDA

absl::StatusOr<CudaGraph> CudaGraph::Capture(const Stream& stream, const std::function<absl::Status()>& body) {
  if (!stream.device().is_cuda()) {
    return absl::FailedPreconditionError("CudaGraph::Capture: expected a CUDA stream, found a CPU stream");
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  SG_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const absl::Status body_status = body();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (!body_status.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return body_status;
  }
  SG_CUDA_RETURN_IF_ERROR(end);
  CudaGraph g;
  g.graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  SG_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  g.exec_ = exec;
  return g;
}

absl::Status CudaGraph::Launch(const Stream& stream) const {
  if (exec_ == nullptr) return absl::FailedPreconditionError("CudaGraph::Launch: nothing captured");
  SG_CUDA_RETURN_IF_ERROR(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream.native())));
  return absl::OkStatus();
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

#else

absl::StatusOr<CudaGraph> CudaGraph::Capture(const Stream&, const std::function<absl::Status()>&) {
  return absl::FailedPreconditionError("CudaGraph::Capture: built without CUDA");
}
absl::Status CudaGraph::Launch(const Stream&) const {
  return absl::FailedPreconditionError("CudaGraph::Launch: built without CUDA");
}
CudaGraph::~CudaGraph() = default;

#endif

}  // namespace sg::compiler
