#include "compiler/tensor_parallel.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/data_parallel_graph.h"
#include "compiler/dist_cuda_graph.h"
#include "compiler/host_tensor_check.h"
#include "compiler/tensor_parallel_fsdp.h"
#include "compiler/tensor_parallel_steps.h"
#include "graph/ops.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/status.h"
#include "sharding/placement.h"

namespace sg::compiler {

using graph::Phase;

struct TensorParallelStep::Param {
  TpParam tp;                     // name, split dim, global and local shapes
  TensorView param, grad, m, v;   // this rank's slice (the whole tensor when replicated), f32
  int64_t global_numel = 0;
};

namespace {

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

TensorParallelStep::~TensorParallelStep() {
  // The executor's steps point into this object's buffers: stop it first (with the deadline).
  if (executor_ != nullptr) (void)Wait();
  executor_.reset();
}

absl::Status TensorParallelStep::Wait() const {
  return WaitForStep(*executor_, context_ != nullptr ? &context_->world() : nullptr, comm_timeout_);
}

absl::StatusOr<std::unique_ptr<TensorParallelStep>> TensorParallelStep::Create(const graph::Graph& train,
                                                                               const CompileOptions& options,
                                                                               TensorParallelLayout layout,
                                                                               std::shared_ptr<DistContext> context,
                                                                               std::string explanation) {
  std::unique_ptr<TensorParallelStep> s(new TensorParallelStep());
  s->layout_ = layout;
  s->context_ = std::move(context);
  s->explanation_ = std::move(explanation);
  s->tp_size_ = layout.tp ? layout.tp->size() : 1;
  s->tp_rank_ = layout.tp ? layout.tp->rank() : 0;
  s->dp_size_ = layout.dp ? layout.dp->size() : 1;
  s->data_rank_ = layout.dp ? layout.dp->rank() : 0;
  s->data_ranks_ = s->dp_size_;
  SG_RETURN_IF_ERROR(s->Build(train, options));
  return s;
}

absl::Status TensorParallelStep::Build(const graph::Graph& train, const CompileOptions& o) {
  SG_ASSIGN_OR_RETURN(DataParallelGraph dp, SplitOptimizer(train, o.loss));
  max_grad_norm_ = dp.max_grad_norm;
  beta1_ = float(dp.beta1);
  beta2_ = float(dp.beta2);
  eps_ = float(dp.eps);
  targets_ = dp.targets;
  ignore_index_ = dp.ignore_index;
  TensorParallelGraphOptions go;
  go.vocab_parallel = o.tp_vocab_parallel;
  SG_ASSIGN_OR_RETURN(tp_, BuildTensorParallelGraph(dp, tp_size_, tp_rank_, go));
  absl::StrAppend(&explanation_, "; tensor parallel: ", tp_.Summary());
  LowerOptions lo;
  // The loss's backward seed (1, or this dp rank's token share), staged by Run, is read on the
  // device by the cross-entropy kernel when it runs: the step stays capturable.
  lo.device_scalars.insert(kLossScaleName);
  lo.fuse_device_scalars = false;  // the vocabulary-parallel steps replace the unfused pair
  SG_ASSIGN_OR_RETURN(program_, Lower(tp_.graph, o.binding, o.device, lo));
  for (const TpParam& t : tp_.params) {
    auto p = std::make_unique<Param>();
    p->tp = t;
    p->global_numel = Numel(t.global);
    p->param = program_->sources.at(t.name);
    p->grad = program_->outputs.at("grad:" + t.name);
    if (p->param.dtype() != DType::kF32 || p->grad.dtype() != DType::kF32) {
      return absl::UnimplementedError(absl::StrCat("tensor parallel: parameter '", t.name, "' is ",
                                                   DTypeName(p->param.dtype()), " with a ", DTypeName(p->grad.dtype()),
                                                   " gradient, expected f32 master weights and gradients"));
    }
    param_index_[t.name] = int(params_.size());
    parameter_names_.push_back(t.name);
    params_.push_back(std::move(p));
  }
  SG_RETURN_IF_ERROR(Allocate());
  tp_steps_ = std::make_unique<TpStepResources>();
  const TpCommStep comm_step = [this](std::string name, Phase phase, std::function<absl::Status(const Stream&)> body,
                                      Event* done) { return CommStep(std::move(name), phase, std::move(body), done); };
  SG_RETURN_IF_ERROR(ReplaceVocabSteps(*program_, tp_, layout_.tp, comm_step, tp_steps_.get()));
  SG_RETURN_IF_ERROR(InsertTpAllReduces(*program_, tp_, layout_.tp, comm_step, tp_steps_.get()));
  SG_RETURN_IF_ERROR(Schedule());
  // Captured after the warm-up like the single-device step (compiler/dist_cuda_graph.h).
  comm_timeout_ = absl::Seconds(o.comm_timeout_s);
  ExecutorOptions eo;
  eo.cuda_graph = o.cuda_graph;
  eo.warmup_steps = std::max(o.warmup_steps, kMinDistributedWarmup);
  eo.before_capture = [this] { return Wait(); };
  SG_ASSIGN_OR_RETURN(executor_, Executor::Create(program_.get(), eo));
  absl::StrAppend(&explanation_, "; ", GraphModeExplanation(o, *executor_));
  std::map<std::string, TensorView> inputs;
  for (const std::string& name : program_->input_names) inputs[name] = program_->sources.at(name);
  SG_ASSIGN_OR_RETURN(CompiledStep::staging_, InputStaging::Create(o.device, inputs));
  const Stream& s = executor_->compute_stream();
  SG_RETURN_IF_ERROR(ZeroTensor(TensorView(moments_.data(), DType::kF32, {moments_.bytes() / 4}, o.device), s));
  SG_RETURN_IF_ERROR(ZeroTensor(TensorView(scalars_.data(), DType::kF32, {scalars_.bytes() / 4}, o.device), s));
  return executor_->Synchronize();
}

absl::Status TensorParallelStep::Allocate() {
  const Device d = program_->device;
  int64_t moment_bytes = 0;
  for (const auto& p : params_) moment_bytes += 2 * AlignUp(p->param.numel() * 4);
  SG_ASSIGN_OR_RETURN(moments_, DeviceMemory::Allocate(d, std::max<int64_t>(moment_bytes, 256)));
  int64_t off = 0;
  for (auto& p : params_) {
    const int64_t n = p->param.numel();
    p->m = TensorView(moments_.data() + off, DType::kF32, p->param.shape(), d);
    off += AlignUp(n * 4);
    p->v = TensorView(moments_.data() + off, DType::kF32, p->param.shape(), d);
    off += AlignUp(n * 4);
  }
  const int64_t T = tp_size_, D = dp_size_;
  SG_ASSIGN_OR_RETURN(scalars_, DeviceMemory::Allocate(d, AlignUp(8) * 6 + 4 * AlignUp(T * 4) + 2 * AlignUp(4 * D) +
                                                               4 * AlignUp(4)));
  int64_t at = 0;
  auto take = [&](int64_t n, DType t = DType::kF32) {
    TensorView v(scalars_.data() + at, t, {n}, d);
    at += AlignUp(std::max<int64_t>(n * int64_t(SizeOf(t)), 8));
    return v;
  };
  lr_ = take(1);
  counter_ = TensorView(take(1, DType::kI64).raw(), DType::kI64, {}, d);
  norm_split_ = take(1);
  norm_repl_ = take(1);
  norm_ = take(1);
  clip_ = take(1);
  norms_ = take(T);
  losses_ = take(D);
  dummy_[0] = take(T);
  dummy_[1] = take(1);

  std::vector<kernels::AdamWParam> all, split, repl;
  for (const auto& p : params_) {
    kernels::AdamWParam a;
    a.param = p->param;
    a.grad = p->grad;
    a.m = p->m;
    a.v = p->v;
    a.weight_decay = float(p->tp.weight_decay);
    all.push_back(a);
    (p->tp.dim >= 0 ? split : repl).push_back(a);
  }
  auto make = [](const std::vector<kernels::AdamWParam>& v) -> absl::StatusOr<std::shared_ptr<void>> {
    if (v.empty()) return std::shared_ptr<void>();
    SG_ASSIGN_OR_RETURN(kernels::AdamWTensorList l, kernels::AdamWTensorList::Create(v));
    return std::shared_ptr<void>(std::make_shared<kernels::AdamWTensorList>(std::move(l)));
  };
  SG_ASSIGN_OR_RETURN(all_list_, make(all));
  SG_ASSIGN_OR_RETURN(split_list_, make(split));
  SG_ASSIGN_OR_RETURN(repl_list_, make(repl));
  if (all_list_ == nullptr) return absl::InvalidArgumentError("tensor parallel: the step updates no parameters");
  // The global norm over the pieces: every tp rank's split-gradient norm and the replicated norm.
  kernels::AdamWParam a, b;
  a.param = a.m = a.v = dummy_[0];
  a.grad = norms_;
  b.param = b.m = b.v = dummy_[1];
  b.grad = norm_repl_;
  SG_ASSIGN_OR_RETURN(norm_list_, make({a, b}));
  for (auto* e : {&ready_, &grads_done_, &norms_done_, &comm_done_}) {
    SG_ASSIGN_OR_RETURN(Event ev, Event::Create(d));
    *e = std::make_unique<Event>(std::move(ev));
  }
  return absl::OkStatus();
}

// After the tp all-reduces (InsertTpAllReduces): the dp gradient all-reduces, the grad norm and
// AdamW on the local slices.
absl::Status TensorParallelStep::Schedule() {
  std::multimap<int, Step> after;
  const graph::Graph& g = program_->graph;
  if (layout_.dp != nullptr) {
    // Data parallelism: each unit's gradients (compiler/UnitOf: a block, the embedding, ...) are
    // summed over the dp group as soon as the last of them exists, overlapping the rest of the
    // backward; the optimizer waits for all of them (one comm stream, in order).
    std::map<std::string, std::pair<int, std::vector<TensorView>>> units;
    for (const auto& p : params_) {
      const int o = g.FindOutput("grad:" + p->tp.name);
      auto& u = units[UnitOf(p->tp.name)];
      u.first = std::max(u.first, g.value(g.outputs()[size_t(o)].value).producer);
      u.second.push_back(p->grad);
    }
    comm::ProcessGroup* dp = layout_.dp;
    for (const auto& [name, u] : units) {
      const std::vector<TensorView> grads = u.second;
      after.emplace(u.first, CommStep(absl::StrCat("all-reduce(dp) gradients of ", name), Phase::kBackward,
                                      [dp, grads](const Stream& s) -> absl::Status {
                                        for (const TensorView& t : grads) {
                                          SG_RETURN_IF_ERROR(dp->AllReduce(t, comm::ReduceOp::kSum, s));
                                        }
                                        return absl::OkStatus();
                                      },
                                      grads_done_.get()));
    }
  }
  auto flush = [](std::multimap<int, Step>* m, int below, std::vector<Step>* out) {
    while (!m->empty() && m->begin()->first < below) {
      out->push_back(std::move(m->begin()->second));
      m->erase(m->begin());
    }
  };
  std::vector<Step> steps;
  for (Step& st : program_->schedule.steps) {
    if (st.node >= 0) flush(&after, st.node, &steps);
    steps.push_back(std::move(st));
  }
  flush(&after, INT_MAX, &steps);

  const Phase opt = Phase::kOptimizer;
  if (layout_.dp != nullptr) {
    steps.push_back(WaitStep("wait all-reduce(dp) gradients", Phase::kBackward, grads_done_.get()));
  }
  const TensorView loss = program_->outputs.at(tp_.graph.outputs()[0].name);
  steps.push_back(CommStep("all-gather(dp) losses", opt, [this, loss](const Stream& s) -> absl::Status {
    const TensorView one(loss.raw(), DType::kF32, {1}, loss.device());
    if (layout_.dp == nullptr) return CopyTensor(one, losses_, s);
    return layout_.dp->AllGather(one, losses_, s);
  }, comm_done_.get()));
  auto kernel = [&](std::string name, std::function<absl::Status(const Stream&)> f) {
    Step st;
    st.name = std::move(name);
    st.phase = opt;
    st.impl = "kernel";
    st.launch = std::move(f);
    steps.push_back(std::move(st));
  };
  auto split = std::static_pointer_cast<kernels::AdamWTensorList>(split_list_);
  auto repl = std::static_pointer_cast<kernels::AdamWTensorList>(repl_list_);
  auto pieces = std::static_pointer_cast<kernels::AdamWTensorList>(norm_list_);
  auto all = std::static_pointer_cast<kernels::AdamWTensorList>(all_list_);
  if (split != nullptr) {
    kernel("grad_norm (split gradients, local)",
           [this, split](const Stream& s) { return kernels::GradNorm(*split, 0.f, norm_split_, TensorView(), s); });
  }
  if (repl != nullptr) {
    kernel("grad_norm (replicated gradients)",
           [this, repl](const Stream& s) { return kernels::GradNorm(*repl, 0.f, norm_repl_, TensorView(), s); });
  }
  steps.push_back(CommStep("all-gather(tp) split grad norms", opt, [this](const Stream& s) -> absl::Status {
    if (layout_.tp == nullptr) return CopyTensor(norm_split_, norms_, s);
    return layout_.tp->AllGather(norm_split_, norms_, s);
  }, norms_done_.get()));
  steps.push_back(WaitStep("wait split grad norms", opt, norms_done_.get()));
  const float max_norm = float(max_grad_norm_);
  kernel("grad_norm (global)", [this, pieces, max_norm](const Stream& s) {
    return kernels::GradNorm(*pieces, max_norm, norm_, clip_, s);
  });
  const kernels::AdamWConfig c{beta1_, beta2_, eps_};
  kernel(absl::StrCat("adamw (multi-tensor, local slices of ", params_.size(), " parameters)"),
         [this, all, c](const Stream& s) { return kernels::AdamWStep(*all, c, lr_, counter_, clip_, s); });
  steps.push_back(WaitStep("join comm stream", opt, comm_done_.get()));
  program_->schedule.steps = std::move(steps);
  return absl::OkStatus();
}

absl::Status TensorParallelStep::PrepareBatch(const std::map<std::string, TensorView>& batch) {
  auto t = batch.find(targets_);
  if (t == batch.end()) {
    return absl::InvalidArgumentError(absl::StrCat("Run: missing input '", targets_, "' (the loss's targets)"));
  }
  Tensor host;
  TensorView targets = t->second;
  if (!targets.device().is_cpu()) {
    SG_ASSIGN_OR_RETURN(host, Tensor::Empty(targets.shape(), targets.dtype(), Device::Cpu()));
    SG_RETURN_IF_ERROR(CopyTensor(targets, host.view(), executor_->compute_stream()));
    SG_RETURN_IF_ERROR(Wait());
    targets = host.view();
  }
  const int64_t count = CountTargetsPerPart(targets, ignore_index_, 1)[0];
  counts_.assign(size_t(dp_size_), count);
  if (layout_.dp != nullptr) {
    int64_t mine = count;
    SG_RETURN_IF_ERROR(layout_.dp->AllGather(TensorView(&mine, DType::kI64, {1}, Device::Cpu()),
                                             TensorView(counts_.data(), DType::kI64, {dp_size_}, Device::Cpu())));
  }
  int64_t total = 0;
  for (int64_t c : counts_) total += c;
  // One dp rank: the seed stays exactly 1 (the loss's own mean); otherwise this rank's share.
  loss_scale_host_ = layout_.dp == nullptr ? 1.f : total > 0 ? float(double(count) / double(total)) : 0.f;
  SG_RETURN_IF_ERROR(staging_.Stage(kLossScaleName, TensorView(&loss_scale_host_, DType::kF32, {}, Device::Cpu()),
                                    program_->sources.at(kLossScaleName), executor_->compute_stream()));
  return CopyInputs(batch);
}

absl::Status TensorParallelStep::Run(const std::map<std::string, TensorView>& batch) {
  SG_RETURN_IF_ERROR(PrepareBatch(batch));
  return executor_->Run();
}

absl::StatusOr<StepTrace> TensorParallelStep::TraceStep(const std::map<std::string, TensorView>& batch) {
  SG_RETURN_IF_ERROR(PrepareBatch(batch));
  return executor_->RunTraced();
}

absl::StatusOr<StepMetrics> TensorParallelStep::ReadMetrics() const {
  SG_RETURN_IF_ERROR(Wait());
  std::vector<float> losses(size_t(dp_size_), 0.f);
  StepMetrics m;
  int64_t step = 0;
  const Stream& s = executor_->compute_stream();
  SG_RETURN_IF_ERROR(CopyTensor(losses_, TensorView(losses.data(), DType::kF32, {dp_size_}, Device::Cpu()), s));
  SG_RETURN_IF_ERROR(CopyTensor(norm_, TensorView(&m.grad_norm, DType::kF32, {1}, Device::Cpu()), s));
  SG_RETURN_IF_ERROR(CopyTensor(counter_, TensorView(&step, DType::kI64, {}, Device::Cpu()), s));
  SG_RETURN_IF_ERROR(Wait());
  m.loss = dp_size_ == 1 ? losses[0] : TokenWeightedLoss(losses, counts_);
  m.step = step;
  return m;
}

absl::Status TensorParallelStep::SetLearningRate(float lr) {
  SG_RETURN_IF_ERROR(CopyTensor(TensorView(&lr, DType::kF32, {1}, Device::Cpu()), lr_, executor_->compute_stream()));
  return Wait();
}

const TensorParallelStep::Param* TensorParallelStep::FindParam(const std::string& name,
                                                               const std::string& prefix) const {
  if (!absl::StartsWith(name, prefix)) return nullptr;
  auto it = param_index_.find(name.substr(prefix.size()));
  return it == param_index_.end() ? nullptr : params_[size_t(it->second)].get();
}

absl::StatusOr<TensorView> TensorParallelStep::View(const std::string& name) const {
  if (const Param* p = FindParam(name, "opt.m.")) return p->m;
  if (const Param* p = FindParam(name, "opt.v.")) return p->v;
  if (const Param* p = FindParam(name, "grad:")) return p->grad;
  if (const Param* p = FindParam(name, "")) return p->param;
  if (name == kLrName) return lr_;
  if (name == "grad_norm") return norm_;
  return CompiledStep::View(name);
}

absl::Status TensorParallelStep::Write(const std::string& name, const TensorView& host) {
  const Stream& s = executor_->compute_stream();
  if (name == kLrName) {
    SG_RETURN_IF_ERROR(CheckFullF32(name, 1, host));
    float lr = 0;
    SG_RETURN_IF_ERROR(CopyTensor(host, TensorView(&lr, DType::kF32, host.shape(), Device::Cpu()), s));
    SG_RETURN_IF_ERROR(Wait());
    return SetLearningRate(lr);
  }
  if (name == kStepName) {
    SG_RETURN_IF_ERROR(CheckFullF32(name, 1, host));
    float f = 0;
    SG_RETURN_IF_ERROR(CopyTensor(host, TensorView(&f, DType::kF32, host.shape(), Device::Cpu()), s));
    SG_RETURN_IF_ERROR(Wait());
    int64_t n = int64_t(f);
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(&n, DType::kI64, {}, Device::Cpu()), counter_, s));
    return Wait();
  }
  for (const char* prefix : {"opt.m.", "opt.v.", ""}) {
    const Param* p = FindParam(name, prefix);
    if (p == nullptr) continue;
    SG_RETURN_IF_ERROR(CheckFullF32(name, p->global_numel, host));
    const TensorView dst = prefix[0] == '\0' ? p->param : (prefix[4] == 'm' ? p->m : p->v);
    std::vector<float> full(size_t(p->global_numel)), local(size_t(dst.numel()));
    SG_RETURN_IF_ERROR(CopyTensor(host, TensorView(full.data(), DType::kF32, host.shape(), Device::Cpu()), s));
    SG_RETURN_IF_ERROR(Wait());
    if (p->tp.dim < 0) {
      local = full;
    } else {
      TpSplit(p->tp.global, p->tp.dim, tp_size_).Copy(full.data(), local.data(), tp_rank_, /*to_full=*/false);
    }
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(local.data(), DType::kF32, {dst.numel()}, Device::Cpu()), dst, s));
    return Wait();
  }
  return CompiledStep::Write(name, host);
}

