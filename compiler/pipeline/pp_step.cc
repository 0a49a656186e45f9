#include "compiler/pipeline/pp_step.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/training_graph.h"
#include "graph/ops.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"

namespace sg::compiler {

using graph::OpKind;
using graph::Phase;

struct PipelineStep::Param {
  std::string name;
  TensorView master, grad_out;  // program source (f32) and its "grad:<p>" output
  Tensor acc, m, v, scratch;    // accumulated f32 gradient, moments; f32 copy of a non-f32 grad
  // pipeline_fsdp: this rank's rows of the master weights and of the dp-summed gradient (m and v
  // are then shard-sized too).
  Tensor shard, grad_shard;
  float weight_decay = 0;
};

namespace {

constexpr uint64_t kTagBase = uint64_t(1) << 34;  // below the ring attention tags, above collectives

// Rows [i*b, (i+1)*b) of dim 0 of a contiguous tensor.
TensorView Rows(const TensorView& t, int64_t i, int64_t b) {
  const int64_t row = t.shape()[0] == 0 ? 0 : t.numel() / t.shape()[0];
  Shape s = t.shape();
  s[0] = b;
  return TensorView(static_cast<char*>(t.raw()) + i * b * row * SizeOf(t.dtype()), t.dtype(), s, t.device());
}

}  // namespace

PipelineStep::~PipelineStep() {
  if (executor_ != nullptr) (void)executor_->Synchronize();
  executor_.reset();
}

absl::StatusOr<std::unique_ptr<PipelineStep>> PipelineStep::Create(const graph::Graph& forward, const CompileOptions& o) {
  std::unique_ptr<PipelineStep> s(new PipelineStep());
  SG_RETURN_IF_ERROR(s->Build(forward, o));
  return s;
}

absl::Status PipelineStep::Build(const graph::Graph& forward, const CompileOptions& o) {
  SG_RETURN_IF_ERROR(graph::Verify(forward));
  SG_ASSIGN_OR_RETURN(const int stages, SetUpGroups(o));
  SG_ASSIGN_OR_RETURN(const std::vector<std::string> parameters, LowerStage(forward, stages, o));
  SG_RETURN_IF_ERROR(AllocateOptimizer(parameters, o));
  return StartLink(o);
}

absl::StatusOr<int> PipelineStep::SetUpGroups(const CompileOptions& o) {
  comm::ProcessGroupOptions po;
  po.timeout = absl::Seconds(o.comm_timeout_s);
  timeout_ = po.timeout;
  SG_ASSIGN_OR_RETURN(context_, DistContext::FromEnv(o.device, po));
  const int world = context_->world_size();
  const std::vector<int64_t> shape = o.mesh.empty() ? std::vector<int64_t>{world} : o.mesh;
  SG_CHECK_ARG(shape.size() <= 2, "pipeline: mesh must be {pp} or {dp, pp}, found ", shape.size(), " dims");
  const std::vector<int> sizes(shape.begin(), shape.end());
  SG_ASSIGN_OR_RETURN(sharding::DeviceMesh mesh, shape.size() == 1 ? sharding::DeviceMesh::Create({"pp"}, sizes)
                                                                   : sharding::DeviceMesh::Create({"dp", "pp"}, sizes));
  SG_CHECK_ARG(mesh.size() == world, "pipeline: mesh ", mesh.ToString(), " has ", mesh.size(), " ranks, the job has ",
               world, " (WORLD_SIZE)");
  if (o.recompute != RecomputePolicy::kNone) {
    return absl::UnimplementedError("pipeline: stages always recompute their forward in the backward; set recompute = kNone");
  }
  SG_ASSIGN_OR_RETURN(pp_, context_->Group(mesh, {int(shape.size()) - 1}));
  if (pp_ == nullptr) {
    SG_CHECK_ARG(world == 1, "pipeline: the pp dim needs at least 2 ranks, found mesh ", mesh.ToString());
    pp_ = &context_->world();
  }
  if (shape.size() == 2) {
    SG_ASSIGN_OR_RETURN(dp_, context_->Group(mesh, {0}));
  }
  SG_CHECK_ARG(!o.pipeline_fsdp || shape.size() == 2, "pipeline: pipeline_fsdp shards each stage over the dp dim of a ",
               "{dp, pp} mesh, found mesh ", mesh.ToString());
  micro_ = o.micro_batches;
  auto batch = o.binding.find("batch");
  SG_CHECK_ARG(batch != o.binding.end(), "pipeline: the binding must give 'batch'");
  SG_CHECK_ARG(micro_ >= 1 && batch->second % micro_ == 0, "pipeline: batch ", batch->second,
               " must split into micro_batches = ", micro_, " equal parts");
  micro_batch_ = batch->second / micro_;
  adamw_ = o.adamw;
  loss_name_ = o.loss;
  return int(shape.back());
}

absl::StatusOr<std::vector<std::string>> PipelineStep::LowerStage(const graph::Graph& forward, int stages,
                                                                  const CompileOptions& o) {
  graph::Graph g = forward;
  if (o.precision == Precision::kBF16Mixed) {
    SG_ASSIGN_OR_RETURN(g, ToMixedPrecision(forward));
  }
  SG_ASSIGN_OR_RETURN(std::vector<StageGraph> split, SplitIntoStages(g, stages, o.loss));
  for (const StageGraph& sg : split) {
    for (const graph::Node& n : sg.forward.nodes()) {
      if (n.op != OpKind::kParameter || !graph::AttrBool(n, "trainable")) continue;
      SG_ASSIGN_OR_RETURN(Shape shape, graph::Evaluate(graph::AttrShape(n, "shape"), o.binding));
      owner_[graph::AttrString(n, "name")] = {sg.spec.stage, NumElements(shape)};
    }
  }
  StageGraph& mine = split[size_t(pp_->rank())];
  spec_ = mine.spec;
  // The loss's targets and ignore index, for the token-count weights (last stage).
  for (const graph::Node& n : mine.forward.nodes()) {
    if (n.op == OpKind::kSoftmaxCrossEntropy || n.op == OpKind::kNllLoss) {
      const graph::Node& t = mine.forward.nodes()[size_t(mine.forward.value(n.inputs[1]).producer)];
      if (t.op == OpKind::kInput) targets_name_ = graph::AttrString(t, "name");
      ignore_index_ = graph::AttrInt(n, "ignore_index");
    }
  }
  if (spec_.last() && targets_name_.empty()) {
    return absl::UnimplementedError("pipeline: the loss must be softmax_cross_entropy / nll_loss of an input's targets");
  }
  SG_ASSIGN_OR_RETURN(graph::Graph train, PrepareStageStep(mine, o.fuse));
  graph::Binding binding = o.binding;
  binding["batch"] = micro_batch_;
  SG_ASSIGN_OR_RETURN(program_, Lower(std::move(train), binding, o.device));
  ExecutorOptions eo;
  eo.cuda_graph = false;  // actions run a subset of the schedule
  SG_ASSIGN_OR_RETURN(executor_, Executor::Create(program_.get(), eo));
  if (!spec_.last()) {
    const TensorView h = program_->outputs.at(kStageOutput);
    act_shape_ = h.shape();
    act_dtype_ = h.dtype();
  } else if (!spec_.first()) {
    const TensorView h = program_->sources.at(kStageInput);
    act_shape_ = h.shape();
    act_dtype_ = h.dtype();
  }
  return mine.parameters;
}

absl::Status PipelineStep::AllocateOptimizer(const std::vector<std::string>& parameters, const CompileOptions& o) {
  const Device d = o.device;
  const Stream& st = executor_->compute_stream();
  std::vector<kernels::AdamWParam> list;
  for (const std::string& name : parameters) {
    auto p = std::make_unique<Param>();
    p->name = name;
    p->master = program_->sources.at(name);
    p->grad_out = program_->outputs.at("grad:" + name);
    if (p->master.dtype() != DType::kF32) {
      return absl::UnimplementedError(absl::StrCat("pipeline: parameter '", name, "' is ", DTypeName(p->master.dtype()),
                                                   ", expected f32 master weights"));
    }
    p->weight_decay = p->master.rank() >= 2 ? float(o.adamw.weight_decay) : 0.f;
    SG_ASSIGN_OR_RETURN(p->acc, Tensor::Empty(p->master.shape(), DType::kF32, d));
    if (p->grad_out.dtype() != DType::kF32) {
      SG_ASSIGN_OR_RETURN(p->scratch, Tensor::Empty(p->master.shape(), DType::kF32, d));
    }
    param_index_[name] = int(params_.size());
    parameter_names_.push_back(name);
    params_.push_back(std::move(p));
  }
  if (params_.empty()) return absl::UnimplementedError(absl::StrCat("pipeline: stage ", spec_.stage, " holds no parameters"));
  if (o.pipeline_fsdp) {
    std::vector<Shape> shapes;
    for (const auto& p : params_) shapes.push_back(p->master.shape());
    SG_ASSIGN_OR_RETURN(ShardBucket b, ShardBucket::Create(shapes, dp_, d));
    bucket_ = std::make_unique<ShardBucket>(std::move(b));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    const bool sharded = bucket_ != nullptr;
    const Shape state_shape = sharded ? Shape{bucket_->shard_numel(int(i))} : p.master.shape();
    std::vector<Tensor*> state = {&p.m, &p.v};
    if (sharded) state.insert(state.end(), {&p.shard, &p.grad_shard});
    for (Tensor* t : state) {
      SG_ASSIGN_OR_RETURN(*t, Tensor::Empty(state_shape, DType::kF32, d));
      if (t->numel() > 0) SG_RETURN_IF_ERROR(ZeroTensor(t->view(), st));
    }
    if (NumElements(state_shape) == 0) continue;  // no rows of it on this rank
    kernels::AdamWParam a;
    a.param = sharded ? p.shard.view() : p.master;
    a.grad = sharded ? p.grad_shard.view() : p.acc.view();
    a.m = p.m.view();
    a.v = p.v.view();
    a.weight_decay = p.weight_decay;
    list.push_back(a);
  }
  if (list.empty()) {
    return absl::UnimplementedError(absl::StrCat("pipeline: rank ", context_->rank(), " holds no rows of stage ",
                                                 spec_.stage, "'s parameters (too few for ", bucket_->size(), " shards)"));
  }
  SG_ASSIGN_OR_RETURN(kernels::AdamWTensorList l, kernels::AdamWTensorList::Create(list));
  list_ = std::make_shared<kernels::AdamWTensorList>(std::move(l));
  SG_ASSIGN_OR_RETURN(scalars_, DeviceMemory::Allocate(d, 5 * 64));
  lr_ = TensorView(scalars_.data(), DType::kF32, {1}, d);
  counter_ = TensorView(scalars_.data() + 64, DType::kI64, {}, d);
  norm_ = TensorView(scalars_.data() + 128, DType::kF32, {1}, d);
  clip_ = TensorView(scalars_.data() + 192, DType::kF32, {1}, d);
  loss_sum_ = TensorView(scalars_.data() + 256, DType::kF32, {}, d);
  SG_RETURN_IF_ERROR(ZeroTensor(TensorView(scalars_.data(), DType::kF32, {80}, d), st));
  return absl::OkStatus();
}

absl::Status PipelineStep::StartLink(const CompileOptions& o) {
  const Device d = o.device;
  const Stream& st = executor_->compute_stream();
  StageLink::Options lo;
  lo.tag_base = kTagBase;
  lo.timeout = timeout_;
  // Known bug: with one micro-batch the device path's NCCL pairing goes wrong on the H200
  // (pp_benchmark, 2026-11-30: "message truncated" at BM_PipelineStep/1, while 2-16 micro-batches
  // run and match); one micro-batch has nothing to overlap, so it takes the host path.
  lo.device_transfers = micro_ > 1;
  SG_ASSIGN_OR_RETURN(link_, StageLink::Create(pp_, spec_, micro_, act_shape_, act_dtype_, st, lo));
  if (d.is_cuda()) {
    for (size_t k = 0; k < size_t(1 + 4 * micro_); ++k) {
      SG_ASSIGN_OR_RETURN(Event e, Event::Create(d, /*timing=*/true));
      timing_.push_back(std::move(e));
    }
  }
  if (program_->state.bytes() > 0) {
    SG_RETURN_IF_ERROR(ZeroTensor(TensorView(program_->state.data(), DType::kF32, {program_->state.bytes() / 4}, d), st));
  }
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  explanation_ = absl::StrCat("strategy pp: stage ", spec_.stage, " of ", spec_.num_stages, " (layers [",
                              spec_.first_layer, ", ", spec_.end_layer, "), ", params_.size(), " parameters), 1F1B over ",
                              micro_, " micro-batches of ", micro_batch_, ", bubble (p-1)/(m+p-1) = ",
                              OneFOneBBubbleTheory(spec_.num_stages, micro_));
  if (dp_ != nullptr) {
    absl::StrAppend(&explanation_, "; ", dp_->size(), " data-parallel replicas",
                    bucket_ != nullptr ? " sharding each stage (FSDP: parameters gathered per step, gradients "
                                         "reduce-scattered)"
                                       : " (gradients all-reduced per stage)");
  }
  absl::StrAppend(&explanation_, "; transfers ", link_->device_path() ? "device to device (NCCL)" : "through host memory");
  if (context_->rank() == 0) std::cerr << "[sg::compiler] " << explanation_ << "\n";
  return absl::OkStatus();
}

absl::Status PipelineStep::RunSteps(bool forward_only) {
  const Stream& s = executor_->compute_stream();
  for (const Step& st : program_->schedule.steps) {
    if (forward_only && st.phase != Phase::kForward) continue;
    absl::Status r = st.launch(s);
    if (!r.ok()) return absl::Status(r.code(), absl::StrCat("pipeline stage ", spec_.stage, " step '", st.name, "': ", r.message()));
  }
  return absl::OkStatus();
}

absl::Status PipelineStep::Feed(const std::string& name, const TensorView& src) {
  auto it = program_->sources.find(name);
  if (it == program_->sources.end()) return absl::OkStatus();  // this stage does not read it
  const TensorView& dst = it->second;
  if (src.dtype() != dst.dtype() || src.numel() != dst.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stage ", spec_.stage, ": input '", name, "': expected ",
                                                   DTypeName(dst.dtype()), ShapeToString(dst.shape()), ", found ",
                                                   src.ToString()));
  }
  SG_ASSIGN_OR_RETURN(TensorView s, src.Reshape(dst.shape()));
  return CopyTensor(s, dst, executor_->compute_stream());
}

