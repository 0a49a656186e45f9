// Reverse-mode autodiff: appends the backward graph to a forward graph by per-op VJP rules.
//
//   SG_ASSIGN_OR_RETURN(BackwardResult r, AppendBackward(forward, {.loss = "loss"}));
//   // r.graph has the forward outputs plus "grad:<param name>" for every trainable parameter.
//
// Each forward op's rule is a function `<Op>Backward` in autodiff.cc that emits the matching
// `<op>_backward` IR op (or a few primitive ops, e.g. MulBackward emits two muls), so the name
// greps across kernels, IR and VJP rules. Rules use the forward values they need (for example
// AttentionBackward reads q, k, v and out); which of those are kept alive or recomputed is the
// recompute pass's decision, not autodiff's.
//
// Backward nodes get Phase::kBackward and the forward node's scope. Cotangents of a value used
// several times are summed with `add`. Ops without a VJP (the *_backward ops themselves,
// grad_norm, adamw) are an Unimplemented error if they lie between a `wrt` value and the loss.
#ifndef SGTRAIN_GRAPH_AUTODIFF_H_
#define SGTRAIN_GRAPH_AUTODIFF_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

struct BackwardOptions {
  std::string loss = "loss";  // name of a scalar floating graph output
  // Value ids to differentiate with respect to; empty = every trainable parameter.
  std::vector<int> wrt;
};

struct BackwardResult {
  Graph graph;  // the forward (ids unchanged) followed by the backward nodes
  // (wrt value id, its gradient's value id), in `wrt` order. Also graph outputs named
  // "grad:<source name>" (or "grad:%<id>" for a value that is not a parameter/input).
  std::vector<std::pair<int, int>> grads;
};

// Differentiates `forward`'s loss output. InvalidArgument when the loss is missing or not a
// floating scalar; Unimplemented naming the op when a node on a loss path has no VJP rule.
// A `wrt` value the loss does not depend on gets a zero gradient (a `fill`).
absl::StatusOr<BackwardResult> AppendBackward(const Graph& forward, const BackwardOptions& options);

// True when `op` has a VJP rule (every forward op of the Llama step does).
bool HasVjp(OpKind op);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_AUTODIFF_H_
