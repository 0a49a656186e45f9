// Mixed precision for a training step: the graph-level rewrite that runs before the graph
// layer's pipeline (graph/pipeline.h: fusion, autodiff, AdamW, CSE, DCE, recompute).
//
//   SG_ASSIGN_OR_RETURN(Graph bf16_forward, ToMixedPrecision(f32_forward));
//   SG_ASSIGN_OR_RETURN(Graph f16_forward, ToMixedPrecision(f32_forward, DType::kF16));
//   SG_ASSIGN_OR_RETURN(Graph scaled, SeedLossWithScale(f16_train_step));   // after the pipeline
//
// Naming conventions of the optimizer's sources are graph/optimizer.h's, repeated here for the
// runtime.
#ifndef SGTRAIN_COMPILER_TRAINING_GRAPH_H_
#define SGTRAIN_COMPILER_TRAINING_GRAPH_H_

#include <string>

#include "absl/status/statusor.h"
#include "graph/builder.h"
#include "graph/ir.h"

namespace sg::compiler {

enum class Precision : uint8_t {
  kF32,        // everything in f32
  kBF16Mixed,  // bf16 compute, f32 master weights, f32 gradients and optimizer state
  // f16 compute as kBF16Mixed, plus dynamic loss scaling (the loss's backward is seeded with the
  // device-resident "loss_scale"; the lowering unscales in the optimizer and skips overflowing
  // steps: compiler/compile.h's LossScaleOptions)
  kF16Mixed,
};
const char* PrecisionName(Precision p);  // "f32", "bf16", "f16"
// The compute dtype of a precision: f32, bf16 or f16.
DType ComputeDType(Precision p);

// Rewrites `forward` (built in f32) to `compute` (bf16 or f16): every floating parameter and input
// is cast to it where it is used, so all activations are 16-bit while parameters stay f32 (their
// gradients come back through the cast's VJP as f32). Ops whose type is fixed (the loss, f32[])
// keep it. Symbols, scopes, source and output names are kept.
absl::StatusOr<graph::Graph> ToMixedPrecision(const graph::Graph& forward, DType compute = DType::kBF16);

// Replaces the constant seed of the loss's backward (autodiff's fill of 1 into
// softmax_cross_entropy_backward / nll_loss_backward) in a prepared training step with the f32[]
// input "loss_scale" (kLossScaleName): every gradient, "grad:<p>" outputs included, is then the
// gradient of loss_scale * loss, while the "loss" output stays unscaled. InvalidArgument when the
// graph has no such seed, or more than one.
absl::StatusOr<graph::Graph> SeedLossWithScale(const graph::Graph& train);

// For passes that rebuild a graph node by node: when `n` (of another graph) is a parameter or an
// input, declares the same one in `b` (name, dtype, shape, trainable), stores it in *out and returns
// true; false for any other op.
bool CopySourceNode(graph::Builder& b, const graph::Node& n, graph::Value* out);

// True when `g` already holds optimizer nodes (a training graph rather than a forward graph).
bool IsTrainingGraph(const graph::Graph& g);

// Names of the optimizer's sources for a parameter.
// (graph/optimizer.h's conventions; the runtime owns "step" and "lr": it increments the step on
// the device at the start of every training step and writes lr from SetLearningRate.)
inline std::string AdamMName(const std::string& param) { return "opt.m." + param; }
inline std::string AdamVName(const std::string& param) { return "opt.v." + param; }
inline constexpr const char* kStepName = "step";
inline constexpr const char* kLrName = "lr";
// The loss's backward seed: the dynamic loss scale (kF16Mixed) or, in the data-parallel runtimes,
// the rank's share of the global token count (compiler/data_parallel_graph.h).
inline constexpr const char* kLossScaleName = "loss_scale";

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TRAINING_GRAPH_H_