absl::Status PipelineStep::Accumulate(float weight) {
  const Stream& s = executor_->compute_stream();
  for (auto& p : params_) {
    TensorView g = p->grad_out;
    if (g.dtype() != DType::kF32) {
      SG_RETURN_IF_ERROR(kernels::Cast(g, p->scratch.view(), s));
      g = p->scratch.view();
    }
    SG_ASSIGN_OR_RETURN(TensorView gv, g.Reshape(p->acc.shape()));
    SG_RETURN_IF_ERROR(kernels::AddScaled(gv, weight, p->acc.view(), p->acc.view(), s));
  }
  return absl::OkStatus();
}

absl::Status PipelineStep::RefreshWeightCopies() {
  for (const auto& [master, copy] : program_->weight_copies) {
    SG_RETURN_IF_ERROR(kernels::Cast(master, copy, executor_->compute_stream()));
  }
  return executor_->Synchronize();
}

// One Run's 1F1B schedule on this stage: its actions, its micro-batches' inputs and the received
// activations in flight.
struct PipelineStep::RunState {
  std::vector<PipelineAction> order;
  const MicroBatches& micro;
  std::map<int, TensorView> stash;  // micro-batch -> its received h_in (a link buffer)
  bool events = false;              // busy times from the CUDA timing events (else host clocks)
  absl::Time t0;
};

