// Pipeline stages cut out of a captured model graph (the model is not written per stage): layers
// are assigned to stages by their parameters' names and every other node follows its inputs.
//
//   SG_ASSIGN_OR_RETURN(std::vector<StageGraph> stages, SplitIntoStages(forward, /*stages=*/4));
//   // stages[s].forward: inputs "tokens" (s = 0) or "h_in"; output "h_out", or "loss" (last)
//
// Assignment: a parameter "layers.<i>.*" belongs to the stage SplitLayers gives layer i; other
// parameters ("tok_embeddings.*", "norm.*", "output.*") to stage 0 if read before the first layer,
// else to the last stage. A node runs on the latest stage among its inputs' and parameters'
// stages; inputs, fills and nodes reading only those are copied into every stage that uses them.
// Exactly one value (the residual stream) must cross each stage boundary, from stage s to s+1.
// Errors: InvalidArgument for fewer layers than stages; Unimplemented naming the values when a
// boundary carries more than one value, a value skips a stage, or a parameter is read on two stages
// (tied embeddings).
#ifndef SGTRAIN_COMPILER_PIPELINE_GRAPH_SPLIT_H_
#define SGTRAIN_COMPILER_PIPELINE_GRAPH_SPLIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/pipeline/stage.h"
#include "graph/ir.h"

namespace sg::compiler {

inline constexpr const char* kStageInput = "h_in";
inline constexpr const char* kStageOutput = "h_out";

struct StageGraph {
  StageSpec spec;
  graph::Graph forward;                 // the stage's slice of the model
  std::vector<std::string> parameters;  // trainable parameters it holds, graph order
};

absl::StatusOr<std::vector<StageGraph>> SplitIntoStages(const graph::Graph& forward, int stages,
                                                        const std::string& loss = "loss");

// The stage's graph for its backward: for a non-last stage the forward plus an input "cotangent"
// (h_out's type) and the scalar output "vjp" = sum(h_out * cotangent), whose gradient is the
// stage's vector-Jacobian product; the last stage's forward as is (loss). Then autodiff with
// respect to the parameters and h_in: outputs "grad:<param>", "grad:h_in" (not on stage 0).
absl::StatusOr<graph::Graph> StageTrainingGraph(const StageGraph& stage);

// The stage program the pipeline lowers: kernel fusion of the stage's forward (when `fuse`),
// StageTrainingGraph, the cotangent fed straight in as h_out's gradient (the helper "vjp" nodes
// dropped, so only the model's ops remain), fusion of the backward epilogues, CSE and DCE.
absl::StatusOr<graph::Graph> PrepareStageStep(const StageGraph& stage, bool fuse);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_GRAPH_SPLIT_H_