absl::Status TensorParallelStep::Read(const std::string& name, const TensorView& host) const {
  SG_RETURN_IF_ERROR(Wait());
  const Stream& s = executor_->compute_stream();
  for (const char* prefix : {"opt.m.", "opt.v.", "grad:", ""}) {
    const Param* p = FindParam(name, prefix);
    if (p == nullptr) continue;
    SG_RETURN_IF_ERROR(CheckFullF32(name, p->global_numel, host));
    SG_ASSIGN_OR_RETURN(TensorView src, View(name));
    std::vector<float> full(size_t(p->global_numel));
    if (p->tp.dim < 0 || layout_.tp == nullptr) {
      SG_RETURN_IF_ERROR(CopyTensor(src, TensorView(full.data(), DType::kF32, {src.numel()}, Device::Cpu()), s));
      SG_RETURN_IF_ERROR(Wait());
    } else {
      // Every piece padded to the largest one (uneven vocabulary pieces), all-gathered in rank order.
      const TpSplit split(p->tp.global, p->tp.dim, tp_size_);
      const int64_t n = split.MaxNumel();
      SG_ASSIGN_OR_RETURN(Tensor send, Tensor::Empty({n}, DType::kF32, program_->device));
      SG_ASSIGN_OR_RETURN(Tensor recv, Tensor::Empty({n * tp_size_}, DType::kF32, program_->device));
      SG_RETURN_IF_ERROR(ZeroTensor(send.view(), s));
      SG_RETURN_IF_ERROR(CopyTensor(src, TensorView(send.view().raw(), DType::kF32, {src.numel()}, program_->device), s));
      SG_RETURN_IF_ERROR(layout_.tp->AllGather(send.view(), recv.view(), s));
      std::vector<float> gathered(size_t(n * tp_size_));
      SG_RETURN_IF_ERROR(CopyTensor(recv.view(), TensorView(gathered.data(), DType::kF32, {n * tp_size_}, Device::Cpu()), s));
      SG_RETURN_IF_ERROR(Wait());
      for (int r = 0; r < tp_size_; ++r) split.Copy(full.data(), gathered.data() + r * n, r, /*to_full=*/true);
    }
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(full.data(), DType::kF32, host.shape(), Device::Cpu()), host, s));
    return Wait();
  }
  if (name == "loss" || name == "grad_norm" || name == kStepName) {
    SG_RETURN_IF_ERROR(CheckFullF32(name, 1, host));
    SG_ASSIGN_OR_RETURN(StepMetrics m, ReadMetrics());
    float v = name == "loss" ? m.loss : name == "grad_norm" ? m.grad_norm : float(m.step);
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(&v, DType::kF32, host.shape(), Device::Cpu()), host, s));
    return Wait();
  }
  if (name == kLrName) {
    SG_RETURN_IF_ERROR(CopyTensor(lr_, host, s));
    return Wait();
  }
  return CompiledStep::Read(name, host);
}

