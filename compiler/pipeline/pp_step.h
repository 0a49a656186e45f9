// Pipeline parallelism through the one declarative call: Compile(graph, {.strategy = kPipeline})
// (registered by this target; link //compiler/pipeline:pp_step). The captured model graph is cut
// into stages (graph_split.h), each stage's forward+backward is lowered by the compiler like any
// step (compiler/lowering.h: memory-planned arena, the kernels), and Run drives one training step
// as 1F1B over micro-batches (schedule.h) with activations and their gradients sent between
// neighbouring stages point-to-point.
//
//   // on every rank, started by //comm:launch --nproc=4:
//   CompileOptions o;  o.strategy = Strategy::kPipeline;  o.micro_batches = 8;
//   o.binding = {{"batch", 16}, {"seq", 2048}};   // the whole step's batch, split into 8
//   // or: o.mesh = {2, 2}; o.pipeline_fsdp = true;  // 2 replicas x 2 stages, each stage's
//   //     parameters sharded over its 2 replicas; the batch above is then each replica's
//   SG_ASSIGN_OR_RETURN(auto step, Compile(forward, o));
//   for (auto& [name, full] : init) SG_RETURN_IF_ERROR(step->Write(name, full));  // keeps its stage's
//   SG_RETURN_IF_ERROR(step->Run(batch));    // every rank passes the same batch (stage 0 reads
//                                            // "tokens", the last stage "targets")
//
// Mesh {pp} (default: every rank) or {dp, pp}: rank r runs stage r % pp of replica r / pp, and
// each replica takes its own batch (the binding's batch is per replica, as under FSDP). Per step:
//  - forward of micro-batch i: the stage program's forward-phase steps; h_out is sent to s+1;
//  - backward of i: the whole stage program again (forward recomputed: a stage keeps only its
//    input per micro-batch in flight, at most p-s of them) with the cotangent from s+1; the
//    parameter gradients are accumulated; grad h_in is sent to s-1. The last stage runs forward
//    and backward together at F(i) (1F1B puts B(i) right after it) and sends at B(i);
//  - loss = the global token mean: micro-batch i's loss and gradients are weighted by its share of
//    the non-ignored targets, so any micro-batch count trains exactly like one device;
//  - optimizer: with replicas, the accumulated gradients all-reduced over the dp group (the
//    micro-batch weights count every replica's tokens); the global gradient norm (local sums of
//    squares all-reduced over the stages) for clipping, then one multi-tensor AdamW over the
//    stage's parameters.
// FSDP within a stage (CompileOptions::pipeline_fsdp, mesh {dp, pp}): the stage's parameters,
// their AdamW moments and the reduced gradients are sharded by rows over the dp group (ShardBucket,
// compiler/shard_bucket.h: torch.chunk rows, one bucketed collective). Run all-gathers the shards
// into the stage program's full parameters before the first micro-batch and keeps them for the
// step's 2m forward/backward passes (one gather per step instead of one per pass, the choice
// torchtitan makes for PP + FSDP), reduce-scatters (sum) the accumulated full gradients after the
// stage's last backward, and runs AdamW on the shard; the gradient norm sums every rank's shard.
// Transfers between stages (stage_link.h): on CUDA with NCCL, device to device on the
// communication stream, ordered against the compute stream by events, each action's send paired
// with the next action's receive; the host never waits inside the schedule (per-action busy times
// come from CUDA events). On the CPU (or CUDA without NCCL) through host buffers over UCX.
// Run returns after the step (the optimizer's norm all-reduce synchronizes).
// Write/Read take full tensors by model name on every rank: Write keeps what the stage owns (its
// rows under pipeline_fsdp), Read gathers (dp) and broadcasts from the owner stage (collective:
// every rank calls it in the same order).
// Not yet: transient (per-pass) full parameters under pipeline_fsdp (today the full f32 weights and
// the full gradient accumulator live for the whole step; the moments and master shards are 1/dp),
// recompute policies other than the full recompute above, CUDA-graph capture of the stage program.
#ifndef SGTRAIN_COMPILER_PIPELINE_PP_STEP_H_
#define SGTRAIN_COMPILER_PIPELINE_PP_STEP_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/pipeline/graph_split.h"
#include "compiler/pipeline/schedule.h"
#include "compiler/pipeline/stage_link.h"
#include "compiler/shard_bucket.h"
#include "graph/ir.h"

namespace sg::compiler {

class PipelineStep : public CompiledStep {
 public:
  // Collective over the world: every rank calls it with the same graph and options.
  static absl::StatusOr<std::unique_ptr<PipelineStep>> Create(const graph::Graph& forward, const CompileOptions& options);
  ~PipelineStep() override;

  absl::Status Run(const std::map<std::string, TensorView>& batch) override;
  absl::StatusOr<StepMetrics> ReadMetrics() const override;
  absl::Status SetLearningRate(float lr) override;
  absl::Status Write(const std::string& name, const TensorView& host) override;
  absl::Status Read(const std::string& name, const TensorView& host) const override;
  // Unimplemented: a pipeline step's timeline is last_actions() / last_times().
  absl::StatusOr<StepTrace> TraceStep(const std::map<std::string, TensorView>& batch) override;

