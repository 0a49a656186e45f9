#include "trainer/train_loop.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/interpreter.h"
#include "kernels/core/status.h"
#include "trainer/model/llama_model.h"
#include "trainer/safetensors/hf_llama_names.h"

namespace sg::trainer {
namespace {

// Optimizer slots in optimizer.safetensors, named "<HF parameter>.<slot>" (PyTorch's AdamW names).
constexpr char kSlotM[] = "exp_avg";
constexpr char kSlotV[] = "exp_avg_sq";
// training_state.json note holding the data loader's permutation seed.
constexpr char kDataSeedNote[] = "data_seed";

absl::StatusOr<Tensor> HostF32(const Shape& shape) { return Tensor::Empty(shape, DType::kF32, Device::Cpu()); }

// A host tensor as f32 (F32, BF16 or F16 input).
absl::StatusOr<Tensor> ToF32(const Tensor& t, absl::string_view what) {
  if (t.dtype() == DType::kF32) {
    SG_ASSIGN_OR_RETURN(Tensor out, HostF32(t.shape()));
    std::copy_n(t.data<float>(), t.numel(), out.data<float>());
    return out;
  }
  SG_ASSIGN_OR_RETURN(Tensor out, HostF32(t.shape()));
  float* d = out.data<float>();
  if (t.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = t.data<BFloat16>()[i].ToFloat();
  } else if (t.dtype() == DType::kF16) {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = t.data<Half>()[i].ToFloat();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a floating dtype (F32, BF16, F16), found ", DTypeName(t.dtype())));
  }
  return out;
}

graph::HostTensor ToHost(const TensorView& t) {
  graph::HostTensor h;
  h.dtype = t.dtype();
  h.shape = t.shape();
  h.data.resize(t.numel());
  if (t.dtype() == DType::kI32) {
    std::copy_n(t.data<int32_t>(), t.numel(), h.data.begin());
  } else {
    std::copy_n(t.data<float>(), t.numel(), h.data.begin());
  }
  return h;
}

// The step counter is a scalar of the compiler's choosing (f32 today); written as a number.
absl::Status WriteScalar(compiler::CompiledStep& s, const std::string& name, double value) {
  absl::StatusOr<TensorView> view = s.View(name);
  if (absl::IsNotFound(view.status())) {
    // The distributed step keeps the counter outside its program and takes it as an f32 scalar.
    float x = float(value);
    return s.Write(name, TensorView(&x, DType::kF32, {}, Device::Cpu()));
  }
  SG_ASSIGN_OR_RETURN(TensorView v, std::move(view));
  switch (v.dtype()) {
    case DType::kF32: { float x = float(value); return s.Write(name, TensorView(&x, v.dtype(), v.shape(), Device::Cpu())); }
    case DType::kI32: { int32_t x = int32_t(value); return s.Write(name, TensorView(&x, v.dtype(), v.shape(), Device::Cpu())); }
    case DType::kI64: { int64_t x = int64_t(value); return s.Write(name, TensorView(&x, v.dtype(), v.shape(), Device::Cpu())); }
    default: return absl::UnimplementedError(absl::StrCat("'", name, "' has dtype ", DTypeName(v.dtype())));
  }
}

absl::Status ValidateOptions(const TrainOptions& o) {
  SG_RETURN_IF_ERROR(ValidateLlamaConfig(o.config));
  SG_CHECK_ARG(o.batch > 0, "--batch: expected a positive number of sequences, found ", o.batch);
  SG_CHECK_ARG(o.seq > 0 && o.seq <= o.config.max_seq_len, "--seq: expected 1..", o.config.max_seq_len,
               " (the config's max_position_embeddings), found ", o.seq);
  SG_CHECK_ARG(o.grad_accum > 0, "--grad_accum: expected >= 1, found ", o.grad_accum);
  SG_CHECK_ARG(o.total_steps > 0, "--steps: expected > 0, found ", o.total_steps);
  SG_CHECK_ARG(o.lr > 0 && std::isfinite(o.lr), "--lr: expected a positive number, found ", o.lr);
  SG_CHECK_ARG(o.min_lr >= 0 && o.min_lr <= o.lr, "--min_lr: expected 0..lr (", o.lr, "), found ", o.min_lr);
  SG_CHECK_ARG(o.warmup >= 0, "--warmup: expected >= 0, found ", o.warmup);
  SG_CHECK_ARG(o.weight_decay >= 0, "--weight_decay: expected >= 0, found ", o.weight_decay);
  SG_CHECK_ARG(o.eps > 0 && std::isfinite(o.eps), "--adam_eps: expected a positive number, found ", o.eps);
  SG_CHECK_ARG(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "rank ", o.rank,
               " is outside the world of size ", o.world_size);
  SG_CHECK_ARG(o.lm_head_chunks >= 1, "--lm_head_chunks: expected >= 1, found ", o.lm_head_chunks);
  SG_CHECK_ARG(!o.bf16_gradients || ((o.strategy == compiler::Strategy::kNone || o.strategy == compiler::Strategy::kFsdp ||
                                      o.strategy == compiler::Strategy::kHybridShard) &&
                                     o.grad_accum == 1 && o.precision == compiler::Precision::kBF16Mixed),
               "--gradients=bf16: expected --precision=bf16 with --strategy=none, fsdp or hybrid and --grad_accum=1, "
               "found --precision=", compiler::PrecisionName(o.precision), " --strategy=", compiler::StrategyName(o.strategy),
               " --grad_accum=", o.grad_accum);
  SG_CHECK_ARG(o.fsdp_host_gradient_units >= 0, "--fsdp_host_gradient_units: expected >= 0, found ",
               o.fsdp_host_gradient_units);
  SG_CHECK_ARG(o.fsdp_host_gradient_units == 0 || o.strategy == compiler::Strategy::kFsdp,
               "--fsdp_host_gradient_units: expected --strategy=fsdp, found --strategy=",
               compiler::StrategyName(o.strategy));
  SG_CHECK_ARG(o.fsdp_host_gradient_units == 0 || o.grad_accum == 1,
               "--fsdp_host_gradient_units: expected --grad_accum=1 (the deferred AdamW takes one pass's gradients), "
               "found --grad_accum=", o.grad_accum);
  SG_CHECK_ARG(o.memory_budget_bytes >= 0, "--memory_budget_gib: expected >= 0, found ",
               double(o.memory_budget_bytes) / double(int64_t(1) << 30));
  return absl::OkStatus();
}

// ChooseMemoryPlan's recompute part.
absl::StatusOr<std::string> ChooseRecomputeOf(const graph::Graph& forward, const TrainOptions& o,
                                              compiler::CompileOptions* co) {
  const std::string fixed(graph::RecomputePolicyName(co->recompute));
  const bool plannable = o.strategy == compiler::Strategy::kNone || o.strategy == compiler::Strategy::kFsdp;
  if (!o.auto_recompute || !plannable) return fixed;
  int64_t budget = o.memory_budget_bytes;
  if (budget == 0) {
    if (!o.device.is_cuda()) {
      co->recompute = compiler::RecomputePolicy::kNone;
      return std::string("none (auto on the CPU)");
    }
    SG_ASSIGN_OR_RETURN(const int64_t total, CudaDeviceMemoryBytes(o.device.ordinal));
    budget = total / 10 * 9;
  }
  const int shards = o.strategy == compiler::Strategy::kFsdp ? o.world_size : 1;
  SG_ASSIGN_OR_RETURN(const int64_t planned, compiler::ChooseRecompute(forward, budget, shards, co));
  std::string plan(graph::RecomputePolicyName(co->recompute));
  if (co->recompute == compiler::RecomputePolicy::kSelective && co->recompute_swiglu_layers >= 0) {
    absl::StrAppend(&plan, " (SwiGLU in ", co->recompute_swiglu_layers, " of the layers)");
  }
  if (co->fsdp_per_parameter_collectives) absl::StrAppend(&plan, ", per-parameter collectives");
  if (co->offload_activations > 0) absl::StrAppend(&plan, ", ", co->offload_activations, " activations offloaded");
  if (co->fsdp_host_gradient_units > 0) {
    absl::StrAppend(&plan, ", AdamW deferred with the gradient shards of ", co->fsdp_host_gradient_units,
                    " units on the host");
  }
  constexpr double kGiB = double(int64_t(1) << 30);
  absl::StrAppend(&plan, absl::StrFormat(", %.2f GiB planned of %.2f", planned / kGiB, budget / kGiB));
  if (planned > budget) absl::StrAppend(&plan, " (the least memory the compiler can plan; it may not fit)");
  return plan;
}

// TrainOptions::auto_recompute: sets co's recompute choice (ChooseRecompute) and returns the
// description Trainer::memory_plan() gives.
absl::StatusOr<std::string> ChooseMemoryPlan(const graph::Graph& forward, const TrainOptions& o,
                                             compiler::CompileOptions* co) {
  const std::string head = co->lm_head_chunks > 1 ? absl::StrCat("; LM head in ", co->lm_head_chunks, " blocks") : "";
  SG_ASSIGN_OR_RETURN(std::string plan, ChooseRecomputeOf(forward, o, co));
  return plan + head;
}

}  // namespace

double ScheduledLearningRate(int64_t step, const TrainOptions& o) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  if (step >= o.total_steps) return o.min_lr;
  const double span = double(std::max<int64_t>(1, o.total_steps - o.warmup));
  const double progress = double(step - o.warmup) / span;
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options, const TokenSplit& data) {
  SG_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  t->data_ = data;
  t->rng_.seed(options.seed);

  SG_ASSIGN_OR_RETURN(graph::Graph forward, BuildTrainForward(options.config));
  SG_ASSIGN_OR_RETURN(t->eval_graph_, BuildEvalForward(options.config));
  compiler::CompileOptions co;
  co.device = options.device;
  co.precision = options.precision;
  co.loss_scale = options.loss_scale;
  co.strategy = options.strategy;
  co.mesh = options.mesh;
  co.cache_dir = options.cache_dir;
  co.binding = {{"batch", options.batch * options.grad_accum}, {"seq", options.seq}};
  // The pipeline's micro-batches (--micro_batches) or gradient accumulation (--grad_accum).
  co.micro_batches = options.strategy == compiler::Strategy::kPipeline ? options.micro_batches
                                                                        : int(options.grad_accum);
  co.pipeline_fsdp = options.pipeline_fsdp;
  co.adamw.beta1 = options.beta1;
  co.adamw.beta2 = options.beta2;
  co.adamw.eps = options.eps;
  co.adamw.weight_decay = options.weight_decay;
  co.adamw.max_grad_norm = options.grad_clip;
  co.recompute = options.recompute;
  co.lm_head_chunks = options.lm_head_chunks;
  co.bf16_gradients = options.bf16_gradients;
  co.fsdp_host_gradient_units = options.fsdp_host_gradient_units;
  SG_ASSIGN_OR_RETURN(t->memory_plan_, ChooseMemoryPlan(forward, options, &co));
  SG_ASSIGN_OR_RETURN(t->compiled_, compiler::Compile(forward, co));

  // The data is split over the data-parallel ranks (options.rank of options.world_size); with kAuto
  // the compiled step says which share it takes (tensor-parallel peers read the same batch).
  const bool step_decides = options.strategy == compiler::Strategy::kAuto;
  DataLoaderOptions lo;
  lo.batch_size = options.batch * options.grad_accum;
  lo.seq_len = options.seq;
  lo.rank = step_decides ? t->compiled_->data_rank() : options.rank;
  lo.world_size = step_decides ? t->compiled_->data_ranks() : options.world_size;
  lo.seed = options.seed;
  SG_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::Create(data.train, lo));
  t->loader_ = std::make_unique<DataLoader>(std::move(loader));

  SG_RETURN_IF_ERROR(t->SetWeights(InitialWeights(options.config, options.seed), "initial weights"));
  return t;
}

