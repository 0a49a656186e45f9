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
// Activations cross stages through host buffers (UCX); on CUDA each action synchronizes the
// device before its send. Run returns after the step (it synchronizes).
// Write/Read take full tensors by model name on every rank: Write keeps what the stage owns, Read
// broadcasts from the owner (collective: every rank calls it in the same order).
// Not yet: FSDP within a stage (the design: the stage program's parameters become transient
// sources gathered per unit as in compiler/fsdp.h, and the dp all-reduce of the accumulated
// gradients a reduce-scatter into shards), recompute policies other than the full recompute above,
// CUDA-graph capture of the stage program.
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
  // The last Run's actions on this stage and their busy intervals (seconds from the step's start,
  // without the waits for messages): schedule.h's BubbleFraction over every stage's intervals.
  const std::vector<PipelineAction>& last_actions() const { return actions_; }
  const std::vector<Interval>& last_times() const { return times_; }

 private:
  struct Param;
  PipelineStep() = default;
  absl::Status Build(const graph::Graph& forward, const CompileOptions& options);
  absl::Status RunSteps(bool forward_only);
  absl::Status Feed(const std::string& name, const TensorView& src);
  absl::Status Accumulate(float weight);
  absl::Status RefreshWeightCopies();
  absl::Status Optimize();

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
};

// What Compile runs for Strategy::kPipeline.
absl::StatusOr<std::unique_ptr<CompiledStep>> CompilePipeline(const graph::Graph& forward, const CompileOptions& options);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_PP_STEP_H_
