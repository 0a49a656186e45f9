#include "compiler/compile.h"

#include "absl/strings/str_cat.h"
#include "compiler/compile_cache.h"
#include "graph/ops.h"
#include "graph/pipeline.h"
#include "kernels/elementwise/elementwise.h"
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
graph::PipelineOptions Pipeline(const CompileOptions& o) {
  graph::PipelineOptions p;
  p.fuse = o.fuse;
  p.recompute = o.recompute;
  p.train.loss = o.loss;
  p.train.adamw = o.adamw;
  p.train.adamw.keep_grad_outputs = true;
  return p;
}

std::string OptionsText(const CompileOptions& o) {
  std::string s = absl::StrCat("precision=", int(o.precision));
  for (const auto& [k, v] : Pipeline(o).CacheOptions()) absl::StrAppend(&s, ";", k, "=", v);
  return s;
}

absl::StatusOr<graph::Graph> Prepare(const graph::Graph& g, const CompileOptions& o) {
  if (IsTrainingGraph(g)) return g;
  graph::Graph forward = g;
  if (o.precision == Precision::kBF16Mixed) {
    SG_ASSIGN_OR_RETURN(forward, ToMixedPrecision(g));
  }
  return graph::OptimizeTrainStep(forward, Pipeline(o));
}

bool RuntimeOwned(const std::string& input) { return input == kStepName || input == kLrName; }

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
  if (step->program_->adamw_counter.bytes() > 0) {
    TensorView c(step->program_->adamw_counter.data(), DType::kI64, {}, o.device);
    SG_RETURN_IF_ERROR(ZeroTensor(c, step->executor_->compute_stream()));
    SG_RETURN_IF_ERROR(step->executor_->Synchronize());
  }
  SG_RETURN_IF_ERROR(step->AddStepCounter());
  return step;
}

// The step counter lives in device memory and is advanced by the step itself (first update uses
// step 1), so a captured CUDA graph needs nothing from the host.
absl::Status CompiledStep::AddStepCounter() {
  auto it = program_->sources.find(kStepName);
  if (it == program_->sources.end()) return absl::OkStatus();
  const Device d = program_->device;
  SG_ASSIGN_OR_RETURN(one_, DeviceMemory::Allocate(d, 4));
  TensorView one(one_.data(), DType::kF32, {}, d), counter = it->second;
  SG_RETURN_IF_ERROR(kernels::Fill(one, 1.0f, executor_->compute_stream()));
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  Step s;
  s.name = "advance step counter";
  s.phase = graph::Phase::kOptimizer;
  s.impl = "kernel";
  s.launch = [one, counter](const Stream& st) { return kernels::Add(counter, one, counter, st); };
  program_->schedule.steps.insert(program_->schedule.steps.begin(), std::move(s));
  return absl::OkStatus();
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
  if (name == kStepName && program_->adamw_counter.bytes() > 0) {
    // The multi-tensor AdamW counts completed steps in its own i64; restore it with the source.
    SG_RETURN_IF_ERROR(executor_->Synchronize());
    float f = 0;
    SG_RETURN_IF_ERROR(CopyTensor(dst, TensorView(&f, DType::kF32, {}, Device::Cpu()), executor_->compute_stream()));
    SG_RETURN_IF_ERROR(executor_->Synchronize());
    int64_t n = int64_t(f);
    TensorView c(program_->adamw_counter.data(), DType::kI64, {}, program_->device);
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(&n, DType::kI64, {}, Device::Cpu()), c, executor_->compute_stream()));
  }
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
    if (!program_->sources.count(name) || RuntimeOwned(name) ||
        std::find(program_->input_names.begin(), program_->input_names.end(), name) == program_->input_names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Run: the graph has no input named '", name, "'"));
    }
  }
  for (const std::string& name : program_->input_names) {
    if (RuntimeOwned(name)) continue;
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