int64_t Trainer::tokens_per_step() const {
  return options_.batch * options_.grad_accum * options_.seq * loader_->options().world_size;
}

absl::Status Trainer::SetWeights(const std::vector<NamedTensor>& hf, absl::string_view source) {
  SG_RETURN_IF_ERROR(CheckHfLlamaTensors(TensorShapes(hf), options_.config, source));
  for (const NamedTensor& w : hf) {
    absl::StatusOr<std::string> g = GraphParameterName(w.name);
    if (!g.ok()) continue;  // ignored extras (rotary inv_freq buffers), already vetted above
    SG_ASSIGN_OR_RETURN(Tensor f32, ToF32(w.tensor, absl::StrCat(source, ": tensor '", w.name, "'")));
    SG_RETURN_IF_ERROR(compiled_->Write(*g, f32.view()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NamedTensor>> Trainer::Weights() const {
  std::vector<NamedTensor> out;
  for (const HfParameter& p : HfLlamaParameters(options_.config)) {
    SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName(p.name));
    SG_ASSIGN_OR_RETURN(Tensor t, HostF32(p.shape));
    SG_RETURN_IF_ERROR(compiled_->Read(g, t.view()));
    out.push_back({p.name, std::move(t)});
  }
  return out;
}

absl::Status Trainer::Save(const std::string& dir, const std::map<std::string, std::string>& notes,
                           const std::map<std::string, std::string>& extra_files, bool write) const {
  SG_ASSIGN_OR_RETURN(std::vector<NamedTensor> model, Weights());
  std::vector<NamedTensor> optimizer;
  for (const NamedTensor& w : model) {
    SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName(w.name));
    SG_ASSIGN_OR_RETURN(Tensor m, HostF32(w.tensor.shape()));
    SG_ASSIGN_OR_RETURN(Tensor v, HostF32(w.tensor.shape()));
    SG_RETURN_IF_ERROR(compiled_->Read(compiler::AdamMName(g), m.view()));
    SG_RETURN_IF_ERROR(compiled_->Read(compiler::AdamVName(g), v.view()));
    optimizer.push_back({absl::StrCat(w.name, ".", kSlotM), std::move(m)});
    optimizer.push_back({absl::StrCat(w.name, ".", kSlotV), std::move(v)});
  }
  if (!write) return absl::OkStatus();
  CheckpointContents c;
  c.config = options_.config;
  for (const NamedTensor& t : model) c.model.push_back({t.name, t.tensor.view()});
  for (const NamedTensor& t : optimizer) c.optimizer.push_back({t.name, t.tensor.view()});
  c.state = Progress(notes);
  c.extra_files = extra_files;
  return SaveCheckpoint(dir, c);
}

TrainingState Trainer::Progress(const std::map<std::string, std::string>& notes) const {
  TrainingState state;
  state.step = step_;
  state.data = loader_->position();
  std::ostringstream rng;
  rng << rng_;
  state.rng = rng.str();
  state.world_size = options_.world_size;
  state.extra = notes;
  state.extra[kDataSeedNote] = absl::StrCat(loader_->options().seed);
  return state;
}

absl::Status Trainer::Restore(const Checkpoint& ckpt) {
  if (ckpt.config != options_.config) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint config (", LlamaConfigToString(ckpt.config),
                                                   ") differs from the run's (", LlamaConfigToString(options_.config),
                                                   ")"));
  }
  SG_RETURN_IF_ERROR(SetWeights(ckpt.model, "checkpoint model.safetensors"));
  std::map<std::string, const Tensor*> opt;
  for (const NamedTensor& t : ckpt.optimizer) opt[t.name] = &t.tensor;
  for (const HfParameter& p : HfLlamaParameters(options_.config)) {
    SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName(p.name));
    for (const auto& [slot, source] : {std::pair<const char*, std::string>{kSlotM, compiler::AdamMName(g)},
                                       std::pair<const char*, std::string>{kSlotV, compiler::AdamVName(g)}}) {
      const std::string name = absl::StrCat(p.name, ".", slot);
      auto it = opt.find(name);
      if (it == opt.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(kOptimizerFile, ": missing tensor '", name, "' (AdamW state for '", p.name, "')"));
      }
      SG_ASSIGN_OR_RETURN(Tensor f32, ToF32(*it->second, absl::StrCat(kOptimizerFile, ": tensor '", name, "'")));
      SG_RETURN_IF_ERROR(compiled_->Write(source, f32.view()));
    }
  }
  return RestoreProgress(ckpt.state);
}

