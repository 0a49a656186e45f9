// FSDP x TP on a 2-D mesh {D, T} (CompileOptions::tensor_parallel_fsdp with kTensorParallel): each
// rank holds its Megatron tp slice of every parameter (compiler/tensor_parallel_graph.h), and that
// slice is further sharded ZeRO-3 style over the D ranks of its dp group: compiler/fsdp.h's
// runtime, run over the per-rank tp graph instead of the full one.
//
//   CompileOptions o;  o.strategy = Strategy::kTensorParallel;  o.mesh = {2, 2};
//   o.tensor_parallel_fsdp = true;                // instead of DDP across mesh dim 0
//   SG_ASSIGN_OR_RETURN(auto step, Compile(forward, o));
//   step->Write("layers.0.attention.wq.weight", full);   // keeps its dp rows of its tp slice
//
// Per step, from the fsdp runtime (unchanged): per unit, the tp slices' dp shards all-gathered over
// the dp group before their first use (prefetched one unit ahead), gradients reduce-scattered
// (sum) over the dp group as soon as the unit's last one exists, AdamW on this rank's shards. From
// the tp runtime, through the fsdp runtime's hooks (DataParallelLayout): the per-rank graph
// (rewrite_graph), the tp all-reduces of partial sums and the vocabulary-parallel steps
// (rewrite_program, compiler/tensor_parallel_steps.h). The gradient norm for clipping is that of
// the whole model: every rank's local shard norm all-gathered over all D x T ranks, replicated
// parameters (norms) counted on tp rank 0 only. The loss is the token-weighted mean over the dp
// group (tp peers share a batch: data_rank() is the dp index).
// Backward reads "<p>@bwd" copies (TensorParallelGraphOptions::keep_backward_copies) gathered
// again before the unit's backward, so a gathered tp slice lives for one unit's forward or
// backward only: ZeRO-3's memory, over the tp slices. Not covered: micro-batches (as the tp
// runtime), CUDA-graph capture.
#ifndef SGTRAIN_COMPILER_TENSOR_PARALLEL_FSDP_H_
#define SGTRAIN_COMPILER_TENSOR_PARALLEL_FSDP_H_

#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/fsdp.h"
#include "compiler/tensor_parallel_graph.h"

namespace sg::compiler {

struct TpStepResources;  // compiler/tensor_parallel_steps.h

class TensorParallelFsdpStep final : public ShardedDataParallelStep {
 public:
  // `train`: the prepared training step. `tp`, `dp`: this rank's groups on the mesh (tp peers
  // share a batch, dp peers share tp slices); `all`: every rank of the mesh (the grad norm).
  // Collective: every rank calls it with the same graph and options. Errors as
  // BuildTensorParallelGraph's and ShardedDataParallelStep::Create's.
  static absl::StatusOr<std::unique_ptr<TensorParallelFsdpStep>> Create(const graph::Graph& train,
                                                                       const CompileOptions& options,
                                                                       comm::ProcessGroup* tp, comm::ProcessGroup* dp,
                                                                       comm::ProcessGroup* all,
                                                                       std::shared_ptr<DistContext> context,
                                                                       std::string explanation);
  // Parameters, "opt.m.<p>", "opt.v.<p>" take and "grad:<p>" also gives full (global) tensors:
  // Write keeps this rank's dp rows of its tp slice; Read gathers over both groups (collective).
  absl::Status Write(const std::string& name, const TensorView& host) override;
  absl::Status Read(const std::string& name, const TensorView& host) const override;

  const TensorParallelGraph& tp_graph() const { return tp_; }
  ~TensorParallelFsdpStep() override;

 private:
  TensorParallelFsdpStep() = default;
  // The tp parameter `name` names (bare, "opt.m.", "opt.v.", "grad:"), or null.
  const TpParam* FindTpParam(const std::string& name) const;

  comm::ProcessGroup* tp_group_ = nullptr;
  int tp_size_ = 1, tp_rank_ = 0;
  TensorParallelGraph tp_;
  std::set<std::string> split_;  // parameters split over the tp group
  std::unique_ptr<Event> tp_ready_;
  std::unique_ptr<TpStepResources> tp_steps_;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TENSOR_PARALLEL_FSDP_H_
