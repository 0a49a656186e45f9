#include "compiler/compile.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compiler/autotune.h"
#include "compiler/distributed.h"
#include "compiler/fsdp.h"
#include "graph/cache.h"
#include "graph/ops.h"
#include "graph/pipeline.h"
#include "kernels/elementwise/elementwise.h"
#include "graph/text.h"
#include "kernels/core/status.h"

namespace sg::compiler {

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kNone: return "none";
    case Strategy::kFsdp: return "fsdp";
    case Strategy::kHybridShard: return "hybrid_shard";
    case Strategy::kTensorParallel: return "tensor_parallel";
    case Strategy::kAuto: return "auto";
    case Strategy::kContextParallel: return "cp";
    case Strategy::kPipeline: return "pp";
  }
  return "?";
}

namespace {

// Everything that changes the prepared training graph (not the binding or the device: the cached
// graph is symbolic and device-independent).
graph::PipelineOptions Pipeline(const CompileOptions& o) {
  graph::PipelineOptions p;
  p.fuse = o.fuse;
  p.recompute = o.recompute;
  p.recompute_swiglu_layers = o.recompute_swiglu_layers;
  p.train.loss = o.loss;
  p.train.adamw = o.adamw;
  p.train.adamw.keep_grad_outputs = true;
  return p;
}

}  // namespace

absl::StatusOr<graph::Graph> PrepareTrainingGraph(const graph::Graph& g, const CompileOptions& o) {
  if (IsTrainingGraph(g)) return g;
  graph::Graph forward = g;
  if (o.precision != Precision::kF32) {
    SG_ASSIGN_OR_RETURN(forward, ToMixedPrecision(g, ComputeDType(o.precision)));
  }
  SG_ASSIGN_OR_RETURN(graph::Graph train, graph::OptimizeTrainStep(forward, Pipeline(o)));
  if (o.precision == Precision::kF16Mixed) return SeedLossWithScale(train);
  return train;
}

namespace {

// The prepared training graph through graph/cache.h: keyed by the forward graph's fingerprint and
// every option that changes the prepared graph. The graph stays symbolic and device-independent,
// so every symbol is symbolic and the target is "any": one entry serves every binding and device.
absl::StatusOr<graph::Graph> PrepareCached(const graph::Graph& g, const CompileOptions& o, bool* hit) {
  graph::CompileCache::Options co;
  co.dir = o.cache_dir;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<graph::CompileCache> cache, graph::CompileCache::Open(co));
  graph::CacheRequest req = graph::CacheRequest::For(g);
  req.device = "any";
  req.arch = "any";
  req.options = Pipeline(o).CacheOptions();
  req.options["precision"] = absl::StrCat(int(o.precision));
  req.compiler_version = absl::StrCat(graph::kGraphCompilerVersion, "+sg-compiler-1");
  graph::Graph prepared;
  bool compiled = false;
  SG_ASSIGN_OR_RETURN(std::shared_ptr<const graph::Artifact> art,
                      cache->GetOrCompile(req, o.binding, [&](const graph::Specialization&)
                                                              -> absl::StatusOr<graph::Artifact> {
                        compiled = true;
                        SG_ASSIGN_OR_RETURN(prepared, PrepareTrainingGraph(g, o));
                        return graph::Artifact{graph::ToText(prepared), ""};
                      }));
  *hit = !compiled;
  if (compiled) return prepared;
  auto parsed = graph::ParseText(art->graph_text);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("compile cache entry does not parse: ", parsed.status().message()));
  }
  return parsed;
}

bool RuntimeOwned(const std::string& input) {
  return input == kStepName || input == kLrName || input == kLossScaleName;
}

// The lowering's view of CompileOptions::loss_scale; none unless kF16Mixed.
std::optional<kernels::LossScaleConfig> LossScaler(const CompileOptions& o) {
  if (o.precision != Precision::kF16Mixed) return std::nullopt;
  kernels::LossScaleConfig c;
  c.backoff = float(o.loss_scale.backoff);
  c.growth = float(o.loss_scale.growth);
  c.min_scale = float(o.loss_scale.min_scale);
  c.growth_interval = o.loss_scale.growth_interval;
  return c;
}

