#include "compiler/compile.h"

#include "absl/strings/str_cat.h"
#include "compiler/compile_cache.h"
#include "graph/ops.h"
#include "graph/text.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kNone: return "none";
    case Strategy::kFsdp: return "fsdp";
    case Strategy::kHybridShard: return "hybrid_shard";
    case Strategy::kTensorParallel: return "tensor_parallel";
    case Strategy::kAuto: return "auto";
  }
  return "?";
}

// Everything that changes the prepared training graph (not the binding or the device: the cached
// graph is symbolic and device-independent).
std::string OptionsText(const CompileOptions& o) {
  const AdamWOptions& a = o.adamw;
  return absl::StrCat("loss=", o.loss, ";precision=", int(o.precision), ";recompute=", int(o.recompute),
                      ";adamw=", a.beta1, ",", a.beta2, ",", a.eps, ",", a.weight_decay, ",", a.decay_vectors,
                      ",", a.max_grad_norm);
}

absl::StatusOr<graph::Graph> Prepare(const graph::Graph& g, const CompileOptions& o) {
  graph::Graph train;
  if (IsTrainingGraph(g)) {
    train = g;
  } else {
    TrainingGraphOptions t;
    t.loss = o.loss;
    t.precision = o.precision;
    t.adamw = o.adamw;
    SG_ASSIGN_OR_RETURN(train, BuildTrainingGraph(g, t));
  }
  return ApplyRecompute(train, o.recompute);
}

absl::Status CheckHostMatch(const std::string& what, const TensorView& dev, const TensorView& host) {
  if (dev.dtype() != host.dtype() || dev.numel() != host.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", DTypeName(dev.dtype()),
                                                   ShapeToString(dev.shape()), ", found ", host.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CompiledStep>> Compile(const graph::Graph& g, const CompileOptions& o) {
  if (o.strategy != Strategy::kNone) {
    return absl::UnimplementedError(absl::StrCat(
        "Compile: strategy '", StrategyName(o.strategy),
        "' is not lowered yet (needs comm's ProcessGroup and the sharding planner); use Strategy::kNone"));
  }
  SG_RETURN_IF_ERROR(graph::Verify(g));
  std::unique_ptr<CompiledStep> step(new CompiledStep());
  graph::Graph train;
  std::string key;
  if (!o.cache_dir.empty()) {
    key = CacheKey(graph::CanonicalText(g), OptionsText(o));
    auto cached = LoadCachedGraph(o.cache_dir, key);
    if (cached.ok()) {
      train = *std::move(cached);
      step->cache_hit_ = true;
    } else if (!absl::IsNotFound(cached.status()) && !absl::IsDataLoss(cached.status())) {
      return cached.status();
    }
  }
  if (!step->cache_hit_) {
    SG_ASSIGN_OR_RETURN(train, Prepare(g, o));
    if (!o.cache_dir.empty()) SG_RETURN_IF_ERROR(StoreCachedGraph(o.cache_dir, key, train));
  }
  for (const graph::Node& n : train.nodes()) {
    if (n.op == graph::OpKind::kParameter && graph::AttrBool(n, "trainable")) {
      step->parameter_names_.push_back(graph::AttrString(n, "name"));
    }
  }
  SG_ASSIGN_OR_RETURN(step->program_, Lower(std::move(train), o.binding, o.device));
  ExecutorOptions eo;
  eo.cuda_graph = o.cuda_graph;
  eo.warmup_steps = o.warmup_steps;
  SG_ASSIGN_OR_RETURN(step->executor_, Executor::Create(step->program_.get(), eo));
  // Optimizer state, step counter and learning rate start at zero (and parameters too until
  // written, so an uninitialized model is reproducible rather than garbage).
  const DeviceMemory& state = step->program_->state;
  if (state.bytes() > 0) {
    TensorView all(state.data(), DType::kF32, {state.bytes() / 4}, o.device);
    SG_RETURN_IF_ERROR(ZeroTensor(all, step->executor_->compute_stream()));
    SG_RETURN_IF_ERROR(step->executor_->Synchronize());
  }
  return step;
}

absl::StatusOr<TensorView> CompiledStep::View(const std::string& name) const {
  auto s = program_->sources.find(name);
  if (s != program_->sources.end()) return s->second;
  auto o = program_->outputs.find(name);
  if (o != program_->outputs.end()) return o->second;
  return absl::NotFoundError(absl::StrCat("compiled step has no source or output named '", name, "'"));
}

absl::Status CompiledStep::Write(const std::string& name, const TensorView& host) {
  auto s = program_->sources.find(name);
  if (s == program_->sources.end()) {
    return absl::NotFoundError(absl::StrCat("compiled step has no source named '", name, "'"));
  }
  SG_RETURN_IF_ERROR(CheckHostMatch(absl::StrCat("Write '", name, "'"), s->second, host));
  SG_ASSIGN_OR_RETURN(TensorView dst, s->second.Reshape(host.shape()));
  SG_RETURN_IF_ERROR(CopyTensor(host, dst, executor_->compute_stream()));
  return executor_->Synchronize();
}

absl::Status CompiledStep::Read(const std::string& name, const TensorView& host) const {
  SG_ASSIGN_OR_RETURN(TensorView v, View(name));
  SG_RETURN_IF_ERROR(CheckHostMatch(absl::StrCat("Read '", name, "'"), v, host));
  SG_ASSIGN_OR_RETURN(TensorView src, v.Reshape(host.shape()));
  SG_RETURN_IF_ERROR(CopyTensor(src, host, executor_->compute_stream()));
  return executor_->Synchronize();
}

absl::Status CompiledStep::SetLearningRate(float lr) {
  return Write(kLrName, TensorView(&lr, DType::kF32, {}, Device::Cpu()));
}

absl::Status CompiledStep::CopyInputs(const std::map<std::string, TensorView>& batch) {
  for (const auto& [name, t] : batch) {
    if (!program_->sources.count(name) ||
        std::find(program_->input_names.begin(), program_->input_names.end(), name) == program_->input_names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Run: the graph has no input named '", name, "'"));
    }
  }
  for (const std::string& name : program_->input_names) {
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
  return absl::OkStatus();
}

absl::Status CompiledStep::Run(const std::map<std::string, TensorView>& batch) {
  SG_RETURN_IF_ERROR(CopyInputs(batch));
  return executor_->Run();
}

absl::StatusOr<StepTrace> CompiledStep::TraceStep(const std::map<std::string, TensorView>& batch) {
  SG_RETURN_IF_ERROR(CopyInputs(batch));
  return executor_->RunTraced();
}

absl::StatusOr<StepMetrics> CompiledStep::ReadMetrics() const {
  StepMetrics m;
  float step = 0;
  SG_RETURN_IF_ERROR(Read("loss", TensorView(&m.loss, DType::kF32, {}, Device::Cpu())));
  if (program_->outputs.count("grad_norm")) {
    SG_RETURN_IF_ERROR(Read("grad_norm", TensorView(&m.grad_norm, DType::kF32, {}, Device::Cpu())));
  }
  if (program_->sources.count(kStepName)) {
    SG_RETURN_IF_ERROR(Read(kStepName, TensorView(&step, DType::kF32, {}, Device::Cpu())));
  }
  m.step = int64_t(step);
  return m;
}

}  // namespace sg::compiler
