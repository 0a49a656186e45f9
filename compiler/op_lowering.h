// Per-op lowering rules (internal to the compiler): which kernel package's API a graph node
// becomes, with its TensorViews fixed, and which side buffers (saved statistics, scratch) it
// needs. One function per concern so a new kernel package means one new case here.
#ifndef SGTRAIN_COMPILER_OP_LOWERING_H_
#define SGTRAIN_COMPILER_OP_LOWERING_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/lowering_fusion.h"
#include "compiler/memory_plan.h"
#include "graph/ir.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

// Side buffers per node, as memory-plan slots, in the order the node's rule expects them:
//   rmsnorm, add_rmsnorm: [rstd f32[rows]]                          (live until its backward)
//   (add_)rmsnorm_backward: [rstd of the matching forward] or, without one, [rstd, y scratch];
//                       then [dweight f32[dim]] when the weight gradient is not written in f32
//   embedding_backward: [dtable f32] when the table gradient is not written in f32
//   softmax_cross_entropy: [valid i32], and [row_loss f32[tokens]] as the chunked LM head's
//                       launch; its unfused backward: [loss f32, valid i32]
//   attention:          [lse f32[b,h,s]]                              (live until its backward)
//   attention_backward: [lse of the matching forward] or, without one, [lse, out scratch]
//   swiglu_backward fused with its dh matmul: [W2^T scratch, W2's dtype [F, D]]
struct SideBuffers {
  std::map<int, std::vector<int>> slots;  // node index -> planner slots
  std::map<int, bool> matched;            // backward node index -> found its forward's statistics
  std::vector<int> ForNode(int node) const {
    auto it = slots.find(node);
    return it == slots.end() ? std::vector<int>{} : it->second;
  }
};

// Adds the side buffers of every node of `g` to `planner` (shapes: concrete shape per value id;
// values in fusions.folded_cast are written in f32).
SideBuffers PlanSideBuffers(const graph::Graph& g, const std::vector<Shape>& shapes,
                            const LoweringFusions& fusions, MemoryPlanner* planner);

struct NodeViews {
  std::vector<TensorView> in, out;
  std::vector<char*> side;  // base pointers of the node's side slots
  // A fused cross-entropy forward: the backward node's dlogits, written by this node's launch.
  std::vector<TensorView> fused_out;
  // A swiglu_backward fused with its dh matmul: that matmul's inputs (dy, W2 [D, F]).
  std::vector<TensorView> fused_in;
  // A cross-entropy (fused forward or backward) seeded from device memory: the f32[] seed.
  TensorView device_seed;
  // A matmul: the SMs its GEMM should plan for (kernels::GemmArgs::sm_count; 0: all).
  int sm_count = 0;
};

struct LoweredOp {
  std::string impl;  // "kernel" or "reference"
  std::function<absl::Status(const Stream&)> launch;  // empty: no kernel for this op on the device
};

// The chunked LM head (lowering_fusion.h), one launch at the cross-entropy node: x [..., K] (the
// logits matmul's input), w [vocab, K], the targets, the loss, `block` (the logits buffer: one
// block of rows, at its base), dx (x's shape) and dw ([vocab, K], f32); side: the cross-entropy
// node's [valid, row_loss]; device_seed: as NodeViews'.
struct LmHeadViews {
  TensorView x, w, targets, loss, block, dx, dw, device_seed;
  std::vector<char*> side;
};
LoweredOp LmHead(const graph::Node& cross_entropy, const LmHeadViews& v, const LoweringFusions& fusions);

// The launch for node `index`. An empty launch means the op has no kernel on `device` yet.
absl::StatusOr<LoweredOp> LowerNode(const graph::Node& node, const NodeViews& views,
                                    const SideBuffers& side, const LoweringFusions& fusions, int index,
                                    Device device);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_OP_LOWERING_H_
