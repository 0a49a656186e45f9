// The weight-gradient stream for the lowering (LowerOptions::wgrad_stream): which backward matmuls
// move to their own stream (Step::stream 3) and where compute joins each. A weight-gradient matmul
// (a backward matmul writing a "grad:" output) is off the data-gradient chain: on its own stream it
// can run while compute continues the chain, until the join, which comes before the first of
//   - a later node reading or writing its gradient,
//   - the `join_matmuls`-th matmul after it (bounding how long its inputs stay in the arena),
//   - the first node outside the backward,
//   - the node ahead of the one before which a runtime step reads the gradient (read_at; FSDP's
//     reduce-scatters: the wait is issued at the join node, the runtime's step after it).
// One with nothing after it to overlap stays on compute.
//
//   std::vector<WgradJoin> joins = ChooseWgradJoins(graph, root, read_at, /*join_matmuls=*/2);
//   // node j.node: fork, matmul on stream 3, done; before node j.join's steps: compute waits for done
#ifndef SGTRAIN_COMPILER_WGRAD_STREAM_H_
#define SGTRAIN_COMPILER_WGRAD_STREAM_H_

#include <map>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace sg::compiler {

struct WgradJoin {
  int node = -1;  // the weight-gradient matmul
  int join = -1;  // compute waits for it before this node's steps (> node)
};

// `root`: each value's buffer (alias root, as the lowering's); `read_at`: "grad:<param>" -> the
// node before whose steps a runtime step reads that gradient. In node order.
std::vector<WgradJoin> ChooseWgradJoins(const graph::Graph& g, const std::vector<int>& root,
                                        const std::map<std::string, int>& read_at, int join_matmuls);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_WGRAD_STREAM_H_