absl::Status PipelineStep::Run(const std::map<std::string, TensorView>& batch) {
  const Stream& st = executor_->compute_stream();
  // Micro-batch inputs this stage reads (host batches staged onto the device once, so the schedule
  // below only copies device to device).
  std::vector<Tensor> staged;
  SG_ASSIGN_OR_RETURN(const MicroBatches micro, SplitMicroBatches(batch, &staged));
  SG_ASSIGN_OR_RETURN(std::vector<float> weight, MicroBatchWeights(batch));
  for (auto& p : params_) SG_RETURN_IF_ERROR(ZeroTensor(p->acc.view(), st));
  SG_RETURN_IF_ERROR(ZeroTensor(loss_sum_, st));
  if (bucket_ != nullptr) {  // the stage's full weights for this step's passes
    std::vector<TensorView> full;
    for (const auto& p : params_) full.push_back(p->master);
    SG_RETURN_IF_ERROR(bucket_->Gather(Shards(&Param::shard), full, st));
    SG_RETURN_IF_ERROR(RefreshWeightCopies());
  }
  SG_RETURN_IF_ERROR(RunSchedule(micro, weight));
  if (bucket_ != nullptr) {
    std::vector<TensorView> full;
    for (const auto& p : params_) full.push_back(p->acc.view());
    SG_RETURN_IF_ERROR(bucket_->ReduceScatter(full, Shards(&Param::grad_shard), st));
  }
  SG_RETURN_IF_ERROR(Optimize());
  return !timing_.empty() ? ReadEventTimes() : absl::OkStatus();
}

