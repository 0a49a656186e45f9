// From a captured forward graph to the whole training step graph: mixed-precision rewrite,
// backward (graph/autodiff.h), gradient clipping and one AdamW update per trainable parameter.
//
//   SG_ASSIGN_OR_RETURN(Graph train, BuildTrainingGraph(forward, {.precision = Precision::kBF16Mixed}));
//   // sources: the model's parameters and inputs, "optimizer.step", "optimizer.lr",
//   //          "adamw.m:<param>", "adamw.v:<param>"
//   // outputs: "loss", "grad_norm", "grad:<param>", "update:<source>" (new value, written back)
//
// Conventions the runtime relies on: every graph output named "update:<source>" is that source's
// value after the step (the executor writes it back in place); "optimizer.lr" is set by the host
// between steps; "optimizer.step" counts completed updates (the graph adds one before AdamW uses
// it, so the first update uses step 1, as PyTorch does).
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

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // Weight decay on 1-D parameters (norm weights) too; off as in most Llama recipes.
  bool decay_vectors = false;
  // Clip the global gradient L2 norm to this; <= 0 disables clipping (grad_norm is still reported).
  double max_grad_norm = 1.0;
};

struct TrainingGraphOptions {
  std::string loss = "loss";
  Precision precision = Precision::kF32;
  AdamWOptions adamw;
};

// Rewrites `forward` (built in f32) to bf16 compute: every floating parameter and input is cast
// to bf16 where it is used, so all activations are bf16 while parameters stay f32 (their
// gradients come back through the cast's VJP as f32). Ops whose type is fixed (the loss, f32[])
// keep it. Symbols, scopes, source and output names are kept.
absl::StatusOr<graph::Graph> ToMixedPrecision(const graph::Graph& forward);

// The training step graph for `forward` (which must have a floating scalar output options.loss
// and no optimizer nodes). InvalidArgument when the loss is missing; AppendBackward's errors.
absl::StatusOr<graph::Graph> BuildTrainingGraph(const graph::Graph& forward,
                                                const TrainingGraphOptions& options);

// True when `g` already holds optimizer nodes (a training graph rather than a forward graph).
bool IsTrainingGraph(const graph::Graph& g);

// Names of the optimizer's sources for a parameter.
inline std::string AdamMName(const std::string& param) { return "adamw.m:" + param; }
inline std::string AdamVName(const std::string& param) { return "adamw.v:" + param; }
inline constexpr const char* kStepName = "optimizer.step";
inline constexpr const char* kLrName = "optimizer.lr";

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TRAINING_GRAPH_H_