absl::Status Trainer::RestoreProgress(const TrainingState& state) {
  SG_RETURN_IF_ERROR(WriteScalar(*compiled_, compiler::kStepName, double(state.step)));
  // The data order belongs to the checkpoint: continue its permutation even under another --seed.
  auto seed_note = state.extra.find(kDataSeedNote);
  uint64_t data_seed;
  if (seed_note != state.extra.end() && absl::SimpleAtoi(seed_note->second, &data_seed) &&
      data_seed != loader_->options().seed) {
    DataLoaderOptions lo = loader_->options();
    lo.seed = data_seed;
    SG_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::Create(data_.train, lo));
    *loader_ = std::move(loader);
  }
  // The data position is global (windows consumed by all ranks), so it also resumes under another
  // world size; only bit-exactness needs the same one.
  SG_RETURN_IF_ERROR(loader_->Seek(state.data));
  if (!state.rng.empty()) {
    std::istringstream in(state.rng);
    in >> rng_;
    if (in.fail()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kStateFile, ": field 'rng': expected a serialized std::mt19937_64, found '",
                       state.rng.substr(0, 40), "...'"));
    }
  }
  step_ = state.step;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Step() {
  StepResult r;
  r.lr = ScheduledLearningRate(step_, options_);
  SG_RETURN_IF_ERROR(compiled_->SetLearningRate(float(r.lr)));
  SG_ASSIGN_OR_RETURN(Tensor batch, loader_->Next());
  const int64_t b = batch.shape()[0], s = options_.seq;
  SG_ASSIGN_OR_RETURN(Tensor tokens, Tensor::Empty({b, s}, DType::kI32, Device::Cpu()));
  SG_ASSIGN_OR_RETURN(Tensor targets, Tensor::Empty({b, s}, DType::kI32, Device::Cpu()));
  for (int64_t i = 0; i < b; ++i) {
    const int32_t* row = batch.data<int32_t>() + i * (s + 1);
    std::copy_n(row, s, tokens.data<int32_t>() + i * s);
    std::copy_n(row + 1, s, targets.data<int32_t>() + i * s);
  }
  SG_RETURN_IF_ERROR(compiled_->Run({{"tokens", tokens.view()}, {"targets", targets.view()}}));
  SG_ASSIGN_OR_RETURN(compiler::StepMetrics m, compiled_->ReadMetrics());
  ++step_;
  r.step = step_;
  r.loss = m.loss;
  r.grad_norm = m.grad_norm;
  r.loss_scale = m.loss_scale;
  r.skipped = m.skipped;
  r.tokens = tokens_per_step();
  return r;
}