absl::StatusOr<PipelineStep::MicroBatches> PipelineStep::SplitMicroBatches(
    const std::map<std::string, TensorView>& batch, std::vector<Tensor>* staged) {
  const int m = micro_;
  const Stream& st = executor_->compute_stream();
  MicroBatches micro(static_cast<size_t>(m));
  for (const std::string& name : program_->input_names) {
    if (name == kStageInput || name == "cotangent") continue;
    auto it = batch.find(name);
    if (it == batch.end()) return absl::InvalidArgumentError(absl::StrCat("pipeline Run: missing input '", name, "'"));
    if (it->second.rank() < 1 || it->second.shape()[0] != micro_batch_ * m) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline Run: input '", name, "' must have ", micro_batch_ * m,
                                                     " rows (", m, " micro-batches of ", micro_batch_, "), found ",
                                                     it->second.ToString()));
    }
    TensorView whole = it->second;
    if (whole.device() != program_->device) {
      SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(whole.shape(), whole.dtype(), program_->device));
      SG_RETURN_IF_ERROR(CopyTensor(whole, t.view(), st));
      whole = t.view();
      staged->push_back(std::move(t));
    }
    for (int i = 0; i < m; ++i) micro[size_t(i)][name] = Rows(whole, i, micro_batch_);
  }
  return micro;
}

