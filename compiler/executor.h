// Runs a lowered Program's schedule: the same steps on the CPU and on a CUDA device (kernel APIs
// dispatch on the tensors' device). On CUDA, after `warmup_steps` eager runs the whole schedule is
// captured into a CUDA graph and each later Run is one graph launch; steps on the communication
// stream join the capture through their events and the capture joins that stream back at its end
// (kernels/core/cuda_graph.h). Run never synchronizes the device or allocates (except once, before
// the capture: ExecutorOptions::before_capture); Synchronize() is the only blocking call.
//
//   SG_ASSIGN_OR_RETURN(auto ex, Executor::Create(program.get(), {.cuda_graph = true}));
//   SG_RETURN_IF_ERROR(ex->Run());          // enqueue one step
//   SG_RETURN_IF_ERROR(ex->Synchronize());  // wait for it (e.g. before reading the loss)
#ifndef SGTRAIN_COMPILER_EXECUTOR_H_
#define SGTRAIN_COMPILER_EXECUTOR_H_

#include <functional>
#include <memory>
#include <vector>
#include <optional>

#include "absl/status/statusor.h"
#include "compiler/lowering.h"
#include "compiler/trace.h"
#include "kernels/core/cuda_graph.h"
#include "kernels/core/stream.h"

namespace sg::compiler {

// SG_CUDA_GRAPH=0 in the environment: every executor runs eagerly (compare eager and replayed
// steps without rebuilding, e.g. the distributed benchmark under the launcher).
bool CudaGraphsDisabledByEnv();

struct ExecutorOptions {
  bool cuda_graph = true;  // CUDA only: capture the step after warm-up and replay it
  int warmup_steps = 1;    // eager runs before capture (lets libraries set up handles/workspaces)
  // Called once, right before the capture, to wait for the eager steps: capturing NCCL work while
  // eager NCCL work of the same communicator is still running can deadlock. Default: synchronize
  // both streams. A distributed step passes a wait with a deadline (compiler/dist_cuda_graph.h).
  std::function<absl::Status()> before_capture;
  // Called once, after the first eager run returns (before any capture): e.g. compiler/autotune.h
  // storing the kernel choices that run measured. An error fails that Run.
  std::function<absl::Status()> after_warmup;
};

class Executor {
 public:
  ~Executor();
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const Program* program, const ExecutorOptions& options);

  // Enqueues one run of the schedule on the compute stream.
  absl::Status Run();
  // Runs the schedule eagerly with a timestamp around every step (host clock on the CPU, CUDA
  // timing events on a GPU, which synchronizes once at the end). For traces, not for training.
  absl::StatusOr<StepTrace> RunTraced();
  absl::Status Synchronize() const { return compute_.Synchronize(); }

  const Stream& compute_stream() const { return compute_; }
  const Stream& comm_stream() const { return comm_; }
  // Step::stream 2 (activation offloading's host copies); the compute stream when none has one.
  const Stream& copy_stream() const { return copy_; }
  // Step::stream 3 (weight-gradient matmuls under LowerOptions::wgrad_stream).
  const Stream& wgrad_stream() const { return wgrad_; }
  const Stream& StreamOf(const Step& s) const {
    return s.stream == 0 ? compute_ : s.stream == 1 ? comm_ : s.stream == 2 ? copy_ : wgrad_;
  }
  bool replaying_graph() const { return graph_.valid(); }
  // Whether Run will capture the schedule after the warm-up (CUDA, cuda_graph on and not turned off
  // by SG_CUDA_GRAPH=0, the program capturable).
  bool will_capture() const;
  int64_t runs() const { return runs_; }

 private:
  Executor(const Program* p, ExecutorOptions o, Stream compute, Stream comm, Stream copy, Stream wgrad)
      : program_(p),
        options_(o),
        compute_(std::move(compute)),
        comm_(std::move(comm)),
        copy_(std::move(copy)),
        wgrad_(std::move(wgrad)) {}
  absl::Status RunEager();
  absl::Status AfterWarmup();

  const Program* program_;
  ExecutorOptions options_;
  Stream compute_;
  Stream comm_;
  Stream copy_;
  Stream wgrad_;
  CudaGraph graph_;
  // Scratch blocks the captured graph still uses (kernels/core/allocator.h), given back with it.
  std::vector<void*> held_blocks_;
  int64_t runs_ = 0;
  bool after_warmup_done_ = false;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_EXECUTOR_H_
