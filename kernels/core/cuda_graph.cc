#include "kernels/core/cuda_graph.h"

#include <utility>

#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg {

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    this->~CudaGraph();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

#ifdef SG_WITH_CUDA

namespace {

// Makes `s` wait for everything captured on each stream of `join` that is part of the capture.
absl::Status JoinCapture(cudaStream_t s, const std::vector<const Stream*>& join, std::vector<cudaEvent_t>* events) {
  for (const Stream* j : join) {
    if (j == nullptr || j->native() == nullptr || j->native() == static_cast<void*>(s)) continue;
    cudaStream_t js = static_cast<cudaStream_t>(j->native());
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SG_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(js, &status));
    if (status != cudaStreamCaptureStatusActive) continue;
    cudaEvent_t e = nullptr;
    SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events->push_back(e);
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, js));
    SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, e, 0));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CudaGraph> CudaGraph::Capture(const Stream& stream, const std::function<absl::Status()>& body,
                                             const std::vector<const Stream*>& join, bool node_priority) {
  if (!stream.device().is_cuda()) {
    return absl::FailedPreconditionError("CudaGraph::Capture: expected a CUDA stream, found a CPU stream");
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  SG_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  absl::Status body_status = body();
  std::vector<cudaEvent_t> join_events;
  if (body_status.ok()) body_status = JoinCapture(s, join, &join_events);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  for (cudaEvent_t e : join_events) cudaEventDestroy(e);
  if (!body_status.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return body_status;
  }
  SG_CUDA_RETURN_IF_ERROR(end);
  CudaGraph g;
  g.graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  SG_CUDA_RETURN_IF_ERROR(
      cudaGraphInstantiate(&exec, graph, node_priority ? cudaGraphInstantiateFlagUseNodePriority : 0));
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

absl::StatusOr<CudaGraph> CudaGraph::Capture(const Stream&, const std::function<absl::Status()>&,
                                             const std::vector<const Stream*>&, bool) {
  return absl::FailedPreconditionError("CudaGraph::Capture: built without CUDA");
}
absl::Status CudaGraph::Launch(const Stream&) const {
  return absl::FailedPreconditionError("CudaGraph::Launch: built without CUDA");
}
CudaGraph::~CudaGraph() = default;

#endif

}  // namespace sg
