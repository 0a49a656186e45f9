// Pipeline stages of the Llama model: the layers split into contiguous stages, each captured as
// its own graph with the full model's parameter names, and a stage executor that runs one
// micro-batch's forward or backward.
//
//   std::vector<StageSpec> specs = SplitLayers(/*n_layers=*/16, /*stages=*/4);
//   SG_ASSIGN_OR_RETURN(StageGraphs g, BuildLlamaStage(config, specs[s]));
//   SG_ASSIGN_OR_RETURN(auto exec, InterpretedStage::Create(std::move(g), params_of_stage));
//
// Stage graphs: stage 0 takes "tokens" (i32[batch, seq]) and holds the embedding; later stages
// take "h_in" ([batch, seq, dim], the config's dtype); the last stage holds the final norm, output
// and loss (input "targets", output "loss"); the others output "h_out". The backward graph is the
// forward graph plus, for a non-last stage, an input "cotangent" (the gradient of h_out arriving
// from the next stage) and the scalar sum(h_out * cotangent), whose gradient with respect to the
// parameters and h_in is exactly the stage's vector-Jacobian product; autodiff (AppendBackward
// with wrt = parameters + h_in) then gives "grad:<param>" and "grad:h_in".
#ifndef SGTRAIN_COMPILER_PIPELINE_STAGE_H_
#define SGTRAIN_COMPILER_PIPELINE_STAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/interpreter.h"
#include "graph/ir.h"
#include "graph/models/llama.h"

namespace sg::compiler {

struct StageSpec {
  int stage = 0, num_stages = 1;
  int64_t first_layer = 0, end_layer = 0;  // transformer layers [first_layer, end_layer)
  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
};

// Layers split as evenly as possible, earlier stages taking the extra layers (the last stage also
// carries the output projection and loss). InvalidArgument unless 1 <= stages <= n_layers.
absl::StatusOr<std::vector<StageSpec>> SplitLayers(int64_t n_layers, int stages);

struct StageGraphs {
  StageSpec spec;
  graph::Graph forward;   // outputs "h_out" or "loss"
  graph::Graph backward;  // + "grad:<param>" for every trainable parameter, "grad:h_in" if not first
  std::vector<std::string> parameters;  // trainable parameter names of this stage
};

absl::StatusOr<StageGraphs> BuildLlamaStage(const graph::LlamaConfig& config, const StageSpec& spec);

// Runs a stage's micro-batches. Forward returns h_out (or the loss, a scalar, on the last stage).
// Backward runs the backward graph for the same inputs (and, unless last, the cotangent of h_out),
// adds the parameter gradients into its accumulators and returns grad h_in (empty on stage 0).
class StageExecutor {
 public:
  virtual ~StageExecutor() = default;
  virtual const StageSpec& spec() const = 0;
  virtual absl::StatusOr<graph::HostTensor> Forward(const graph::Feeds& inputs) = 0;
  virtual absl::StatusOr<graph::HostTensor> Backward(const graph::Feeds& inputs,
                                                     const graph::HostTensor* cotangent) = 0;
  // "grad:<param>" sums since the last ZeroGrads.
  virtual graph::Feeds& grads() = 0;
  virtual void ZeroGrads() = 0;
};

// The reference executor: graph::Interpret (f64, CPU). The backward recomputes the stage's
// forward (the backward graph contains it), so a stage keeps only its inputs per micro-batch in
// flight: full activation recompute.
class InterpretedStage : public StageExecutor {
 public:
  // `params` holds at least every trainable parameter of the stage (extra entries are ignored).
  static absl::StatusOr<std::unique_ptr<InterpretedStage>> Create(StageGraphs graphs, const graph::Feeds& params);
  const StageSpec& spec() const override { return g_.spec; }
  absl::StatusOr<graph::HostTensor> Forward(const graph::Feeds& inputs) override;
  absl::StatusOr<graph::HostTensor> Backward(const graph::Feeds& inputs,
                                             const graph::HostTensor* cotangent) override;
  graph::Feeds& grads() override { return grads_; }
  void ZeroGrads() override;

 private:
  InterpretedStage() = default;
  StageGraphs g_;
  graph::Feeds params_;
  graph::Feeds grads_;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_STAGE_H_