absl::Status PipelineStep::RunSchedule(const MicroBatches& micro, const std::vector<float>& weight) {
  using K = PipelineAction::Kind;
  const Stream& st = executor_->compute_stream();
  RunState r{OneFOneBSchedule(spec_.num_stages, spec_.stage, micro_), micro, /*stash=*/{}, /*events=*/!timing_.empty(),
             /*t0=*/absl::Time()};
  actions_ = r.order;
  times_.assign(r.order.size(), Interval{});
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  SG_RETURN_IF_ERROR(pp_->Barrier());
  r.t0 = absl::Now();
  if (r.events) SG_RETURN_IF_ERROR(timing_[0].Record(st));
  SG_RETURN_IF_ERROR(PostNeeded(r, 0));
  for (size_t k = 0; k < r.order.size(); ++k) {
    const PipelineAction& a = r.order[k];
    const int i = a.micro;
    StageLink::Kind kind;
    TensorView received;
    if (Needs(r, k, &kind)) {
      SG_ASSIGN_OR_RETURN(received, link_->Received(kind, i));
    }
    if (a.kind == K::kForward && !spec_.first()) r.stash[i] = received;
    SG_RETURN_IF_ERROR(Mark(r, k, false));
    SG_RETURN_IF_ERROR(RunAction(r, k, received, weight[size_t(i)]));
    // Posted after this action's send: the two start together (stage_link.h).
    SG_RETURN_IF_ERROR(PostNeeded(r, k + 1));
  }
  return link_->Finish();
}

absl::Status PipelineStep::RunAction(RunState& r, size_t k, const TensorView& received, float w) {
  using K = PipelineAction::Kind;
  const Stream& st = executor_->compute_stream();
  const PipelineAction& a = r.order[k];
  const int i = a.micro;
  if (a.kind == K::kForward && spec_.last()) {
    // Forward and backward at once: B(i) follows F(i) directly on the last stage, which sends
    // grad h_in (scaled by the micro-batch's weight, in place) at B(i).
    SG_RETURN_IF_ERROR(FeedMicro(r, i));
    SG_RETURN_IF_ERROR(RunSteps(false));
    SG_RETURN_IF_ERROR(kernels::AddScaled(program_->outputs.at(loss_name_), w, loss_sum_, loss_sum_, st));
    SG_RETURN_IF_ERROR(Accumulate(w));
    if (!spec_.first()) {
      const TensorView g = program_->outputs.at("grad:" + std::string(kStageInput));
      SG_RETURN_IF_ERROR(kernels::Scale(g, w, g, st));
    }
    SG_RETURN_IF_ERROR(Mark(r, k, true));
  } else if (a.kind == K::kForward) {
    SG_RETURN_IF_ERROR(FeedMicro(r, i));
    SG_RETURN_IF_ERROR(RunSteps(true));
    SG_RETURN_IF_ERROR(Mark(r, k, true));
    SG_RETURN_IF_ERROR(link_->PostSend(StageLink::kActivation, i, program_->outputs.at(kStageOutput)));
  } else {
    if (!spec_.last()) {
      SG_RETURN_IF_ERROR(FeedMicro(r, i));
      SG_RETURN_IF_ERROR(Feed("cotangent", received));
      SG_RETURN_IF_ERROR(RunSteps(false));
      SG_RETURN_IF_ERROR(Accumulate(1.f));
    }
    SG_RETURN_IF_ERROR(Mark(r, k, true));
    if (!spec_.first()) {
      SG_RETURN_IF_ERROR(link_->PostSend(StageLink::kGradient, i,
                                         program_->outputs.at("grad:" + std::string(kStageInput))));
    }
    r.stash.erase(i);
  }
  return absl::OkStatus();
}