  int stage() const { return spec_.stage; }
  int num_stages() const { return spec_.num_stages; }
  int micro_batches() const { return micro_; }
  // f32 elements of AdamW state (m and v) this rank keeps: its stage's parameters' twice, or under
  // pipeline_fsdp its rows of them.
  int64_t optimizer_state_elements() const;
  bool device_transfers() const { return link_->device_path(); }
  // The last Run's actions on this stage and their busy intervals (seconds from the step's start,
  // without the waits for messages): schedule.h's BubbleFraction over every stage's intervals.
  const std::vector<PipelineAction>& last_actions() const { return actions_; }
  const std::vector<Interval>& last_times() const { return times_; }

 private:
  struct Param;
  PipelineStep() = default;
  absl::Status Build(const graph::Graph& forward, const CompileOptions& options);
  // Build's steps, in order: the mesh and its pp / dp groups and the micro-batch split (returns the
  // number of stages); this rank's stage graph lowered and its executor (returns its parameters'
  // names); their accumulators, AdamW state (sharded over dp under pipeline_fsdp) and scalars;
  // the stage link to the neighbours, the timing events and the explanation.
  absl::StatusOr<int> SetUpGroups(const CompileOptions& options);
  absl::StatusOr<std::vector<std::string>> LowerStage(const graph::Graph& forward, int stages,
                                                      const CompileOptions& options);
  absl::Status AllocateOptimizer(const std::vector<std::string>& parameters, const CompileOptions& options);
  absl::Status StartLink(const CompileOptions& options);
  // Run's steps: the batch cut into micro-batches (host inputs staged onto the device into
  // `staged`, which Run keeps until it returns), then the 1F1B schedule over them (the sends and
  // receives and each action's compute; ends with the link's last transfers).
  struct RunState;
  using MicroBatches = std::vector<std::map<std::string, TensorView>>;  // per micro-batch: input -> its rows
  absl::StatusOr<MicroBatches> SplitMicroBatches(const std::map<std::string, TensorView>& batch,
                                                 std::vector<Tensor>* staged);
  absl::Status RunSchedule(const MicroBatches& micro, const std::vector<float>& weight);
  // Action k of the schedule, its message (if it needs one) received and its start marked;
  // `w`: its micro-batch's weight.
  absl::Status RunAction(RunState& r, size_t k, const TensorView& received, float w);
  // Whether action k (none past the end) needs a message first, and which kind; posting its receive.
  bool Needs(const RunState& r, size_t k, StageLink::Kind* kind) const;
  absl::Status PostNeeded(const RunState& r, size_t k);
  // Feeds micro-batch i's inputs (and its received h_in off stage 0) into the stage program.
  absl::Status FeedMicro(const RunState& r, int i);
  // Records action k's start or end (a CUDA timing event, or seconds since the schedule's start).
  absl::Status Mark(const RunState& r, size_t k, bool end);
  absl::Status RunSteps(bool forward_only);
  absl::Status Feed(const std::string& name, const TensorView& src);
  absl::Status Accumulate(float weight);
  absl::StatusOr<std::vector<float>> MicroBatchWeights(const std::map<std::string, TensorView>& batch);
  absl::Status RefreshWeightCopies();
  absl::Status Optimize();
  // The last Run's per-action busy intervals from the CUDA timing events (after the step synced).
  absl::Status ReadEventTimes();
  // pipeline_fsdp: the stage's shards of `which` (&Param::shard, &Param::m, ...), in param order.
  std::vector<TensorView> Shards(Tensor Param::*which) const;

  std::shared_ptr<DistContext> context_;
  comm::ProcessGroup* pp_ = nullptr;  // this rank's pipeline: the ranks holding the other stages
  comm::ProcessGroup* dp_ = nullptr;  // the ranks holding this stage in the other replicas (or null)
  StageSpec spec_;
  int micro_ = 1;
  int64_t micro_batch_ = 0;
  absl::Duration timeout_;
  graph::AdamWOptions adamw_;
  std::string loss_name_, targets_name_;
  int64_t ignore_index_ = -100;
  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, int> param_index_;
  std::map<std::string, std::pair<int, int64_t>> owner_;  // every model parameter: (stage, numel)
  Shape act_shape_;
  DType act_dtype_ = DType::kF32;
  DeviceMemory scalars_;
  TensorView lr_, counter_, norm_, clip_;
  std::shared_ptr<void> list_;  // kernels::AdamWTensorList over the stage's parameters
  float loss_ = 0, grad_norm_ = 0;
  std::vector<PipelineAction> actions_;
  std::vector<Interval> times_;
  std::unique_ptr<StageLink> link_;
  std::unique_ptr<ShardBucket> bucket_;  // pipeline_fsdp: the stage's parameters over dp_
  TensorView loss_sum_;                  // device f32: the weighted loss of this step's micro-batches
  std::vector<Event> timing_;            // CUDA: step start, then each action's start and end
};

// What Compile runs for Strategy::kPipeline.
absl::StatusOr<std::unique_ptr<CompiledStep>> CompilePipeline(const graph::Graph& forward, const CompileOptions& options);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_PP_STEP_H_