absl::StatusOr<graph::Feeds> Trainer::WeightFeeds() const {
  graph::Feeds feeds;
  SG_ASSIGN_OR_RETURN(std::vector<NamedTensor> w, Weights());
  for (const NamedTensor& t : w) {
    SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName(t.name));
    feeds[g] = ToHost(t.tensor.view());
  }
  return feeds;
}

absl::StatusOr<std::pair<double, std::vector<double>>> Trainer::Forward(const Tensor& tokens,
                                                                        const Tensor& targets) const {
  SG_ASSIGN_OR_RETURN(graph::Feeds feeds, WeightFeeds());
  feeds["tokens"] = ToHost(tokens.view());
  feeds["targets"] = ToHost(targets.view());
  SG_ASSIGN_OR_RETURN(graph::Feeds out, graph::Interpret(eval_graph_, feeds));
  return std::make_pair(out.at("loss").data[0], std::move(out.at("logits").data));
}

absl::StatusOr<compiler::EvalStep*> Trainer::EvalStepWithWeights(int64_t batch) const {
  std::unique_ptr<compiler::EvalStep>& step = eval_steps_[batch];
  if (step == nullptr) {
    compiler::CompileOptions co;
    co.device = options_.device;
    co.precision = options_.precision;
    co.binding = {{"batch", batch}, {"seq", options_.seq}};
    SG_ASSIGN_OR_RETURN(step, compiler::CompileForward(eval_graph_, co));
  }
  SG_RETURN_IF_ERROR(step->CopyParametersFrom(*compiled_, options_.strategy != compiler::Strategy::kNone));
  return step.get();
}

