// The optimizer half of a training step: global grad-norm clipping and AdamW, appended to a graph
// that already has "grad:<param>" outputs (graph/autodiff.h).
//
//   SG_ASSIGN_OR_RETURN(Graph step, BuildTrainStep(forward, TrainStepOptions{}));
//   // feeds: parameters, "opt.m.<p>", "opt.v.<p>", data inputs, "step", "lr"
//   // outputs: "loss", "grad_norm", "update:<p>", "update:opt.m.<p>", "update:opt.v.<p>"
//
// "update:<name>" is the new value of source <name>; the runtime writes it back in place. Weight
// decay applies to parameters of rank >= 2 only (not norms or biases), as is usual for Llama.
#ifndef SGTRAIN_GRAPH_OPTIMIZER_H_
#define SGTRAIN_GRAPH_OPTIMIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  DType state_dtype = DType::kF32;
  bool keep_grad_outputs = false;  // keep "grad:<p>" as graph outputs (debugging)
};

// Appends grad_norm + one adamw per trainable parameter with a "grad:<name>" output.
// InvalidArgument when the graph has no gradients or already has optimizer state.
absl::StatusOr<Graph> AppendAdamW(const Graph& g, const AdamWOptions& options);

struct TrainStepOptions {
  std::string loss = "loss";
  AdamWOptions adamw;
};

// forward -> AppendBackward (all trainable parameters) -> AppendAdamW.
absl::StatusOr<Graph> BuildTrainStep(const Graph& forward, const TrainStepOptions& options);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_OPTIMIZER_H_
