// The tensor-parallel runtime (Megatron): Compile(graph, {.strategy = kTensorParallel, .mesh})
// lands here through compiler/distributed.h. Tensor parallelism runs over the mesh's last dim
// (all of a 1-D mesh); a 2-D mesh {D, T} adds data parallelism (DDP) across dim 0.
//
//   // on every rank, started by //comm:launch --nproc=2 (or torchrun, mpirun, srun):
//   CompileOptions o; o.strategy = Strategy::kTensorParallel;   // mesh {} = {world size}
//   o.binding = {{"batch", 8}, {"seq", 512}};   // the tp ranks see the same batch
//   SG_ASSIGN_OR_RETURN(auto step, Compile(forward, o));
//   for (auto& [name, full] : init) SG_RETURN_IF_ERROR(step->Write(name, full));  // keeps its slice
//   SG_RETURN_IF_ERROR(step->Run(batch));
//
// Each rank lowers its own graph (compiler/tensor_parallel_graph.h: local weight slices, heads/T
// attention heads, ffn/T) and runs it with, per partial sum the placements call for, an in-place
// all-reduce (sum) over the tp group on the comm stream: issued once the partial sum is complete,
// waited for just before its first reader needs the sum, so independent compute (e.g. the weight
// gradients in backward) overlaps it. Per Llama block that is the row-parallel wo / w2 outputs in
// forward and the input gradients of the column-parallel wq/wk/wv and w1/w3 in backward.
// Parameters, their gradients and AdamW state stay in their placements: split weights as local
// slices, replicated ones (norms, embedding, LM head) whole on every rank, with gradients that
// agree across the tp group because everything they depend on does. The optimizer:
//   grad norm  sqrt(sum over tp ranks of |split grads|^2 + |replicated grads|^2): local sums, the
//              split part all-gathered over the tp group, then one GradNorm over the pieces;
//   AdamW      one multi-tensor launch over this rank's slices and the replicated parameters.
// With data parallelism each unit's gradients (a block's, the embedding's, ...) are all-reduced
// (sum) over the dp group on the comm stream as soon as the unit's last one exists, and the loss
// is each rank's token-weighted share of the global mean (as in compiler/fsdp.h).
// Not lowered yet: FSDP across dim 0 (the natural route is compiler/fsdp.h's runtime over this
// per-rank graph, its grad norm counting replicated weights on tp rank 0 only), vocab-parallel
// embedding / LM head / cross-entropy, sequence parallelism (the sharding layer plans all three),
// and CUDA-graph capture (as for FSDP: the ring collectives and the host loss seed).
#ifndef SGTRAIN_COMPILER_TENSOR_PARALLEL_H_
#define SGTRAIN_COMPILER_TENSOR_PARALLEL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/tensor_parallel_graph.h"
#include "kernels/core/stream.h"
#include "sharding/mesh.h"

namespace sg::compiler {

// Which ranks a tensor-parallel step talks to. Null groups are this rank alone.
struct TensorParallelLayout {
  comm::ProcessGroup* tp = nullptr;  // splits the weights
  comm::ProcessGroup* dp = nullptr;  // holds identical slices, each with its own share of the batch
};

class TensorParallelStep : public CompiledStep {
 public:
  // `train`: the prepared (full-size) training step. Collective: every rank calls it with the
  // same graph and options. Errors as BuildTensorParallelGraph's (indivisible heads, ffn).
  static absl::StatusOr<std::unique_ptr<TensorParallelStep>> Create(const graph::Graph& train,
                                                                   const CompileOptions& options,
                                                                   TensorParallelLayout layout,
                                                                   std::shared_ptr<DistContext> context,
                                                                   std::string explanation);

  absl::Status Run(const std::map<std::string, TensorView>& batch) override;
  absl::StatusOr<StepMetrics> ReadMetrics() const override;
  absl::Status SetLearningRate(float lr) override;
  // Parameters, "opt.m.<p>", "opt.v.<p>" take and "grad:<p>" also gives full tensors (Read of a
  // split one gathers: collective over the tp group); "loss" and "grad_norm" are global values.
  absl::Status Write(const std::string& name, const TensorView& host) override;
  absl::Status Read(const std::string& name, const TensorView& host) const override;
  // This rank's slice of a parameter, its optimizer state or "grad:<p>"; otherwise as the base.
  absl::StatusOr<TensorView> View(const std::string& name) const override;
  absl::StatusOr<StepTrace> TraceStep(const std::map<std::string, TensorView>& batch) override;

  const TensorParallelGraph& tp_graph() const { return tp_; }
  ~TensorParallelStep() override;

 private:
  struct Param;
  TensorParallelStep() = default;
  absl::Status Build(const graph::Graph& train, const CompileOptions& options);
  absl::Status Allocate();
  absl::Status Schedule();
  absl::Status PrepareBatch(const std::map<std::string, TensorView>& batch);
  // CompiledStep::CommStep ordered after compute through this step's `ready_` event.
  Step CommStep(std::string name, graph::Phase phase, std::function<absl::Status(const Stream&)> body, Event* done) {
    return CompiledStep::CommStep(std::move(name), phase, ready_.get(), std::move(body), done);
  }
  const Param* FindParam(const std::string& name, const std::string& prefix) const;

  TensorParallelLayout layout_;
  std::shared_ptr<DistContext> context_;
  TensorParallelGraph tp_;
  int tp_size_ = 1, tp_rank_ = 0, dp_size_ = 1;
  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, int> param_index_;
  DeviceMemory moments_, scalars_;
  TensorView lr_, counter_, norm_split_, norms_, norm_repl_, norm_, clip_, losses_, dummy_[2];
  std::shared_ptr<void> all_list_, split_list_, repl_list_, norm_list_;  // kernels::AdamWTensorList
  std::vector<std::unique_ptr<Event>> reduce_done_;
  std::unique_ptr<Event> ready_, grads_done_, norms_done_, comm_done_;
  std::string targets_;  // the input holding the loss's targets
  int64_t ignore_index_ = -100;
  std::vector<int64_t> counts_;  // non-ignored tokens per dp rank, last Run
  float loss_scale_host_ = 1;  // this Run's loss seed, staged to the device
  absl::Duration comm_timeout_ = absl::Seconds(300);  // CompileOptions::comm_timeout_s
  // Waits for the queued steps with the deadline comm_timeout_ (compiler/dist_cuda_graph.h).
  absl::Status Wait() const;
  double max_grad_norm_ = 0;
  float beta1_ = 0.9f, beta2_ = 0.95f, eps_ = 1e-8f;
};

// Compile's kTensorParallel: tp over `mesh`'s last dim, DDP over dim 0 of a 2-D mesh. `train` is
// the prepared training step; `why` (e.g. the planner's explanation) starts explanation().
// InvalidArgument for a mesh of more than 2 dims. The binding is per tp group: its ranks take the
// same batch (CompiledStep::data_rank()).
absl::StatusOr<std::unique_ptr<CompiledStep>> CompileTensorParallel(const graph::Graph& train,
                                                                   const CompileOptions& options,
                                                                   std::shared_ptr<DistContext> context,
                                                                   const sharding::DeviceMesh& mesh,
                                                                   const std::string& why = "");

// OK when `train` (a prepared training step) splits over `tp_size` ranks: kAuto's test before it
// offers tensor parallelism to the planner. Otherwise BuildTensorParallelGraph's error.
absl::Status TensorParallelApplies(const graph::Graph& train, int tp_size, const std::string& loss = "loss");

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TENSOR_PARALLEL_H_