absl::StatusOr<double> Trainer::ValidationLoss(int64_t max_batches) const {
  DataLoaderOptions lo;
  lo.batch_size = options_.batch;
  lo.seq_len = options_.seq;
  lo.shuffle = false;
  SG_ASSIGN_OR_RETURN(DataLoader val, DataLoader::Create(data_.val, lo));
  SG_ASSIGN_OR_RETURN(compiler::EvalStep * eval, EvalStepWithWeights(options_.batch));
  const int64_t n = std::max<int64_t>(1, std::min(max_batches, val.steps_per_epoch()));
  const int64_t b = options_.batch, s = options_.seq;
  SG_ASSIGN_OR_RETURN(Tensor tokens, Tensor::Empty({b, s}, DType::kI32, Device::Cpu()));
  SG_ASSIGN_OR_RETURN(Tensor targets, Tensor::Empty({b, s}, DType::kI32, Device::Cpu()));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    SG_ASSIGN_OR_RETURN(Tensor batch, val.Next());
    for (int64_t r = 0; r < b; ++r) {
      const int32_t* row = batch.data<int32_t>() + r * (s + 1);
      std::copy_n(row, s, tokens.data<int32_t>() + r * s);
      std::copy_n(row + 1, s, targets.data<int32_t>() + r * s);
    }
    SG_RETURN_IF_ERROR(eval->Run({{"tokens", tokens.view()}, {"targets", targets.view()}}));
    SG_ASSIGN_OR_RETURN(float loss, eval->ReadLoss());
    sum += loss;
  }
  return sum / double(n);
}

