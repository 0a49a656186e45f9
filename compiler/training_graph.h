// Mixed precision for a training step: the graph-level rewrite that runs before the graph
// layer's pipeline (graph/pipeline.h: fusion, autodiff, AdamW, CSE, DCE, recompute).
//
//   SG_ASSIGN_OR_RETURN(Graph bf16_forward, ToMixedPrecision(f32_forward));
//
// Naming conventions of the optimizer's sources are graph/optimizer.h's, repeated here for the
// runtime.
#ifndef SGTRAIN_COMPILER_TRAINING_GRAPH_H_
#define SGTRAIN_COMPILER_TRAINING_GRAPH_H_

#include <string>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::compiler {

enum class Precision : uint8_t {
  kF32,        // everything in f32
  kBF16Mixed,  // bf16 compute, f32 master weights, f32 gradients and optimizer state
};

// Rewrites `forward` (built in f32) to bf16 compute: every floating parameter and input is cast
// to bf16 where it is used, so all activations are bf16 while parameters stay f32 (their
// gradients come back through the cast's VJP as f32). Ops whose type is fixed (the loss, f32[])
// keep it. Symbols, scopes, source and output names are kept.
absl::StatusOr<graph::Graph> ToMixedPrecision(const graph::Graph& forward);

// True when `g` already holds optimizer nodes (a training graph rather than a forward graph).
bool IsTrainingGraph(const graph::Graph& g);

// Names of the optimizer's sources for a parameter.
// (graph/optimizer.h's conventions; the runtime owns "step" and "lr": it increments the step on
// the device at the start of every training step and writes lr from SetLearningRate.)
inline std::string AdamMName(const std::string& param) { return "opt.m." + param; }
inline std::string AdamVName(const std::string& param) { return "opt.v." + param; }
inline constexpr const char* kStepName = "step";
inline constexpr const char* kLrName = "lr";

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TRAINING_GRAPH_H_
