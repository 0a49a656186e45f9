// CUDA graphs for the distributed steps (FSDP / HYBRID_SHARD / DDP: compiler/fsdp.h; tensor
// parallel: compiler/tensor_parallel.h): after CompileOptions::warmup_steps eager steps the whole
// step -- kernels on the compute stream, collectives on the communication stream -- is captured
// into one CUDA graph and every later Run is the host-side batch preparation plus one launch.
//
//   eo.before_capture = [this] { return WaitForStep(*executor_, group, timeout); };
//   absl::StrAppend(&explanation_, "; ", GraphModeExplanation(options, *executor_));
//   SG_RETURN_IF_ERROR(WaitForStep(*executor_, group, timeout));   // ReadMetrics: never forever
//
// Why the ring device path and not NCCL's native collectives while capturing: the ring path
// (comm/ring_device.cc) is capturable once it only records and waits on events it created once,
// issues NCCL send/recv (capturable since NCCL 2.9) and never synchronizes or allocates after its
// buffers have grown in the warm-up (comm/process_group.h, "CUDA graphs"). It serves sub-groups
// (HYBRID_SHARD's shard and replicate groups, tensor parallelism's rows and columns), which
// ProcessGroup's Native* collectives do not (full group only), and eager and replayed steps then
// run the same algorithm, so they agree to the last bit where the kernels are deterministic.
//
// What runs where in a replayed step:
//  - host, before the launch (Run): the batch's token counts are all-gathered over the HOST
//    transport (deadline and abort flag as every collective), the loss seeds and inputs are staged
//    through pinned buffers on the compute stream (InputStaging; no device synchronization);
//  - device, in the graph: every step of the schedule. The communication stream forks from the
//    compute stream at each collective step (an event recorded on compute, waited on by comm), and
//    the transport's and the reduce stream fork from it inside comm/; all join back (the schedule
//    ends with a wait on the comm stream; CudaGraph::Capture joins the comm stream again).
//  - nothing in the graph reads a host value at launch: the loss seed is read on the device by the
//    cross-entropy kernel (LowerOptions::device_scalars), the learning rate and step counter live
//    in device memory.
// Every rank captures at the same Run (the same warmup_steps, the same schedule), so the captured
// NCCL operations match across ranks, and before capturing each rank waits for its eager steps
// (ExecutorOptions::before_capture): eager and captured NCCL work of one communicator must not be
// in flight together.
//
// Failure detection while replaying: sequence numbers, progress keys and collective deadlines are
// host-side and advance only when a collective is captured, so a replayed step has no deadline of
// its own. Two things bound it: (1) the next Run's host all-gather of token counts fails within
// comm_timeout_s (or at once on the group's abort flag, which the health monitor, comm/health.h,
// sets) naming the rank that did not arrive; (2) WaitForStep -- ReadMetrics, Read, Write, and the
// wait before the capture -- polls the step's completion with the deadline comm_timeout_s and the
// group's abort flag (every 100 ms); on either it aborts the NCCL communicator (ncclCommAbort: the
// kernels waiting on the dead peer return, so the streams drain and the step can be destroyed),
// sets the abort flag for the peers and returns DeadlineExceeded / Aborted. A dead peer thus
// becomes an error instead of a hang, eager or replayed.
//
// Not captured (eager, and the explanation says why): the CPU, CompileOptions::cuda_graph false,
// SG_CUDA_GRAPH=0 in the environment, a program that reads a host value at launch, and context
// parallelism (its ring attention's point-to-point exchanges are not verified under capture).
#ifndef SGTRAIN_COMPILER_DIST_CUDA_GRAPH_H_
#define SGTRAIN_COMPILER_DIST_CUDA_GRAPH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "compiler/compile.h"
#include "compiler/executor.h"

namespace sg::compiler {

// Eager steps before a distributed step is captured, at least: the first eager step makes the
// one-time allocations (ring scratch, staging, NCCL buffers) that reshuffle the caching allocator,
// and a capture may not allocate; after the second, every scratch size a step asks for is cached
// (on the H200 one warm-up step left the cross-entropy's 64-byte scratch without a free block).
constexpr int kMinDistributedWarmup = 2;

// One clause for a distributed step's explanation: "CUDA graph: the whole step ... is captured
// after 1 eager warm-up step, then replayed" or "eager (<why>)". `runtime_reason`: why the runtime
// itself turned capture off (named when options and environment would have allowed it).
std::string GraphModeExplanation(const CompileOptions& options, const Executor& executor,
                                 absl::string_view runtime_reason = "");

// Waits for every step queued on the executor's compute stream (the communication stream is joined
// into it at the end of each step). With a group on a CUDA device: ProcessGroup::WaitStream with
// the deadline now + `timeout` (aborting the device transport on a timeout or a group abort); a
// null group or the CPU: Executor::Synchronize.
absl::Status WaitForStep(const Executor& executor, comm::ProcessGroup* group, absl::Duration timeout);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_DIST_CUDA_GRAPH_H_
