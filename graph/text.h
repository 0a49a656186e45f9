// The graph's text form: a readable dump and a parser that round-trips it exactly.
//
//   std::string text = sg::graph::ToText(g);
//   SG_ASSIGN_OR_RETURN(sg::graph::Graph g2, sg::graph::ParseText(text));  // ToText(g2) == text
//
// Grammar (one statement per line; `#` starts a comment):
//   graph {
//     sym seq min=1 max=4096 multiple_of=8
//     %0 = input() {dtype=i32, name="tokens", shape=shape[batch,seq]} : i32[batch,seq]
//     %5, %6 = add_rmsnorm(%3, %4, %1) {eps=1e-05} : f32[batch,seq,64], f32[batch,seq,64] @"layers.0"
//     %9 = matmul(%7, %8) {...} : f32[64,64] @"layers.0.attention.wq" bwd
//     output "loss" = %12
//   }
// Attribute values: true/false, integers, floats (always with '.', 'e', inf or nan), "strings",
// [int,list], shape[dims], dtypes (f32, bf16, ...). A dim is `64`, `seq`, `batch*seq`, `2*seq`.
// The optional trailing `fwd`/`bwd`/`opt` is the node's phase (fwd when absent).
#ifndef SGTRAIN_GRAPH_TEXT_H_
#define SGTRAIN_GRAPH_TEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

// The text form. Deterministic: equal graphs (same ids) print the same bytes.
std::string ToText(const Graph& g);

// The canonical text: ToText(Canonicalize(g)). Graphs differing only in value numbering agree.
std::string CanonicalText(const Graph& g);

// Parses ToText's output and verifies the graph. InvalidArgument "line:col: message" on a syntax
// error; a well-formed but invalid graph gives Verify's message prefixed with the node's line.
absl::StatusOr<Graph> ParseText(absl::string_view text);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_TEXT_H_