absl::StatusOr<std::unique_ptr<CompiledStep>> CompileTensorParallel(const graph::Graph& train,
                                                                   const CompileOptions& o,
                                                                   std::shared_ptr<DistContext> ctx,
                                                                   const sharding::DeviceMesh& mesh,
                                                                   const std::string& why_first) {
  if (o.micro_batches > 1) {
    return absl::UnimplementedError(absl::StrCat("tensor parallel: gradient accumulation (micro_batches) is not lowered "
                                                 "yet: expected micro_batches 1, found ", o.micro_batches));
  }
  if (mesh.ndim() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: expected a 1-D mesh (tp) or a 2-D mesh (dp x tp), found ",
                                                   mesh.ToString()));
  }
  TensorParallelLayout layout;
  const int tp_dim = mesh.ndim() - 1;
  SG_ASSIGN_OR_RETURN(layout.tp, ctx->Group(mesh, {tp_dim}));
  if (mesh.ndim() == 2) {
    SG_ASSIGN_OR_RETURN(layout.dp, ctx->Group(mesh, {0}));
  }
  const bool fsdp = mesh.ndim() == 2 && o.tensor_parallel_fsdp;
  std::string why = absl::StrCat(why_first, why_first.empty() ? "" : "; ", "strategy tensor_parallel: tp over ",
                                 mesh.dim_size(tp_dim), " ranks",
                                 mesh.ndim() == 2 ? absl::StrCat(" (mesh dim 1) x ", fsdp ? "fsdp" : "data parallel",
                                                                 " over ", mesh.dim_size(0), " (mesh dim 0)")
                                                  : std::string());
  if (fsdp) {
    SG_ASSIGN_OR_RETURN(comm::ProcessGroup * all, ctx->Group(mesh, {0, 1}));
    SG_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelFsdpStep> step,
                        TensorParallelFsdpStep::Create(train, o, layout.tp, layout.dp, all, std::move(ctx), std::move(why)));
    return std::unique_ptr<CompiledStep>(std::move(step));
  }
  SG_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelStep> step,
                      TensorParallelStep::Create(train, o, layout, std::move(ctx), std::move(why)));
  return std::unique_ptr<CompiledStep>(std::move(step));
}

absl::Status TensorParallelApplies(const graph::Graph& train, int tp_size, const std::string& loss) {
  SG_ASSIGN_OR_RETURN(DataParallelGraph dp, SplitOptimizer(train, loss));
  return BuildTensorParallelGraph(dp, tp_size, 0).status();
}

}  // namespace sg::compiler
