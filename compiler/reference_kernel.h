// The CPU fallback for ops whose kernel package has not landed yet: runs one node through the
// f64 reference interpreter (graph/interpreter.h) on host tensors, rounding results to the output
// dtypes. Slow and CPU-only; the lowering uses it only when no kernel covers an op, and marks
// such steps impl="reference" in the schedule so traces and tests can see where it is used.
//
//   SG_ASSIGN_OR_RETURN(ReferenceKernel k, ReferenceKernel::Create(node, in_types, out_types));
//   SG_RETURN_IF_ERROR(k.Run(inputs, outputs));   // TensorViews on the CPU
#ifndef SGTRAIN_COMPILER_REFERENCE_KERNEL_H_
#define SGTRAIN_COMPILER_REFERENCE_KERNEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/interpreter.h"
#include "graph/ir.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

class ReferenceKernel {
 public:
  // A one-node graph for `node` with concrete input shapes/dtypes. InvalidArgument when the node
  // does not type-check with them.
  static absl::StatusOr<ReferenceKernel> Create(const graph::Node& node,
                                                const std::vector<std::pair<DType, Shape>>& inputs);

  // Reads `inputs` (all read before any output is written, so outputs may alias inputs), runs the
  // node in f64, writes `outputs`. FailedPrecondition for non-CPU tensors.
  absl::Status Run(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs) const;

 private:
  std::shared_ptr<const graph::Graph> graph_;
};

// Host conversions between tensors of any dtype and the interpreter's f64 tensors.
graph::HostTensor ToHostTensor(const TensorView& t);  // precondition: t on the CPU, contiguous
absl::Status FromHostTensor(const graph::HostTensor& h, const TensorView& t);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_REFERENCE_KERNEL_H_
