// The forward-only path: a model graph lowered without autodiff and without an optimizer, for
// validation loss and sampling on the same device and kernels as the training step (instead of
// the f64 interpreter). Parameters are the eval step's own state, copied from a training step.
//
//   SG_ASSIGN_OR_RETURN(auto eval, sg::compiler::CompileForward(forward_with_logits, opt));
//   SG_RETURN_IF_ERROR(eval->CopyParametersFrom(train_step));   // after the updates to evaluate
//   SG_RETURN_IF_ERROR(eval->Run({{"tokens", tokens}, {"targets", targets}}));
//   SG_ASSIGN_OR_RETURN(float loss, eval->ReadLoss());           // syncs
//   SG_RETURN_IF_ERROR(eval->Read("logits", host_logits.view()));
//
// The graph is the training step's forward graph (same parameter names), typically with extra
// outputs such as "logits". The preparation is the training step's minus the backward half:
// the mixed-precision rewrite (options.precision), then kernel fusion (options.fuse) and DCE; the
// lowering and the executor are the training step's (compiler/lowering.h, compiler/executor.h).
// The parameters are a second copy of the weights on the device (CopyParametersFrom refreshes
// it with device-to-device copies); sharing the training step's buffers would need Lower to take
// external source storage.
#ifndef SGTRAIN_COMPILER_EVAL_STEP_H_
#define SGTRAIN_COMPILER_EVAL_STEP_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "compiler/executor.h"
#include "compiler/lowering.h"
#include "graph/ir.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

class EvalStep {
 public:
  // Enqueues one forward pass: copies `batch` (every graph input by name, host or device tensors
  // with the bound shapes) into the input buffers and runs the schedule. InvalidArgument naming a
  // missing, unknown or ill-shaped input.
  absl::Status Run(const std::map<std::string, TensorView>& batch);
  // Waits for the last Run and reads the options.loss output as f32.
  absl::StatusOr<float> ReadLoss() const;

  // Parameters by model name (and inputs); `host` must match dtype and element count. Writing
  // an f32 master also refreshes its bf16 copy under Precision::kBF16Mixed.
  absl::Status Write(const std::string& name, const TensorView& host);
  // Any source or output ("loss", "logits", a parameter) into `host` (matching dtype and count).
  absl::Status Read(const std::string& name, const TensorView& host) const;
  // `host.numel()` elements of a source or output starting at element `offset` (e.g. the last
  // position's logits for sampling). InvalidArgument when the range or the dtype does not match.
  absl::Status ReadSlice(const std::string& name, int64_t offset, const TensorView& host) const;
  // The device view of a source or output (valid while the step lives). NotFound names it.
  absl::StatusOr<TensorView> View(const std::string& name) const;

  // Copies every parameter of this step from `train` by name. A single-device training step on
  // the same device is copied device to device; a distributed one (whose Read gathers the shards,
  // a collective every rank must join) through the host. NotFound naming a parameter `train` lacks.
  absl::Status CopyParametersFrom(const CompiledStep& train, bool distributed = false);

  // Trainable parameters, in graph order.
  const std::vector<std::string>& parameter_names() const { return parameter_names_; }
  const Program& program() const { return *program_; }

 private:
  friend absl::StatusOr<std::unique_ptr<EvalStep>> CompileForward(const graph::Graph&, const CompileOptions&);
  EvalStep() = default;

  std::unique_ptr<Program> program_;
  std::unique_ptr<Executor> executor_;
  std::vector<std::string> parameter_names_;
  std::string loss_;
};

// Lowers `forward` (a forward graph with a floating scalar output options.loss; no optimizer
// nodes) at options.binding on options.device. Uses options.device, precision, binding, loss,
// fuse, cuda_graph and warmup_steps; the AdamW, recompute and cache options do not apply.
// Parameters start at zero. InvalidArgument for a training graph, a bad graph or binding;
// Unimplemented for a distributed strategy (evaluate on one device per rank) or an op without a
// kernel on the device.
absl::StatusOr<std::unique_ptr<EvalStep>> CompileForward(const graph::Graph& forward, const CompileOptions& options);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_EVAL_STEP_H_