absl::Status CheckLossScaleOptions(const CompileOptions& o) {
  if (o.precision != Precision::kF16Mixed) return absl::OkStatus();
  if (o.strategy != Strategy::kNone || o.micro_batches != 1) {
    return absl::UnimplementedError(absl::StrCat("Compile: f16 mixed precision (dynamic loss scaling) runs on one "
                                                 "device only; found strategy '", StrategyName(o.strategy),
                                                 "' with micro_batches ", o.micro_batches));
  }
  const LossScaleOptions& l = o.loss_scale;
  if (!(l.initial_scale >= l.min_scale && l.min_scale > 0 && l.backoff > 0 && l.backoff < 1 && l.growth > 1 &&
        l.growth_interval >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Compile: loss_scale options need initial_scale >= min_scale > 0, 0 < backoff < 1, growth > 1 and "
        "growth_interval >= 1; found initial_scale ", l.initial_scale, " min_scale ", l.min_scale, " backoff ",
        l.backoff, " growth ", l.growth, " growth_interval ", l.growth_interval));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {
std::map<Strategy, StrategyCompiler>& Registry() {
  static auto* r = new std::map<Strategy, StrategyCompiler>();
  return *r;
}
}  // namespace

bool RegisterStrategyCompiler(Strategy strategy, StrategyCompiler compile) {
  Registry()[strategy] = std::move(compile);
  return true;
}

absl::StatusOr<std::unique_ptr<CompiledStep>> Compile(const graph::Graph& g, const CompileOptions& o) {
  SG_RETURN_IF_ERROR(CheckLossScaleOptions(o));
  // The runtimes read gradients in steps outside the graph (reduce-scatters): FSDP and HYBRID_SHARD
  // tell the lowering where (LowerOptions::gradient_read_at); the others do not yet.
  if (o.wgrad_stream && ((o.strategy != Strategy::kNone && o.strategy != Strategy::kFsdp &&
                          o.strategy != Strategy::kHybridShard) ||
                         o.micro_batches != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Compile: wgrad_stream is for a single device, FSDP or HYBRID_SHARD with one micro-batch, "
                     "found strategy '", StrategyName(o.strategy), "' and ", o.micro_batches, " micro-batches"));
  }
  if (o.lm_head_chunks < 1 ||
      (o.lm_head_chunks > 1 && (o.strategy != Strategy::kNone || o.micro_batches != 1 || o.wgrad_stream))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Compile: lm_head_chunks is >= 1, and > 1 only for a single device with one micro-batch and no wgrad_stream; "
        "found ", o.lm_head_chunks, " with strategy '", StrategyName(o.strategy), "', ", o.micro_batches,
        " micro-batches, wgrad_stream ", o.wgrad_stream ? "on" : "off"));
  }
  if (o.bf16_gradients && ((o.strategy != Strategy::kNone && o.strategy != Strategy::kFsdp &&
                             o.strategy != Strategy::kHybridShard) ||
                            o.micro_batches != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Compile: bf16_gradients is for a single device, FSDP or HYBRID_SHARD with one micro-batch (the other "
        "runtimes accumulate or read the gradients in f32), found strategy '", StrategyName(o.strategy), "' and ",
        o.micro_batches, " micro-batches"));
  }
  if (o.bf16_gradients && o.precision != Precision::kBF16Mixed) {
    return absl::InvalidArgumentError(absl::StrCat("Compile: bf16_gradients needs bf16 mixed precision (the gradients "
                                                   "of bf16 products), found precision '",
                                                   PrecisionName(o.precision), "'"));
  }
  auto registered = Registry().find(o.strategy);
  if (registered != Registry().end()) return registered->second(g, o);
  if (o.strategy == Strategy::kContextParallel || o.strategy == Strategy::kPipeline) {
    return absl::UnimplementedError(absl::StrCat(
        "Compile: strategy '", StrategyName(o.strategy), "' is not linked into this binary (depend on ",
        o.strategy == Strategy::kPipeline ? "//compiler/pipeline:pp_step" : "//compiler/context_parallel:cp_step",
        ")"));
  }
  if (o.strategy != Strategy::kNone || o.micro_batches != 1) return CompileDistributed(g, o);
  SG_RETURN_IF_ERROR(graph::Verify(g));
  std::unique_ptr<CompiledStep> step(new CompiledStep());
  graph::Graph train;
  if (o.cache_dir.empty()) {
    SG_ASSIGN_OR_RETURN(train, PrepareTrainingGraph(g, o));
  } else {
    SG_ASSIGN_OR_RETURN(train, PrepareCached(g, o, &step->cache_hit_));
  }
  for (const graph::Node& n : train.nodes()) {
    if (n.op == graph::OpKind::kParameter && graph::AttrBool(n, "trainable")) {
      step->parameter_names_.push_back(graph::AttrString(n, "name"));
    }
  }
  LowerOptions lo;
  lo.loss_scaler = LossScaler(o);
  lo.offload_activations = o.offload_activations;
  lo.wgrad_stream = o.wgrad_stream;
  lo.lm_head_chunks = o.lm_head_chunks;
  lo.swiglu_backward_gemm = o.swiglu_backward_gemm;
  lo.bf16_gradients = o.bf16_gradients;
  SG_ASSIGN_OR_RETURN(step->program_, Lower(std::move(train), o.binding, o.device, lo));
  ExecutorOptions eo;
  eo.cuda_graph = o.cuda_graph;
  eo.warmup_steps = o.warmup_steps;
  SG_ASSIGN_OR_RETURN(eo.after_warmup, StartAutotune(o));
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
  if (step->program_->loss_scaler_state.bytes() > 0) {
    TensorView s(step->program_->loss_scaler_state.data(), DType::kF32, {2}, o.device);
    SG_RETURN_IF_ERROR(ZeroTensor(s, step->executor_->compute_stream()));
    SG_RETURN_IF_ERROR(step->executor_->Synchronize());
  }
  if (lo.loss_scaler) {
    const float initial = float(o.loss_scale.initial_scale);
    SG_RETURN_IF_ERROR(step->Write(kLossScaleName, TensorView(const_cast<float*>(&initial), DType::kF32, {}, Device::Cpu())));
  }
  SG_RETURN_IF_ERROR(step->AddStepCounter());
  std::map<std::string, TensorView> inputs;
  for (const std::string& name : step->program_->input_names) {
    if (!RuntimeOwned(name)) inputs[name] = step->program_->sources.at(name);
  }
  SG_ASSIGN_OR_RETURN(step->staging_, InputStaging::Create(o.device, inputs));
  return step;
}