absl::StatusOr<std::vector<int32_t>> Trainer::Sample(const std::vector<int32_t>& prompt, int64_t n,
                                                     double temperature) {
  SG_CHECK_ARG(!prompt.empty(), "Sample: the prompt needs at least one token (e.g. BOS)");
  SG_ASSIGN_OR_RETURN(compiler::EvalStep * eval, EvalStepWithWeights(1));
  SG_ASSIGN_OR_RETURN(TensorView logits_view, eval->View("logits"));
  const int64_t vocab = options_.config.vocab_size, s = options_.seq;
  SG_ASSIGN_OR_RETURN(Tensor tokens, Tensor::Empty({1, s}, DType::kI32, Device::Cpu()));
  SG_ASSIGN_OR_RETURN(Tensor targets, Tensor::Empty({1, s}, DType::kI32, Device::Cpu()));
  std::fill_n(targets.data<int32_t>(), s, 0);
  SG_ASSIGN_OR_RETURN(Tensor row, Tensor::Empty({vocab}, logits_view.dtype(), Device::Cpu()));
  std::vector<double> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> seq = prompt;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t len = std::min<int64_t>(int64_t(seq.size()), s);
    std::fill_n(tokens.data<int32_t>(), s, 0);
    std::copy_n(seq.end() - len, len, tokens.data<int32_t>());
    SG_RETURN_IF_ERROR(eval->Run({{"tokens", tokens.view()}, {"targets", targets.view()}}));
    SG_RETURN_IF_ERROR(eval->ReadSlice("logits", (len - 1) * vocab, row.view()));
    SG_ASSIGN_OR_RETURN(Tensor f32, ToF32(row, "logits"));
    std::copy_n(f32.data<float>(), vocab, logits.begin());
    int32_t next = 0;
    if (temperature <= 0) {
      next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      const double top = *std::max_element(logits.begin(), logits.end());
      std::vector<double> p(vocab);
      double total = 0;
      for (int64_t v = 0; v < vocab; ++v) total += p[v] = std::exp((logits[v] - top) / temperature);
      double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
      next = int32_t(vocab - 1);
      for (int64_t v = 0; v < vocab; ++v) {
        if ((u -= p[v]) < 0) {
          next = int32_t(v);
          break;
        }
      }
    }
    seq.push_back(next);
  }
  return std::vector<int32_t>(seq.begin() + prompt.size(), seq.end());
}

}  // namespace sg::trainer
