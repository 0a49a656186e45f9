// The training graph a data-parallel runtime (FSDP, HYBRID_SHARD, DDP; compiler/fsdp.h) lowers:
// the forward + backward of a prepared training step with the optimizer taken out (the runtime
// runs AdamW itself, on each rank's shards) and two rewrites that let the runtime own parameter
// buffers and the loss normalization.
//
//   SG_ASSIGN_OR_RETURN(DataParallelGraph dp, SplitOptimizer(train_step));
//   // dp.graph: outputs "loss" and "grad:<p>"; inputs as before plus "loss_scale" (f32[])
//
// The optimizer's inputs (AdamW moments, step, lr) are dropped with it: the runtime keeps its own
// shards of them, and a full-size copy in the lowered program would cost every rank 8 bytes per
// parameter. Rewrites:
//  - every trainable parameter <p> read in the backward phase is read there from a separate,
//    non-trainable parameter "<p>@bwd", so forward and backward get separately gathered buffers
//    (ZeRO-3 re-gathers in backward instead of keeping full weights alive through the step);
//  - the loss's backward seed (the constant 1 fed to softmax_cross_entropy_backward or
//    nll_loss_backward) becomes the input "loss_scale": each rank's loss is the mean over its own
//    non-ignored tokens, and seeding its backward with (local count / global count) makes the
//    summed gradients those of the global mean.
#ifndef SGTRAIN_COMPILER_DATA_PARALLEL_GRAPH_H_
#define SGTRAIN_COMPILER_DATA_PARALLEL_GRAPH_H_

#include <string>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/training_graph.h"  // kLossScaleName
#include "graph/ir.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

inline constexpr const char* kBackwardSuffix = "@bwd";

struct DataParallelParam {
  std::string name;
  double weight_decay = 0;  // from the parameter's adamw node
};

struct DataParallelGraph {
  graph::Graph graph;
  std::vector<DataParallelParam> params;  // trainable parameters updated by AdamW, graph order
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double max_grad_norm = 0;  // <= 0: no clipping (the norm is still computed)
  std::string targets;       // the input holding the loss's targets
  int64_t ignore_index = -100;
};

// `train` is a prepared training step (graph/pipeline.h: adamw per parameter, grad_norm,
// "grad:<p>" outputs kept). InvalidArgument when it has no adamw nodes or no "grad:<p>" output
// for an updated parameter; Unimplemented when the loss output is not produced by
// softmax_cross_entropy / nll_loss directly (the runtime cannot renormalize another loss).
absl::StatusOr<DataParallelGraph> SplitOptimizer(const graph::Graph& train, const std::string& loss = "loss");

// Under mixed precision every read of a parameter <p> (and of "<p>@bwd") in `dp.graph` is a cast to
// the compute dtype (compiler/training_graph.h's ToMixedPrecision; recompute clones the cast into
// the backward). This rewrite makes such parameters sources of the compute dtype, read directly by
// the casts' readers (the casts are gone): the runtime gathers them in that dtype (PyTorch FSDP2's
// MixedPrecisionPolicy(param_dtype=bf16): half the all-gather bytes, no per-use cast of a full
// weight, half-size gathered buffers). The master weights, gradients ("grad:<p>", f32: the
// gradient casts are untouched) and the optimizer stay f32. Decided per FSDP unit (UnitOf) and
// direction (forward sources, "@bwd" sources): all of a unit's sources in one direction are
// rewritten or none, so each gather has one dtype. A graph without such casts (f32 precision) is
// returned unchanged.
//
//   SG_ASSIGN_OR_RETURN(dp, GatherInComputeDType(std::move(dp)));
absl::StatusOr<DataParallelGraph> GatherInComputeDType(DataParallelGraph dp);

// The FSDP unit a parameter belongs to: "layers.<i>" for a block's parameters, otherwise its
// first name component ("tok_embeddings", "norm", "output"). One all-gather and one gradient
// reduce-scatter bucket per unit.
std::string UnitOf(const std::string& param);

// Targets other than ignore_index in each of `parts` equal runs of `targets` (host memory, i32 or
// i64): the tokens each micro-batch's loss is the mean over.
std::vector<int64_t> CountTargetsPerPart(const TensorView& targets, int64_t ignore_index, int64_t parts);

// The step's loss from per-(rank, micro-batch) mean losses: each weighted by its count of
// non-ignored tokens, so it equals the mean over the global batch (0 when no token counts).
float TokenWeightedLoss(const std::vector<float>& losses, const std::vector<int64_t>& counts);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_DATA_PARALLEL_GRAPH_H_