absl::StatusOr<PlannedMemory> PlanMemory(const graph::Graph& g, const CompileOptions& o) {
  SG_RETURN_IF_ERROR(graph::Verify(g));
  SG_RETURN_IF_ERROR(CheckLossScaleOptions(o));
  SG_ASSIGN_OR_RETURN(graph::Graph train, PrepareTrainingGraph(g, o));
  LowerOptions lo;
  lo.loss_scaler = LossScaler(o);
  lo.offload_activations = o.offload_activations;
  lo.wgrad_stream = o.wgrad_stream;
  if (o.lm_head_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("PlanMemory: lm_head_chunks must be >= 1, found ", o.lm_head_chunks));
  }
  if (o.strategy == Strategy::kNone && o.micro_batches == 1) {
    lo.lm_head_chunks = o.lm_head_chunks;
    lo.swiglu_backward_gemm = o.swiglu_backward_gemm;
    lo.bf16_gradients = o.bf16_gradients;
  }
  return PlanStepMemory(std::move(train), o.binding, o.device, lo);
}

absl::StatusOr<int64_t> ChooseRecompute(const graph::Graph& forward, int64_t budget_bytes, int state_shards,
                                        CompileOptions* o) {
  if (state_shards < 1) return absl::InvalidArgumentError("ChooseRecompute: state_shards must be >= 1");
  int64_t last = 0;
  // Sharded state, or micro-batches (the data-parallel runtime runs them, also on one device: its
  // plan has the accumulated gradients and one micro-batch's activations).
  const bool fsdp = (o->strategy == Strategy::kFsdp && state_shards > 1) || o->micro_batches > 1;
  auto fits = [&](RecomputePolicy p, int swiglu_layers, bool per_parameter = false, int offload = 0,
                  int host_gradient_units = 0) -> absl::StatusOr<bool> {
    CompileOptions t = *o;
    t.recompute = p;
    t.recompute_swiglu_layers = swiglu_layers;
    t.fsdp_per_parameter_collectives = per_parameter;
    t.offload_activations = offload;
    t.fsdp_host_gradient_units = host_gradient_units;
    if (fsdp) {
      // The FSDP runtime's own buffers (gradient shards, gathered parameters, staging).
      SG_ASSIGN_OR_RETURN(ShardedStepMemory m, PlanFsdpMemory(forward, t, state_shards));
      last = m.Total();
    } else {
      SG_ASSIGN_OR_RETURN(PlannedMemory m, PlanMemory(forward, t));
      last = m.arena_bytes + m.state_bytes / state_shards;
    }
    if (last > budget_bytes) return false;
    o->recompute = p;
    o->recompute_swiglu_layers = swiglu_layers;
    o->fsdp_per_parameter_collectives = per_parameter;
    o->offload_activations = offload;
    o->fsdp_host_gradient_units = host_gradient_units;
    return true;
  };
  // The fewest n in [1, most] with which fits_with(n) holds, bisecting (the plan falls
  // monotonically with n), left set by that last fits_with; false when even `most` does not fit.
  auto fewest = [&](int most, const std::function<absl::StatusOr<bool>(int)>& fits_with) -> absl::StatusOr<bool> {
    SG_ASSIGN_OR_RETURN(bool ok, fits_with(most));
    if (!ok) return false;
    int lo = 0, hi = most;  // lo does not fit, hi does
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      SG_ASSIGN_OR_RETURN(ok, fits_with(mid));
      (ok ? hi : lo) = mid;
    }
    return fits_with(hi);
  };
  // The fewest kept activations offloaded (to host memory) with which `policy` fits.
  auto fewest_offloads = [&](RecomputePolicy policy, bool per_parameter, int most) {
    return fewest(most, [&](int n) { return fits(policy, -1, per_parameter, n); });
  };
  SG_ASSIGN_OR_RETURN(bool ok, fits(RecomputePolicy::kNone, -1));
  if (ok) return last;
  if (o->offload_before_recompute) {
    // No recompute, with the first layers' kept activations (several per layer: the FFN's three
    // [batch, seq, hidden] tensors, the norms' and attention's outputs) on the host. A count past
    // the candidates takes them all; the training graph's forward adds casts to the model's nodes.
    int outputs = 0;
    for (const graph::Node& n : forward.nodes()) outputs += int(n.outputs.size());
    SG_ASSIGN_OR_RETURN(ok, fewest_offloads(RecomputePolicy::kNone, false, 2 * outputs));
    if (ok) return last;
  }
  int layers = 0;  // transformer layers: scopes "layers.<i>..."
  for (const graph::Node& n : forward.nodes()) {
    int i = 0;
    if (absl::StartsWith(n.scope, "layers.") &&
        absl::SimpleAtoi(n.scope.substr(7, n.scope.find('.', 7) - 7), &i)) {
      layers = std::max(layers, i + 1);
    }
  }
  for (int k = 0; k <= layers; ++k) {
    SG_ASSIGN_OR_RETURN(ok, fits(RecomputePolicy::kSelective, k == layers ? -1 : k));
    if (ok) return last;
  }
  SG_ASSIGN_OR_RETURN(ok, fits(RecomputePolicy::kFull, -1));
  if (ok) return last;
  o->recompute = RecomputePolicy::kFull;
  o->recompute_swiglu_layers = -1;
  o->offload_activations = 0;
  if (!fsdp) return last;  // the least memory there is, over the budget: Compile will report running out
  // The bucketed collectives' f32 staging of a whole unit goes before speed: a collective per weight.
  SG_ASSIGN_OR_RETURN(ok, fits(RecomputePolicy::kFull, -1, /*per_parameter=*/true));
  o->fsdp_per_parameter_collectives = true;
  if (ok) return last;
  // Then the kept activations of the first layers to host memory, as few as fit (each layer's
  // residual sum saves its bytes at the peak); all that qualify when none does.
  SG_ASSIGN_OR_RETURN(ok, fewest_offloads(RecomputePolicy::kFull, true, layers + 1));
  if (ok) return last;
  o->offload_activations = layers + 1;
  if (o->micro_batches > 1) return last;  // the deferred optimizer takes one micro-batch
  // Then the gradient shards of the fewest units (output layer first, then the last layers) wait in
  // host memory, AdamW deferred into the next forward: 4 bytes a parameter each way over PCIe.
  // Units: the layers, the embedding, the final norm, the output projection.
  const int units = layers + 3;
  SG_ASSIGN_OR_RETURN(ok, fewest(units, [&](int n) { return fits(RecomputePolicy::kFull, -1, true, layers + 1, n); }));
  if (!ok) o->fsdp_host_gradient_units = units;
  return last;
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

