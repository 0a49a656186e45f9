// Graph-to-graph optimization passes. Each returns a new verified graph computing the same graph
// outputs (the interpreter's results are preserved; tests check it on random inputs).
//
//   SG_ASSIGN_OR_RETURN(Graph g, FuseForKernels(forward));        // before autodiff
//   SG_ASSIGN_OR_RETURN(BackwardResult r, AppendBackward(g, {}));
//   SG_ASSIGN_OR_RETURN(g, Cse(Dce(FuseForKernels(r.graph))));     // backward epilogues
//   SG_ASSIGN_OR_RETURN(g, ApplyRecompute(g, RecomputePolicy::kSelective));  // CSE never after this
//   SG_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(g, {{"batch", 8}, {"seq", 2048}}));
//
// Value ids of surviving values are kept, so a dump before and after a pass lines up.
#ifndef SGTRAIN_GRAPH_PASSES_PASSES_H_
#define SGTRAIN_GRAPH_PASSES_PASSES_H_

#include <string>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

// Dead-code elimination: drops nodes whose outputs reach no graph output. Parameters and inputs
// stay (they are the graph's signature) even when unused.
absl::StatusOr<Graph> Dce(const Graph& g);

// Common-subexpression elimination: a node with the same op, inputs and attributes as an earlier
// one is dropped and its uses redirected. Sources are never merged. Do not run after
// ApplyRecompute: recomputed nodes are deliberate duplicates of forward nodes.
absl::StatusOr<Graph> Cse(const Graph& g);

// What FuseForKernels did, for logs and tests.
struct FusionStats {
  int add_rmsnorm = 0;         // add(x, r) -> rmsnorm  =>  add_rmsnorm
  int rmsnorm_prologue = 0;    // matmul reading an rmsnorm output gets prologue="rmsnorm"
  int swiglu = 0;              // mul(silu(gate), up)   =>  swiglu
  int matmul_epilogue = 0;     // add(matmul(..), bias[N] or residual)  =>  matmul epilogue
  int cross_entropy = 0;       // nll_loss(log_softmax(x))  =>  softmax_cross_entropy
  std::string ToString() const;
};

// Pattern fusion onto the fused kernels. A producer is folded only when the fused node can take
// over all of its uses (single use, or for add_rmsnorm, every use of the sum after the norm).
absl::StatusOr<Graph> FuseForKernels(const Graph& g, FusionStats* stats = nullptr);

// Which forward activations the backward keeps vs recomputes.
//   kNone:      keep every forward value the backward reads.
//   kSelective: keep outputs of expensive ops (matmul, attention, embedding, losses) and every
//               value crossing a transformer-layer boundary; recompute a cheap op inside a layer
//               (norm, swiglu, elementwise, reshape) when the backward keeps its inputs anyway,
//               and rebuild add_rmsnorm's norm output by rmsnorm of its kept sum.
//   kFull:      keep only values crossing a transformer-layer boundary (scope "layers.<i>");
//               recompute everything inside a layer, matmuls and attention included, and (as
//               kSelective) rebuild add_rmsnorm's norm output from its kept sum.
enum class RecomputePolicy : uint8_t { kNone, kSelective, kFull };
absl::string_view RecomputePolicyName(RecomputePolicy p);  // "none", "selective", "full"

// Clones the chosen forward nodes into the backward, right before their first backward use
// (Phase::kBackward, same scope). Needs a graph with Phase::kBackward nodes (AppendBackward).
// `swiglu_layers` (kSelective only): recompute SwiGLU only in layers [0, swiglu_layers) ("layers.<i>"
// scopes); -1 for every layer. SwiGLU is the widest value selective recompute frees (ffn_dim per
// token) and the costliest to rebuild, so a memory budget can take it layer by layer: the first
// layers' activations live longest (their backward runs last).
absl::StatusOr<Graph> ApplyRecompute(const Graph& g, RecomputePolicy policy,
                                     int* recomputed_nodes = nullptr, int swiglu_layers = -1);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_PASSES_PASSES_H_
