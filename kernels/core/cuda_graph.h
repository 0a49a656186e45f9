// A captured CUDA graph: record everything a function enqueues on a stream once, replay it with
// one launch. The compiler's executor captures the whole training step after warm-up
// (compiler/executor.h); the kernel benchmarks time replays of a batch of calls
// (testing::TimeGraphReplays, kernels/core/benchmark_timing.h).
//
//   SG_ASSIGN_OR_RETURN(CudaGraph g, CudaGraph::Capture(stream, [&] { return RunSchedule(stream); }));
//   SG_RETURN_IF_ERROR(g.Launch(stream));   // each step
//
// Capture is thread-local (cudaStreamCaptureModeThreadLocal): other threads may keep using CUDA.
// Everything the function touches must stay at the same addresses for the graph's lifetime, and
// it must not synchronize, allocate through cudaMalloc, or copy from pageable host memory.
//
// Several streams: work on another stream joins the capture when that stream waits on an event
// recorded in a capturing stream (fork: the schedule's collective steps do this for the
// communication stream, and comm/ for its own streams); every such stream must be joined back --
// the capturing stream waits on an event recorded on it -- before the capture ends. Capture joins
// the streams it is given (the executor's communication stream) itself.
//
// Memory the body frees during the capture is still used by every replay: a caller whose body
// frees through the caching allocator brackets Capture with Allocator::BeginHoldingFrees() /
// EndHoldingFrees() and releases the held blocks only after the graph is destroyed.
#ifndef SGTRAIN_KERNELS_CORE_CUDA_GRAPH_H_
#define SGTRAIN_KERNELS_CORE_CUDA_GRAPH_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/stream.h"

namespace sg {

class CudaGraph {
 public:
  // Runs `body` under stream capture on `stream` (a CUDA stream) and instantiates the result.
  // Each stream of `join` that body made part of the capture is joined back into `stream` after
  // body (one event; a stream body never forked is left alone). body's error is returned after the
  // capture is ended (the stream stays usable). FailedPrecondition without CUDA or for a CPU stream.
  // node_priority: the replays keep each kernel's priority (its stream's or launch attribute's at
  // capture; cudaGraphInstantiateFlagUseNodePriority); otherwise they run at the launch stream's.
  static absl::StatusOr<CudaGraph> Capture(const Stream& stream, const std::function<absl::Status()>& body,
                                           const std::vector<const Stream*>& join = {}, bool node_priority = false);

  CudaGraph() = default;
  CudaGraph(CudaGraph&& o) noexcept { *this = std::move(o); }
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  ~CudaGraph();

  // Enqueues one replay on `stream`.
  absl::Status Launch(const Stream& stream) const;
  bool valid() const { return exec_ != nullptr; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_CUDA_GRAPH_H_
