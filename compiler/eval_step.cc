#include "compiler/eval_step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compiler/training_graph.h"
#include "graph/ops.h"
#include "graph/passes/passes.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

absl::StatusOr<graph::Graph> PrepareForward(const graph::Graph& g, const CompileOptions& o) {
  graph::Graph forward = g;
  if (o.precision != Precision::kF32) {
    SG_ASSIGN_OR_RETURN(forward, ToMixedPrecision(g, ComputeDType(o.precision)));
  }
  if (o.fuse) {
    SG_ASSIGN_OR_RETURN(forward, graph::FuseForKernels(forward));
  }
  return graph::Dce(forward);
}

}  // namespace

absl::StatusOr<std::unique_ptr<EvalStep>> CompileForward(const graph::Graph& g, const CompileOptions& o) {
  if (o.strategy != Strategy::kNone) {
    return absl::UnimplementedError(absl::StrCat("CompileForward: strategy '", StrategyName(o.strategy),
                                                 "' is not supported; expected 'none' (one device per rank)"));
  }
  SG_RETURN_IF_ERROR(graph::Verify(g));
  if (IsTrainingGraph(g)) {
    return absl::InvalidArgumentError("CompileForward: expected a forward graph, found optimizer nodes");
  }
  const bool has_loss = std::any_of(g.outputs().begin(), g.outputs().end(),
                                    [&](const graph::GraphOutput& x) { return x.name == o.loss; });
  if (!has_loss) {
    return absl::InvalidArgumentError(absl::StrCat("CompileForward: the graph has no output '", o.loss, "'"));
  }
  std::unique_ptr<EvalStep> step(new EvalStep());
  step->loss_ = o.loss;
  SG_ASSIGN_OR_RETURN(graph::Graph forward, PrepareForward(g, o));
  for (const graph::Node& n : forward.nodes()) {
    if (n.op == graph::OpKind::kParameter && graph::AttrBool(n, "trainable")) {
      step->parameter_names_.push_back(graph::AttrString(n, "name"));
    }
  }
  SG_ASSIGN_OR_RETURN(step->program_, Lower(std::move(forward), o.binding, o.device));
  ExecutorOptions eo;
  eo.cuda_graph = o.cuda_graph;
  eo.warmup_steps = o.warmup_steps;
  SG_ASSIGN_OR_RETURN(step->executor_, Executor::Create(step->program_.get(), eo));
  const DeviceMemory& state = step->program_->state;
  if (state.bytes() > 0) {
    TensorView all(state.data(), DType::kF32, {state.bytes() / 4}, o.device);
    SG_RETURN_IF_ERROR(ZeroTensor(all, step->executor_->compute_stream()));
    SG_RETURN_IF_ERROR(step->executor_->Synchronize());
  }
  return step;
}

absl::StatusOr<TensorView> EvalStep::View(const std::string& name) const {
  return FindSourceOrOutput(*program_, name, "eval step");
}

absl::Status EvalStep::Write(const std::string& name, const TensorView& src) {
  SG_RETURN_IF_ERROR(WriteSource(*program_, name, "eval step", src, executor_->compute_stream()));
  return executor_->Synchronize();
}

absl::Status EvalStep::Read(const std::string& name, const TensorView& host) const {
  SG_RETURN_IF_ERROR(ReadSourceOrOutput(*program_, name, "eval step", host, executor_->compute_stream()));
  return executor_->Synchronize();
}

absl::Status EvalStep::ReadSlice(const std::string& name, int64_t offset, const TensorView& host) const {
  SG_ASSIGN_OR_RETURN(TensorView v, View(name));
  if (v.dtype() != host.dtype() || offset < 0 || offset + host.numel() > v.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("ReadSlice '", name, "': elements [", offset, ", ",
                                                   offset + host.numel(), ") of ", DTypeName(host.dtype()),
                                                   " requested, the value is ", DTypeName(v.dtype()),
                                                   ShapeToString(v.shape())));
  }
  TensorView src(static_cast<char*>(v.raw()) + offset * SizeOf(v.dtype()), v.dtype(), {host.numel()}, v.device());
  SG_ASSIGN_OR_RETURN(TensorView dst, host.Reshape({host.numel()}));
  SG_RETURN_IF_ERROR(CopyTensor(src, dst, executor_->compute_stream()));
  return executor_->Synchronize();
}

absl::Status EvalStep::CopyParametersFrom(const CompiledStep& train, bool distributed) {
  for (const std::string& name : parameter_names_) {
    if (!distributed) {
      SG_ASSIGN_OR_RETURN(TensorView src, train.View(name));
      SG_RETURN_IF_ERROR(Write(name, src));
      continue;
    }
    const TensorView& dst = program_->sources.at(name);
    SG_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(dst.shape(), dst.dtype(), Device::Cpu()));
    SG_RETURN_IF_ERROR(train.Read(name, host.view()));
    SG_RETURN_IF_ERROR(Write(name, host.view()));
  }
  return absl::OkStatus();
}

absl::Status EvalStep::Run(const std::map<std::string, TensorView>& batch) {
  const std::vector<std::string>& inputs = program_->input_names;
  for (const auto& [name, t] : batch) {
    if (std::find(inputs.begin(), inputs.end(), name) == inputs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Run: the graph has no input named '", name, "'"));
    }
  }
  for (const std::string& name : inputs) {
    auto it = batch.find(name);
    const TensorView& dst = program_->sources.at(name);
    if (it == batch.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Run: missing input '", name, "' (", DTypeName(dst.dtype()),
                                                     ShapeToString(dst.shape()), ")"));
    }
    if (it->second.dtype() != dst.dtype() || it->second.shape() != dst.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("Run: input '", name, "': expected ", DTypeName(dst.dtype()),
                                                     ShapeToString(dst.shape()), ", found ", it->second.ToString()));
    }
    SG_RETURN_IF_ERROR(CopyTensor(it->second, dst, executor_->compute_stream()));
  }
  // A host batch may be reused by the caller as soon as Run returns.
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  return executor_->Run();
}

absl::StatusOr<float> EvalStep::ReadLoss() const {
  SG_ASSIGN_OR_RETURN(TensorView v, View(loss_));
  if (v.dtype() == DType::kF32) {
    float loss = 0;
    SG_RETURN_IF_ERROR(Read(loss_, TensorView(&loss, DType::kF32, v.shape(), Device::Cpu())));
    return loss;
  }
  return absl::UnimplementedError(absl::StrCat("eval loss '", loss_, "' has dtype ", DTypeName(v.dtype()),
                                               ", expected F32"));
}

}  // namespace sg::compiler