// The message an action needs before it runs: F(i)'s activation (not on stage 0), B(i)'s
// gradient (not on the last stage, whose B(i) only sends).
bool PipelineStep::Needs(const RunState& r, size_t k, StageLink::Kind* kind) const {
  using K = PipelineAction::Kind;
  if (k >= r.order.size()) return false;
  *kind = r.order[k].kind == K::kForward ? StageLink::kActivation : StageLink::kGradient;
  return r.order[k].kind == K::kForward ? !spec_.first() : !spec_.last();
}

absl::Status PipelineStep::PostNeeded(const RunState& r, size_t k) {
  StageLink::Kind kind;
  return Needs(r, k, &kind) ? link_->PostRecv(kind, r.order[k].micro) : absl::OkStatus();
}

absl::Status PipelineStep::FeedMicro(const RunState& r, int i) {
  for (const auto& [name, v] : r.micro[size_t(i)]) SG_RETURN_IF_ERROR(Feed(name, v));
  if (!spec_.first()) SG_RETURN_IF_ERROR(Feed(kStageInput, r.stash.at(i)));
  return absl::OkStatus();
}

absl::Status PipelineStep::Mark(const RunState& r, size_t k, bool end) {
  if (r.events) return timing_[1 + 2 * k + (end ? 1 : 0)].Record(executor_->compute_stream());
  (end ? times_[k].end : times_[k].start) = absl::ToDoubleSeconds(absl::Now() - r.t0);
  return absl::OkStatus();
}

// Micro-batch i's share of the non-ignored targets over every replica (1/m each off the last stage,
// which alone reads the targets).
absl::StatusOr<std::vector<float>> PipelineStep::MicroBatchWeights(const std::map<std::string, TensorView>& batch) {
  const int m = micro_;
  std::vector<float> weight(size_t(m), 1.f / float(m));
  if (!spec_.last()) return weight;
  TensorView t = batch.at(targets_name_);
  Tensor host;
  if (!t.device().is_cpu()) {
    SG_ASSIGN_OR_RETURN(host, Tensor::Empty(t.shape(), t.dtype(), Device::Cpu()));
    SG_RETURN_IF_ERROR(CopyTensor(t, host.view(), executor_->compute_stream()));
    SG_RETURN_IF_ERROR(executor_->Synchronize());
    t = host.view();
  }
  std::vector<int64_t> count(size_t(m), 0);
  int64_t total = 0;
  const int64_t per = t.numel() / m;
  for (int64_t k = 0; k < t.numel(); ++k) {
    const int64_t id = t.dtype() == DType::kI64 ? t.data<int64_t>()[k] : t.data<int32_t>()[k];
    if (id != ignore_index_) {
      ++count[size_t(k / per)];
      ++total;
    }
  }
  if (dp_ != nullptr) {  // the loss is the mean over every replica's tokens
    float t32 = float(total);
    SG_RETURN_IF_ERROR(dp_->AllReduce(TensorView(&t32, DType::kF32, {1}, Device::Cpu()), comm::ReduceOp::kSum));
    total = int64_t(t32);
  }
  for (int i = 0; i < m; ++i) weight[size_t(i)] = total > 0 ? float(double(count[size_t(i)]) / double(total)) : 0.f;
  return weight;
}

int64_t PipelineStep::optimizer_state_elements() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p->m.numel() + p->v.numel();
  return n;
}

std::vector<TensorView> PipelineStep::Shards(Tensor Param::*which) const {
  std::vector<TensorView> v;
  for (const auto& p : params_) v.push_back(((*p).*which).view());
  return v;
}

