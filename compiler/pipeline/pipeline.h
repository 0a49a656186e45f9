// One pipeline-parallel training step (forward and backward of every micro-batch, gradients
// accumulated) over the ranks of a pipeline group, rank s running stage s in the 1F1B order of
// schedule.h. Activations go forward and their gradients backward with point-to-point messages.
//
//   PipelineOptions opt;  opt.activation_shape = {micro_batch, seq, dim};
//   SG_ASSIGN_OR_RETURN(PipelineStepResult r, RunPipelineStep(*stage, *pp_group, micro_batches, opt));
//   // r.grads: this stage's "grad:<param>" of the mean loss; r.loss on the last stage
//
// micro_batches[i] holds the stage's data inputs for micro-batch i: "tokens" on stage 0,
// "targets" on the last stage, nothing on the others. The loss is the mean of the micro-batch
// losses, so with equal micro-batches and no ignored targets it equals the whole batch's mean
// and the gradients equal the whole batch's.
//
// Messages: micro-batch i's activation uses tag opt.tag + 2i, its gradient opt.tag + 2i + 1. Sends
// are asynchronous (buffers kept until the step ends), receives wait with opt.timeout and fail
// with DeadlineExceeded naming the micro-batch, direction and peer. The optimizer update is the
// caller's (after a data-parallel all-reduce of r.grads, if any).
#ifndef SGTRAIN_COMPILER_PIPELINE_PIPELINE_H_
#define SGTRAIN_COMPILER_PIPELINE_PIPELINE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "compiler/pipeline/schedule.h"
#include "compiler/pipeline/stage.h"
#include "graph/interpreter.h"

namespace sg::compiler {

struct PipelineOptions {
  Shape activation_shape;  // [micro_batch, seq, dim]: what crosses each stage boundary
  uint64_t tag = uint64_t(1) << 30;
  absl::Duration timeout = absl::Seconds(300);
};

struct PipelineStepResult {
  double loss = 0;  // mean over micro-batches (last stage; 0 elsewhere)
  graph::Feeds grads;  // "grad:<param>" of this stage's parameters, for the mean loss
  // Each action's [start, end] in seconds from the step's start (after the entry barrier), in
  // schedule order, without the waits for messages: the busy time the bubble is measured against.
  std::vector<PipelineAction> actions;
  std::vector<Interval> times;
};

absl::StatusOr<PipelineStepResult> RunPipelineStep(StageExecutor& stage, comm::ProcessGroup& pp_group,
                                                   const std::vector<graph::Feeds>& micro_batches,
                                                   const PipelineOptions& options);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_PIPELINE_H_