Step CompiledStep::CommStep(std::string name, graph::Phase phase, Event* ready,
                            std::function<absl::Status(const Stream&)> body, Event* done) {
  Step st;
  st.kind = Step::Kind::kCollective;
  st.name = std::move(name);
  st.phase = phase;
  st.stream = 1;
  st.impl = "collective";
  st.launch = [this, ready, body = std::move(body), done](const Stream& comm) -> absl::Status {
    SG_RETURN_IF_ERROR(ready->Record(executor_->compute_stream()));
    SG_RETURN_IF_ERROR(ready->Block(comm));
    SG_RETURN_IF_ERROR(body(comm));
    return done->Record(comm);
  };
  return st;
}

Step CompiledStep::WaitStep(std::string name, graph::Phase phase, const Event* done) {
  Step st;
  st.name = std::move(name);
  st.phase = phase;
  st.impl = "wait";
  st.launch = [done](const Stream& s) { return done->Block(s); };
  return st;
}

CompiledStep::~CompiledStep() {
  if (executor_ != nullptr) (void)executor_->Synchronize();
}

absl::StatusOr<TensorView> CompiledStep::View(const std::string& name) const {
  return FindSourceOrOutput(*program_, name, "compiled step");
}

absl::Status CompiledStep::Write(const std::string& name, const TensorView& host) {
  SG_RETURN_IF_ERROR(WriteSource(*program_, name, "compiled step", host, executor_->compute_stream()));
  if (name == kStepName && program_->adamw_counter.bytes() > 0) {
    // The multi-tensor AdamW counts completed steps in its own i64; restore it with the source.
    SG_RETURN_IF_ERROR(executor_->Synchronize());
    float f = 0;
    SG_RETURN_IF_ERROR(CopyTensor(program_->sources.at(kStepName), TensorView(&f, DType::kF32, {}, Device::Cpu()),
                                  executor_->compute_stream()));
    SG_RETURN_IF_ERROR(executor_->Synchronize());
    int64_t n = int64_t(f);
    TensorView c(program_->adamw_counter.data(), DType::kI64, {}, program_->device);
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(&n, DType::kI64, {}, Device::Cpu()), c, executor_->compute_stream()));
  }
  return executor_->Synchronize();
}

absl::Status CompiledStep::Read(const std::string& name, const TensorView& host) const {
  SG_RETURN_IF_ERROR(ReadSourceOrOutput(*program_, name, "compiled step", host, executor_->compute_stream()));
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
    SG_RETURN_IF_ERROR(staging_.Stage(name, it->second, dst, executor_->compute_stream()));
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
  if (program_->loss_scaler_state.bytes() > 0) {
    float skipped = 0;
    SG_RETURN_IF_ERROR(Read(kLossScaleName, TensorView(&m.loss_scale, DType::kF32, {}, Device::Cpu())));
    SG_RETURN_IF_ERROR(Read("loss_scale.skipped", TensorView(&skipped, DType::kF32, {}, Device::Cpu())));
    m.skipped = skipped != 0;
  }
  return m;
}

}  // namespace sg::compiler