absl::Status PipelineStep::ReadEventTimes() {
  for (size_t k = 0; k < times_.size(); ++k) {
    SG_ASSIGN_OR_RETURN(float start, timing_[1 + 2 * k].ElapsedMsSince(timing_[0]));
    SG_ASSIGN_OR_RETURN(float end, timing_[2 + 2 * k].ElapsedMsSince(timing_[0]));
    times_[k] = Interval{start * 1e-3, end * 1e-3};
  }
  return absl::OkStatus();
}

// Global norm over every stage's accumulated gradients, then AdamW on this stage's (or, sharded,
// on this rank's rows of them).
absl::Status PipelineStep::Optimize() {
  const Stream& st = executor_->compute_stream();
  auto list = std::static_pointer_cast<kernels::AdamWTensorList>(list_);
  float sums[2] = {0, 0};  // squared norm, loss
  SG_RETURN_IF_ERROR(CopyTensor(loss_sum_, TensorView(&sums[1], DType::kF32, {}, Device::Cpu()), st));
  if (dp_ != nullptr && bucket_ == nullptr) {
    for (auto& p : params_) SG_RETURN_IF_ERROR(dp_->AllReduce(p->acc.view(), comm::ReduceOp::kSum, st));
  }
  SG_RETURN_IF_ERROR(kernels::GradNorm(*list, 0.f, norm_, TensorView(), st));
  float local = 0;
  SG_RETURN_IF_ERROR(CopyTensor(norm_, TensorView(&local, DType::kF32, {1}, Device::Cpu()), st));
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  sums[0] = local * local;
  if (bucket_ != nullptr) {
    // Every rank holds distinct rows and its replica's loss share: one sum over the job.
    SG_RETURN_IF_ERROR(context_->world().AllReduce(TensorView(sums, DType::kF32, {2}, Device::Cpu()), comm::ReduceOp::kSum));
  } else {
    if (dp_ != nullptr) {
      SG_RETURN_IF_ERROR(dp_->AllReduce(TensorView(&sums[1], DType::kF32, {1}, Device::Cpu()), comm::ReduceOp::kSum));
    }
    SG_RETURN_IF_ERROR(pp_->AllReduce(TensorView(sums, DType::kF32, {2}, Device::Cpu()), comm::ReduceOp::kSum));
  }
  grad_norm_ = std::sqrt(sums[0]);
  loss_ = sums[1];
  const float max_norm = float(adamw_.max_grad_norm);
  float clip = max_norm > 0 ? std::min(1.f, max_norm / (grad_norm_ + 1e-6f)) : 1.f;
  SG_RETURN_IF_ERROR(CopyTensor(TensorView(&clip, DType::kF32, {1}, Device::Cpu()), clip_, st));
  const kernels::AdamWConfig c{float(adamw_.beta1), float(adamw_.beta2), float(adamw_.eps)};
  SG_RETURN_IF_ERROR(kernels::AdamWStep(*list, c, lr_, counter_, clip_, st));
  return RefreshWeightCopies();
}

absl::StatusOr<StepMetrics> PipelineStep::ReadMetrics() const {
  StepMetrics m;
  m.loss = loss_;
  m.grad_norm = grad_norm_;
  SG_RETURN_IF_ERROR(CopyTensor(counter_, TensorView(&m.step, DType::kI64, {}, Device::Cpu()), executor_->compute_stream()));
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  return m;
}

absl::Status PipelineStep::SetLearningRate(float lr) {
  SG_RETURN_IF_ERROR(CopyTensor(TensorView(&lr, DType::kF32, {1}, Device::Cpu()), lr_, executor_->compute_stream()));
  return executor_->Synchronize();
}

absl::StatusOr<StepTrace> PipelineStep::TraceStep(const std::map<std::string, TensorView>&) {
  return absl::UnimplementedError("pipeline: TraceStep is not supported; read last_actions()/last_times() after Run");
}

namespace {
absl::Status CheckF32(const std::string& name, int64_t numel, const TensorView& host) {
  if (host.dtype() != DType::kF32 || host.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "': expected f32 with ", numel, " elements, found ",
                                                   host.ToString()));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status PipelineStep::Write(const std::string& name, const TensorView& host) {
  const Stream& st = executor_->compute_stream();
  if (name == kLrName) return SetLearningRate(*static_cast<const float*>(host.raw()));
  if (name == kStepName) {
    SG_RETURN_IF_ERROR(CheckF32(name, 1, host));
    int64_t n = int64_t(*static_cast<const float*>(host.raw()));
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(&n, DType::kI64, {}, Device::Cpu()), counter_, st));
    return executor_->Synchronize();
  }
  for (const char* prefix : {"", "opt.m.", "opt.v."}) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::string param = name.substr(std::string(prefix).size());
    auto own = owner_.find(param);
    if (own == owner_.end()) continue;
    SG_RETURN_IF_ERROR(CheckF32(name, own->second.second, host));
    if (own->second.first != spec_.stage) return absl::OkStatus();  // another stage's
    const int index = param_index_.at(param);
    const Param& p = *params_[size_t(index)];
    if (bucket_ != nullptr) {  // this rank's rows; Run gathers the full weights
      const TensorView dst = prefix[0] == '\0' ? p.shard.view() : (prefix[4] == 'm' ? p.m.view() : p.v.view());
      if (dst.numel() > 0) SG_RETURN_IF_ERROR(CopyTensor(bucket_->MineOf(index, host), dst, st));
      return executor_->Synchronize();
    }
    const TensorView dst = prefix[0] == '\0' ? p.master : (prefix[4] == 'm' ? p.m.view() : p.v.view());
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(host.raw(), DType::kF32, dst.shape(), host.device()), dst, st));
    return RefreshWeightCopies();
  }
  return absl::NotFoundError(absl::StrCat("pipeline step has no source named '", name, "'"));
}

absl::Status PipelineStep::Read(const std::string& name, const TensorView& host) const {
  const Stream& st = executor_->compute_stream();
  if (name == "loss" || name == "grad_norm" || name == kStepName) {
    SG_RETURN_IF_ERROR(CheckF32(name, 1, host));
    SG_ASSIGN_OR_RETURN(StepMetrics m, ReadMetrics());
    *static_cast<float*>(host.raw()) = name == "loss" ? m.loss : name == "grad_norm" ? m.grad_norm : float(m.step);
    return absl::OkStatus();
  }
  if (name == kLrName) {
    SG_RETURN_IF_ERROR(CopyTensor(lr_, host, st));
    return executor_->Synchronize();
  }
  for (const char* prefix : {"", "opt.m.", "opt.v.", "grad:"}) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::string param = name.substr(std::string(prefix).size());
    auto own = owner_.find(param);
    if (own == owner_.end()) continue;
    SG_RETURN_IF_ERROR(CheckF32(name, own->second.second, host));
    if (own->second.first == spec_.stage && bucket_ != nullptr) {  // the rows over the dp group
      const int index = param_index_.at(param);
      const std::string pre = prefix;
      Tensor Param::*which = pre.empty() ? &Param::shard : pre == "grad:" ? &Param::grad_shard : pre == "opt.m." ? &Param::m : &Param::v;
      SG_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty({own->second.second}, DType::kF32, program_->device));
      std::vector<TensorView> fulls(params_.size());
      fulls[size_t(index)] = full.view();
      SG_RETURN_IF_ERROR(bucket_->Gather(Shards(which), fulls, st, {index}));
      SG_RETURN_IF_ERROR(CopyTensor(full.view(), TensorView(host.raw(), DType::kF32, {full.numel()}, host.device()), st));
      SG_RETURN_IF_ERROR(executor_->Synchronize());
    } else if (own->second.first == spec_.stage) {
      const Param& p = *params_[size_t(param_index_.at(param))];
      const std::string pre = prefix;
      const TensorView src = pre.empty() ? p.master : pre == "grad:" ? p.acc.view() : pre == "opt.m." ? p.m.view() : p.v.view();
      SG_RETURN_IF_ERROR(CopyTensor(src, TensorView(host.raw(), DType::kF32, src.shape(), host.device()), st));
      SG_RETURN_IF_ERROR(executor_->Synchronize());
    }
    return pp_->Broadcast(host, own->second.first);
  }
  return absl::NotFoundError(absl::StrCat("pipeline step has no source or output named '", name, "'"));
}

absl::StatusOr<std::unique_ptr<CompiledStep>> CompilePipeline(const graph::Graph& forward, const CompileOptions& o) {
  SG_ASSIGN_OR_RETURN(std::unique_ptr<PipelineStep> s, PipelineStep::Create(forward, o));
  return std::unique_ptr<CompiledStep>(std::move(s));
}

namespace {
const bool kRegistered = RegisterStrategyCompiler(Strategy::kPipeline, CompilePipeline);
}  // namespace

}  // namespace sg::compiler
