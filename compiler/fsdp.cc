#include "compiler/fsdp.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/autotune.h"
#include "compiler/dist_cuda_graph.h"
#include "compiler/fsdp_internal.h"
#include "compiler/host_tensor_check.h"
#include "compiler/offload.h"
#include "graph/ops.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"
#include "sharding/placement.h"

namespace sg::compiler {

using graph::Phase;

namespace {

// The staging slot of the loss seeds (not a graph input: InputStaging keys its buffers by name).
constexpr char kSeedsInput[] = "<loss seeds>";

}  // namespace

ShardedDataParallelStep::~ShardedDataParallelStep() {
  // The executor's steps point into this object's buffers: stop it first (with the deadline: a
  // step stuck on a dead peer is aborted rather than waited for forever).
  if (executor_ != nullptr) (void)Wait();
  executor_.reset();
}

absl::Status ShardedDataParallelStep::Wait() const { return WaitForStep(*executor_, layout_.world, comm_timeout_); }

absl::StatusOr<std::unique_ptr<ShardedDataParallelStep>> ShardedDataParallelStep::Create(
    const graph::Graph& train, const CompileOptions& options, DataParallelLayout layout,
    std::shared_ptr<DistContext> context, std::string explanation) {
  std::unique_ptr<ShardedDataParallelStep> s(new ShardedDataParallelStep());
  SG_RETURN_IF_ERROR(s->Init(train, options, std::move(layout), std::move(context), std::move(explanation)));
  return s;
}

absl::Status ShardedDataParallelStep::Init(const graph::Graph& train, const CompileOptions& options,
                                           DataParallelLayout layout, std::shared_ptr<DistContext> context,
                                           std::string explanation) {
  layout_ = std::move(layout);
  context_ = std::move(context);
  explanation_ = std::move(explanation);
  shard_size_ = layout_.shard ? layout_.shard->size() : 1;
  shard_rank_ = layout_.shard ? layout_.shard->rank() : 0;
  world_size_ = layout_.world ? layout_.world->size() : 1;
  data_rank_ = layout_.world ? layout_.world->rank() : 0;
  data_ranks_ = world_size_;
  return Build(train, options);
}

int ShardedDataParallelStep::NormRanks() const {
  return layout_.norm_group != nullptr ? layout_.norm_group->size() : shard_size_;
}

void ShardedDataParallelStep::ExplainPlan() {
  for (const auto& u : units_) {
    if (u->params.size() < 2 || !PerParameter(*u)) continue;
    absl::StrAppend(&explanation_, "; each parameter gathered and reduce-scattered on its own (no unit bucket)");
    break;
  }
  for (const auto& u : units_) {
    if (u->fwd_dtype == DType::kF32) continue;
    absl::StrAppend(&explanation_, "; parameters all-gathered in ", DTypeName(u->fwd_dtype), " (f32 master shards)");
    break;
  }
  if (memory_.host_gradient_bytes > 0) {
    int host = 0;
    for (const auto& u : units_) host += u->host;
    absl::StrAppend(&explanation_, "; AdamW deferred into the next forward, the gradient shards of ", host,
                    " units in host memory (", memory_.host_gradient_bytes, " bytes)");
  } else if (Deferred()) {
    absl::StrAppend(&explanation_, "; AdamW deferred into the next forward");
  }
}

absl::Status ShardedDataParallelStep::StartExecutor(const CompileOptions& o) {
  // Captured after the warm-up like the single-device step (compiler/dist_cuda_graph.h).
  comm_timeout_ = absl::Seconds(o.comm_timeout_s);
  // Context parallelism's ring attention (rewrite_program) exchanges blocks point to point inside
  // the step; that path is not verified under capture yet, so those steps stay eager.
  // Host units copied back (more than the resident ones) stay eager too: replayed as a graph,
  // their copies back ran behind the forward instead of beside it (the 7b over a group of one, 16
  // host units, one H200, 2026-12-01 05:11-05:14: 907 ms a step replayed, 845 eager, 840 eager
  // without host units), so the graph's ~1.6% is worth less than the copies' overlap. A probe of
  // that shape (benchmarks/graph_overlap) showed it is the kernels in the copy chain: a replayed
  // graph delays such a chain whatever its stream, priority or slots; a chain of copies alone
  // overlaps as in eager steps. Running the copies back and their updates eagerly before each
  // replay of a graph of the rest (external event-wait nodes in the graph) overlapped in the probe
  // (20.38 ms against 20.40 eager) but not in the step: the same 7b 872 ms a step against 848
  // eager (2026-12-01 10:17, `gpu_call56.sh`; not profiled), so that form was removed.
  bool copies_back = false;
  for (const Unit* u : host_order_) copies_back = copies_back || !u->resident;
  const char* not_captured =
      layout_.rewrite_program ? "context parallelism: ring attention is not verified under capture"
      : copies_back ? "the host units' copies back overlap the forward only in eager steps"
                    : "";
  ExecutorOptions eo;
  eo.cuda_graph = o.cuda_graph && !layout_.rewrite_program && !copies_back;
  eo.warmup_steps = std::max(o.warmup_steps, kMinDistributedWarmup);
  eo.before_capture = [this] { return Wait(); };
  SG_ASSIGN_OR_RETURN(eo.after_warmup, StartAutotune(o));
  SG_ASSIGN_OR_RETURN(executor_, Executor::Create(program_.get(), eo));
  absl::StrAppend(&explanation_, "; ", GraphModeExplanation(o, *executor_, not_captured));
  std::map<std::string, TensorView> inputs;
  for (const std::string& name : program_->input_names) {
    if (name != kLossScaleName) inputs[name] = program_->sources.at(name);
  }
  if (micro_batches_ > 1) {
    SG_RETURN_IF_ERROR(AllocateFullInputs());
    inputs = full_input_views_;
  }
  inputs[kSeedsInput] = seeds_;
  SG_ASSIGN_OR_RETURN(CompiledStep::staging_, InputStaging::Create(o.device, inputs));
  const Stream& s = executor_->compute_stream();
  SG_RETURN_IF_ERROR(ZeroTensor(TensorView(shards_.data(), DType::kF32, {shards_.bytes() / 4}, o.device), s));
  SG_RETURN_IF_ERROR(ZeroTensor(TensorView(scalars_.data(), DType::kF32, {scalars_.bytes() / 4}, o.device), s));
  // Nothing pending before the first step: its deferred updates are skipped.
  if (Deferred()) SG_RETURN_IF_ERROR(kernels::Fill(clip_, std::nanf(""), s));
  SG_RETURN_IF_ERROR(executor_->Synchronize());
  return absl::OkStatus();
}

TensorView ShardedDataParallelStep::SlotView(int slot, int64_t elements) const {
  return TensorView(shards_.data() + slots_offset_ + slot * slot_bytes_, DType::kF32, {elements}, program_->device);
}

TensorView ShardedDataParallelStep::HostGradients(const Unit& u) const {
  return TensorView(static_cast<char*>(host_grads_.get()) + u.host_offset, DType::kF32, {u.block}, Device::Cpu());
}

TensorView ShardedDataParallelStep::UnitStep(const Unit& u) const {
  return TensorView(static_cast<char*>(unit_steps_.raw()) + 8 * u.index, DType::kI64, {}, program_->device);
}

absl::Status ShardedDataParallelStep::UpdateUnit(const Unit& u, const Stream& s) const {
  if (u.update_list == nullptr) return absl::OkStatus();
  const kernels::AdamWConfig c{float(dp_.beta1), float(dp_.beta2), float(dp_.eps)};
  const auto& list = *std::static_pointer_cast<kernels::AdamWTensorList>(u.update_list);
  return kernels::AdamWStep(list, c, lr_pending_, UnitStep(u), clip_, s);
}

namespace {

// A list whose one "gradient" is `norms`, for GradNorm's sqrt of their sum of squares: the norm of
// several norms (AdamW's other tensors are unused dummies of the same size).
absl::StatusOr<std::shared_ptr<void>> NormOfNorms(const TensorView& norms, const TensorView (&dummies)[3]) {
  kernels::AdamWParam n;
  n.param = dummies[0];
  n.grad = norms;
  n.m = dummies[1];
  n.v = dummies[2];
  SG_ASSIGN_OR_RETURN(kernels::AdamWTensorList list, kernels::AdamWTensorList::Create({n}));
  return std::make_shared<kernels::AdamWTensorList>(std::move(list));
}

}  // namespace

absl::Status ShardedDataParallelStep::Allocate() {
  const Device d = program_->device;
  SG_RETURN_IF_ERROR(SizeBuffers());
  SG_ASSIGN_OR_RETURN(shards_, DeviceMemory::Allocate(d, memory_.shard_bytes));
  SG_ASSIGN_OR_RETURN(buckets_, DeviceMemory::Allocate(d, memory_.bucket_bytes));
  const int64_t packed = packed_.numel(), block = block_.numel();
  packed_ = TensorView(buckets_.data(), DType::kF32, {packed}, d);
  block_ = TensorView(buckets_.data() + AlignUp(std::max<int64_t>(packed, 1) * 4), DType::kF32, {block}, d);
  if (memory_.host_gradient_bytes > 0) {
    SG_ASSIGN_OR_RETURN(host_grads_, AllocateOffloadHost(d, memory_.host_gradient_bytes));
  }
  ViewShards();
  SG_ASSIGN_OR_RETURN(scalars_, DeviceMemory::Allocate(d, ScalarBytes()));
  CarveScalars();
  SG_RETURN_IF_ERROR(CreateOptimizerLists());
  return CreateEvents();
}

void ShardedDataParallelStep::ViewShards() {
  const Device d = program_->device;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    const Unit& u = *units_[size_t(p.unit)];
    const int64_t n = p.mine.length * p.row;
    char* base = shards_.data() + shard_offsets_[i];
    const int64_t region = u.block * 4;  // SizeBuffers: the unit's 4 regions (3 on the host)
    p.shard = TensorView(base, DType::kF32, {n}, d);
    if (u.host) {
      p.m = TensorView(base + region, DType::kF32, {n}, d);
      p.v = TensorView(base + 2 * region, DType::kF32, {n}, d);
      p.grad = Flat(SlotView(u.bwd_slot, u.block), p.pack_offset, n);
      p.update_grad = Flat(SlotView(u.fwd_slot, u.block), p.pack_offset, n);
      p.host_grad = Flat(HostGradients(u), p.pack_offset, n);
    } else {
      p.grad = p.update_grad = TensorView(base + region, DType::kF32, {n}, d);
      p.m = TensorView(base + 2 * region, DType::kF32, {n}, d);
      p.v = TensorView(base + 3 * region, DType::kF32, {n}, d);
    }
  }
}

void ShardedDataParallelStep::CarveScalars() {
  const Device d = program_->device;
  const int64_t W = world_size_, K = micro_batches_;
  char* at = scalars_.data();
  auto take = [&](int64_t n, DType t = DType::kF32) {
    TensorView v(at, t, {n}, d);
    at += AlignUp(n * 4);
    return v;
  };
  lr_ = take(1);
  counter_ = TensorView(at, DType::kI64, {}, d);
  at += AlignUp(8);
  norm_local_ = take(1);
  norms_ = take(NormRanks());
  norm_ = take(1);
  clip_ = take(1);
  losses_ = take(W * K);
  for (TensorView& x : dummy_) x = take(NormRanks());
  local_losses_ = take(K);
  seeds_ = take(K);
  if (Deferred()) {
    const int64_t U = int64_t(units_.size());
    lr_pending_ = take(1);
    unit_norms_ = take(U);
    for (TensorView& x : unit_dummy_) x = take(U);
    unit_steps_ = TensorView(at, DType::kI64, {U}, d);
    at += AlignUp(2 * U * 4);
    norm_scratch_view_ = take(std::max<int64_t>(norm_scratch_, 1));
  }
}

// AdamW's view of parameter p's shard, reading its gradient from `grad`.
kernels::AdamWParam ShardedDataParallelStep::Adam(const Param& p, const TensorView& grad) {
  kernels::AdamWParam a;
  a.param = p.shard;
  a.grad = grad;
  a.m = p.m;
  a.v = p.v;
  a.weight_decay = float(p.weight_decay);
  return a;
}

absl::Status ShardedDataParallelStep::CreateOptimizerLists() {
  const int P = shard_size_;
  std::vector<kernels::AdamWParam> local;
  for (const auto& p : params_) {
    if (p->mine.length == 0) continue;
    local.push_back(Adam(*p, p->grad));
  }
  if (local.empty()) {
    return absl::UnimplementedError(absl::StrCat("sharded data parallel: rank ", shard_rank_,
                                                 " of the shard group holds no parameter rows (model too small for ",
                                                 P, " shards)"));
  }
  SG_ASSIGN_OR_RETURN(kernels::AdamWTensorList list, kernels::AdamWTensorList::Create(local));
  local_list_ = std::make_shared<kernels::AdamWTensorList>(std::move(list));
  if (layout_.counts_in_norm) {
    std::vector<kernels::AdamWParam> counted;
    for (size_t i = 0, k = 0; i < params_.size(); ++i) {
      if (params_[i]->mine.length == 0) continue;
      if (layout_.counts_in_norm(params_[i]->name)) counted.push_back(local[k]);
      ++k;
    }
    if (counted.empty()) {  // nothing counted here: the norm of zeros (the scalars start zeroed)
      kernels::AdamWParam zero;
      zero.param = zero.m = zero.v = dummy_[0];
      zero.grad = dummy_[1];
      counted.push_back(zero);
    }
    SG_ASSIGN_OR_RETURN(kernels::AdamWTensorList cl, kernels::AdamWTensorList::Create(counted));
    counted_list_ = std::make_shared<kernels::AdamWTensorList>(std::move(cl));
  }
  if (Deferred()) {
    // Per unit: the deferred AdamW over its shards (reading the forward slot for a host unit), and
    // the norm over its gradient shards where the reduce-scatter leaves them (those counted).
    for (auto& u : units_) {
      std::vector<kernels::AdamWParam> update, norm;
      for (int i : u->params) {
        const Param& p = *params_[size_t(i)];
        if (p.mine.length == 0) continue;
        update.push_back(Adam(p, p.update_grad));
        if (layout_.counts_in_norm && !layout_.counts_in_norm(p.name)) continue;
        norm.push_back(Adam(p, p.grad));
      }
      for (auto [params, list] : {std::pair{&update, &u->update_list}, std::pair{&norm, &u->norm_list}}) {
        if (params->empty()) continue;
        SG_ASSIGN_OR_RETURN(kernels::AdamWTensorList l, kernels::AdamWTensorList::Create(*params));
        *list = std::make_shared<kernels::AdamWTensorList>(std::move(l));
      }
    }
    SG_ASSIGN_OR_RETURN(unit_norm_list_, NormOfNorms(unit_norms_, unit_dummy_));
  }
  SG_ASSIGN_OR_RETURN(norm_list_, NormOfNorms(norms_, dummy_));
  return absl::OkStatus();
}

absl::Status ShardedDataParallelStep::CreateEvents() {
  const Device d = program_->device;
  for (auto& u : units_) {
    for (auto* e : {&u->fwd_done, &u->bwd_done, &u->rs_done, &u->packed, &u->normed, &u->updated, &u->staged,
                    &u->loaded}) {
      SG_ASSIGN_OR_RETURN(Event ev, Event::Create(d));
      *e = std::make_unique<Event>(std::move(ev));
    }
  }
  for (auto& p : params_) {
    SG_ASSIGN_OR_RETURN(Event ev, Event::Create(d));
    p->rs_done = std::make_unique<Event>(std::move(ev));
  }
  for (auto* e : {&ready_, &comm_done_, &norms_done_}) {
    SG_ASSIGN_OR_RETURN(Event ev, Event::Create(d));
    *e = std::make_unique<Event>(std::move(ev));
  }
  if (Deferred()) {
    SG_ASSIGN_OR_RETURN(Stream st, Stream::Create(d));
    update_stream_.emplace(std::move(st));
  }
  return absl::OkStatus();
}

absl::Status ShardedDataParallelStep::AllocateFullInputs() {
  const Device d = program_->device;
  int64_t bytes = 0;
  std::vector<std::pair<std::string, TensorView>> inputs;
  for (const std::string& name : program_->input_names) {
    if (name == kLossScaleName) continue;
    const TensorView& micro = program_->sources.at(name);
    if (micro.rank() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("Compile: micro_batches splits every input along dim 0, but '",
                                                     name, "' is a scalar"));
    }
    inputs.emplace_back(name, micro);
    bytes += AlignUp(micro.numel() * int64_t(SizeOf(micro.dtype())) * micro_batches_);
  }
  SG_ASSIGN_OR_RETURN(full_inputs_, DeviceMemory::Allocate(d, std::max<int64_t>(bytes, 1)));
  char* at = full_inputs_.data();
  for (const auto& [name, micro] : inputs) {
    Shape shape = micro.shape();
    shape[0] *= micro_batches_;
    full_input_views_[name] = TensorView(at, micro.dtype(), shape, d);
    at += AlignUp(micro.numel() * int64_t(SizeOf(micro.dtype())) * micro_batches_);
  }
  return absl::OkStatus();
}

absl::Status ShardedDataParallelStep::StageFullInputs(const std::map<std::string, TensorView>& batch) {
  for (const auto& [name, t] : batch) {
    if (!full_input_views_.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("Run: the graph has no input named '", name, "'"));
    }
  }
  for (const auto& [name, full] : full_input_views_) {
    auto it = batch.find(name);
    const std::string expected = absl::StrCat(DTypeName(full.dtype()), ShapeToString(full.shape()), " (",
                                              micro_batches_, " micro-batches of ",
                                              ShapeToString(program_->sources.at(name).shape()), ")");
    if (it == batch.end()) return absl::InvalidArgumentError(absl::StrCat("Run: missing input '", name, "' (", expected, ")"));
    if (it->second.dtype() != full.dtype() || it->second.shape() != full.shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Run: input '", name, "': expected ", expected, ", found ", it->second.ToString()));
    }
    SG_RETURN_IF_ERROR(staging_.Stage(name, it->second, full, executor_->compute_stream()));
  }
  return absl::OkStatus();
}

// The deferred optimizer's updates. A unit on the device: AdamW on the comm stream just before
// its first gather. The units on the host: from the start of the step, in forward order, each
// copied back into its forward slot on the copy stream once the unit before it in that slot is
// updated, and updated on the update stream once copied; the comm stream waits for a unit's update
// just before its gather. So the copies run back to back over PCIe from the step's start, ahead of
// the forward, which first gathers the units on the device; an update tied to its unit's gather
// would hold each slot until the forward got there, and the copies with it (the 7b on one H200,
// 2026-12-01: each copy of a layer's 0.81 GB waited for the layer two before it, ~9.5 ms of
// every host layer's 14 ms copy exposed).
void ShardedDataParallelStep::AddDeferredUpdates(std::multimap<int, Step>* before) {
  for (size_t j = 0; j < host_order_.size(); ++j) {
    const Unit* u = host_order_[j];
    const bool first = j == 0;
    if (!u->resident) {
      Step load;
      load.kind = Step::Kind::kCopy;
      load.name = absl::StrCat("copy gradients back ", u->name);
      load.phase = Phase::kForward;
      load.stream = 1;  // enqueues on the copy and update streams only
      load.impl = "copy";
      load.launch = [this, u, first](const Stream&) -> absl::Status {
        const Stream& copy = HostCopyStream();
        if (first) SG_RETURN_IF_ERROR(OrderAfterCompute({&copy, &*update_stream_}));
        if (u->fwd_slot_prev != nullptr) SG_RETURN_IF_ERROR(u->fwd_slot_prev->updated->Block(copy));
        SG_RETURN_IF_ERROR(CopyTensorAsync(HostGradients(*u), SlotView(u->fwd_slot, u->block), copy));
        return u->loaded->Record(copy);
      };
      before->emplace(0, std::move(load));
    }
    Step update;
    update.name = absl::StrCat("adamw (deferred, host) ", u->name);
    update.phase = Phase::kForward;
    update.stream = 1;
    update.impl = "kernel";
    update.launch = [this, u, first](const Stream&) -> absl::Status {
      const Stream& up = *update_stream_;
      if (first && u->resident) SG_RETURN_IF_ERROR(OrderAfterCompute({&HostCopyStream(), &up}));
      if (!u->resident) SG_RETURN_IF_ERROR(u->loaded->Block(up));
      SG_RETURN_IF_ERROR(UpdateUnit(*u, up));
      return u->updated->Record(up);
    };
    before->emplace(0, std::move(update));
    Step wait = WaitStep(absl::StrCat("wait adamw (deferred, host) ", u->name), Phase::kForward, u->updated.get());
    wait.stream = 1;
    before->emplace(u->update_at, std::move(wait));
  }
  for (auto& up : units_) {
    const Unit* u = up.get();
    if (u->host) continue;
    before->emplace(u->update_at, CommStep(absl::StrCat("adamw (deferred) ", u->name), Phase::kForward,
                                           [this, u](const Stream& s) { return UpdateUnit(*u, s); },
                                           u->updated.get()));
  }
}

absl::Status ShardedDataParallelStep::OrderAfterCompute(std::initializer_list<const Stream*> streams) const {
  SG_RETURN_IF_ERROR(ready_->Record(executor_->compute_stream()));
  for (const Stream* s : streams) SG_RETURN_IF_ERROR(ready_->Block(*s));
  return absl::OkStatus();
}

// Each unit's squared norm once its gradient shards are complete, then (a host unit) the copy
// of its slot to the host.
void ShardedDataParallelStep::AddDeferredStaging(std::multimap<int, Step>* before) {
  for (auto& up : units_) {
    const Unit* u = up.get();
    before->emplace(u->reduced_at,
                    CommStep(absl::StrCat(u->host ? "norm and copy to host grads " : "norm grads ", u->name),
                             Phase::kBackward,
                             [this, u](const Stream& s) -> absl::Status {
                               if (u->norm_list != nullptr) {
                                 const auto& list = *std::static_pointer_cast<kernels::AdamWTensorList>(u->norm_list);
                                 SG_RETURN_IF_ERROR(kernels::GradNorm(list, 0.f, Flat(unit_norms_, u->index, 1),
                                                                      TensorView(), s, norm_scratch_view_));
                               }
                               SG_RETURN_IF_ERROR(u->normed->Record(s));
                               if (!u->host) return absl::OkStatus();
                               const Stream& copy = HostCopyStream();
                               SG_RETURN_IF_ERROR(u->normed->Block(copy));
                               const TensorView slot = SlotView(u->bwd_slot, u->block);
                               SG_RETURN_IF_ERROR(CopyTensorAsync(slot, HostGradients(*u), copy));
                               return u->staged->Record(copy);
                             },
                             u->normed.get()));
  }
}

// One micro-batch: its loss seed (and, with several, its inputs) first, then the lowered forward +
// backward with the collectives inserted, keyed by the node index they precede, then its loss kept.
std::vector<Step> ShardedDataParallelStep::MicroBatchSteps(int index, const std::vector<Step>& lowered) {
  std::vector<Step> steps;
  const std::string suffix = micro_batches_ > 1 ? absl::StrCat(" (micro-batch ", index, ")") : "";
  if (micro_batches_ > 1) {
    Step load;
    load.kind = Step::Kind::kCopy;
    load.name = absl::StrCat("load inputs", suffix);
    load.impl = "copy";
    load.launch = [this, index](const Stream& s) -> absl::Status {
      for (const auto& [name, full] : full_input_views_) {
        const TensorView& dst = program_->sources.at(name);
        SG_RETURN_IF_ERROR(CopyTensor(Flat(full, index * dst.numel(), dst.numel()), Flat(dst, 0, dst.numel()), s));
      }
      return absl::OkStatus();
    };
    steps.push_back(std::move(load));
  }
  Step seed;
  seed.kind = Step::Kind::kCopy;
  seed.name = absl::StrCat("loss seed", suffix);
  seed.impl = "copy";
  // A device copy from the seeds Run staged: the backward's cross-entropy reads the seed input
  // when it runs, so a replayed graph uses this Run's token shares.
  seed.launch = [this, index](const Stream& s) -> absl::Status {
    return CopyTensor(Flat(seeds_, index, 1), Flat(program_->sources.at(kLossScaleName), 0, 1), s);
  };
  steps.push_back(std::move(seed));
  const bool accumulate = index > 0;
  std::multimap<int, Step> before;  // node index -> steps issued before it (in insertion order)
  if (Deferred()) AddDeferredUpdates(&before);
  // A unit whose gradients go to the host reduce-scatters into a slot once the unit that used it
  // before has been copied out.
  auto slot_free = [](const Unit* u, const Stream& s) {
    return u->bwd_slot_prev != nullptr ? u->bwd_slot_prev->staged->Block(s) : absl::OkStatus();
  };
  for (auto& up : units_) {
    Unit* u = up.get();
    if (u->fwd_at != INT_MAX) {
      before.emplace(u->fwd_at, CommStep(absl::StrCat("all-gather ", u->name, suffix), Phase::kForward,
                                         [this, u](const Stream& s) { return Gather(*u, false, s); },
                                         u->fwd_done.get()));
      before.emplace(u->fwd_first, WaitStep(absl::StrCat("wait all-gather ", u->name, suffix), Phase::kForward,
                                            u->fwd_done.get()));
    }
    if (u->bwd_at != INT_MAX) {
      before.emplace(u->bwd_at, CommStep(absl::StrCat("all-gather ", u->name, " (backward)", suffix), Phase::kBackward,
                                         [this, u](const Stream& s) { return Gather(*u, true, s); },
                                         u->bwd_done.get()));
      before.emplace(u->bwd_first, WaitStep(absl::StrCat("wait all-gather ", u->name, " (backward)", suffix),
                                            Phase::kBackward, u->bwd_done.get()));
    }
    if (PerParameter(*u)) {
      for (int i : u->params) {
        const Param* p = params_[size_t(i)].get();
        if (p->rs_at == INT_MAX) continue;
        before.emplace(p->rs_at, CommStep(absl::StrCat("reduce-scatter grad ", p->name, suffix), Phase::kBackward,
                                          [this, p, u, accumulate, slot_free](const Stream& s) {
                                            SG_RETURN_IF_ERROR(slot_free(u, s));
                                            return ReduceScatterParam(*p, accumulate, s);
                                          },
                                          p->rs_done.get()));
        before.emplace(p->rs_wait_at, WaitStep(absl::StrCat("wait reduce-scatter ", p->name, suffix),
                                               Phase::kBackward, p->rs_done.get()));
      }
    } else if (u->rs_at != INT_MAX) {
      before.emplace(u->rs_at, CommStep(absl::StrCat("reduce-scatter grads ", u->name, suffix), Phase::kBackward,
                                        [this, u, accumulate, slot_free](const Stream& s) {
                                          SG_RETURN_IF_ERROR(slot_free(u, s));
                                          return ReduceScatter(*u, accumulate, s);
                                        },
                                        u->rs_done.get()));
      if (u->packed_at < u->rs_wait_at) {
        before.emplace(u->packed_at, WaitStep(absl::StrCat("wait gradients packed ", u->name, suffix),
                                              Phase::kBackward, u->packed.get()));
      }
      before.emplace(u->rs_wait_at, WaitStep(absl::StrCat("wait reduce-scatter ", u->name, suffix), Phase::kBackward,
                                             u->rs_done.get()));
    }
  }
  if (Deferred()) AddDeferredStaging(&before);
  // Issues before waits at the same node, so a prefetch is never queued behind a wait.
  auto emit = [&](std::vector<Step>* out, int upto) {
    std::vector<Step> waits;
    while (!before.empty() && before.begin()->first <= upto) {
      Step st = std::move(before.begin()->second);
      before.erase(before.begin());
      (st.stream == 1 ? *out : waits).push_back(std::move(st));
    }
    for (Step& w : waits) out->push_back(std::move(w));
  };
  for (const Step& st : lowered) {
    if (st.node >= 0) emit(&steps, st.node);
    steps.push_back(st);
  }
  emit(&steps, INT_MAX);
  const TensorView loss = program_->outputs.at(dp_.graph.outputs()[0].name);
  Step keep;
  keep.kind = Step::Kind::kCopy;
  keep.name = absl::StrCat("keep loss", suffix);
  keep.impl = "copy";
  keep.launch = [this, loss, index](const Stream& s) {
    return CopyTensor(Flat(loss, 0, 1), Flat(local_losses_, index, 1), s);
  };
  steps.push_back(std::move(keep));
  return steps;
}

absl::Status ShardedDataParallelStep::Schedule() {
  std::vector<Step> steps;
  for (int i = 0; i < micro_batches_; ++i) {
    for (Step& st : MicroBatchSteps(i, program_->schedule.steps)) steps.push_back(std::move(st));
  }

  // The optimizer on the local shards, after the last reduce-scatter.
  const Phase opt = Phase::kOptimizer;
  steps.push_back(CommStep("all-gather losses", opt, [this](const Stream& s) -> absl::Status {
    if (world_size_ == 1) return CopyTensor(local_losses_, losses_, s);
    return layout_.world->AllGather(local_losses_, losses_, s);
  }, comm_done_.get()));
  auto local = std::static_pointer_cast<kernels::AdamWTensorList>(local_list_);
  auto norms = std::static_pointer_cast<kernels::AdamWTensorList>(norm_list_);
  auto counted = std::static_pointer_cast<kernels::AdamWTensorList>(counted_list_ ? counted_list_ : local_list_);
  Step ln;
  ln.name = "grad_norm (local shards)";
  ln.phase = opt;
  ln.impl = "kernel";
  ln.launch = [this, counted](const Stream& s) { return kernels::GradNorm(*counted, 0.f, norm_local_, TensorView(), s); };
  if (Deferred()) {
    // The units' norms, taken on the comm stream as their gradients were complete.
    for (const auto& u : units_) {
      steps.push_back(WaitStep(absl::StrCat("wait norm ", u->name), opt, u->normed.get()));
    }
    auto units = std::static_pointer_cast<kernels::AdamWTensorList>(unit_norm_list_);
    ln.name = "grad_norm (local, from the units' norms)";
    ln.launch = [this, units](const Stream& s) { return kernels::GradNorm(*units, 0.f, norm_local_, TensorView(), s); };
  }
  steps.push_back(std::move(ln));
  steps.push_back(CommStep("all-gather local grad norms", opt, [this](const Stream& s) -> absl::Status {
    comm::ProcessGroup* g = layout_.norm_group != nullptr ? layout_.norm_group : layout_.shard;
    if (g == nullptr) return CopyTensor(norm_local_, norms_, s);
    return g->AllGather(norm_local_, norms_, s);
  }, norms_done_.get()));
  steps.push_back(WaitStep("wait grad norms", opt, norms_done_.get()));
  const float max_norm = float(dp_.max_grad_norm);
  Step gn;
  gn.name = "grad_norm (global)";
  gn.phase = opt;
  gn.impl = "kernel";
  gn.launch = [this, norms, max_norm](const Stream& s) { return kernels::GradNorm(*norms, max_norm, norm_, clip_, s); };
  steps.push_back(std::move(gn));
  const kernels::AdamWConfig c{float(dp_.beta1), float(dp_.beta2), float(dp_.eps)};
  Step ad;
  ad.name = absl::StrCat("adamw (multi-tensor, local shards of ", params_.size(), " parameters)");
  ad.phase = opt;
  ad.impl = "kernel";
  ad.launch = [this, local, c](const Stream& s) { return kernels::AdamWStep(*local, c, lr_, counter_, clip_, s); };
  if (Deferred()) {
    // No update here: the next step's forward runs it, unit by unit, with this step's rate.
    ad.name = "keep lr for the deferred adamw";
    ad.kind = Step::Kind::kCopy;
    ad.impl = "copy";
    ad.launch = [this](const Stream& s) { return CopyTensor(lr_, lr_pending_, s); };
  }
  steps.push_back(std::move(ad));
  steps.push_back(WaitStep("join comm stream", opt, comm_done_.get()));
  program_->schedule.steps = std::move(steps);
  return absl::OkStatus();
}

absl::Status ShardedDataParallelStep::PrepareBatch(const std::map<std::string, TensorView>& full_batch) {
  std::map<std::string, TensorView> local;
  if (layout_.shard_batch) {
    SG_RETURN_IF_ERROR(layout_.shard_batch(full_batch, executor_->compute_stream(), &local));
  }
  const std::map<std::string, TensorView>& batch = layout_.shard_batch ? local : full_batch;
  auto t = batch.find(dp_.targets);
  if (t == batch.end()) {
    return absl::InvalidArgumentError(absl::StrCat("Run: missing input '", dp_.targets, "' (the loss's targets)"));
  }
  Tensor host;
  TensorView targets = t->second;
  if (!targets.device().is_cpu()) {
    SG_ASSIGN_OR_RETURN(host, Tensor::Empty(targets.shape(), targets.dtype(), Device::Cpu()));
    SG_RETURN_IF_ERROR(CopyTensor(targets, host.view(), executor_->compute_stream()));
    SG_RETURN_IF_ERROR(Wait());
    targets = host.view();
  }
  // Non-ignored tokens per micro-batch (its 1/k of the rows), then over every rank.
  const int64_t K = micro_batches_;
  std::vector<int64_t> mine = CountTargetsPerPart(targets, dp_.ignore_index, K);
  counts_.assign(size_t(world_size_ * K), 0);
  std::copy(mine.begin(), mine.end(), counts_.begin());
  if (world_size_ > 1) {
    SG_RETURN_IF_ERROR(layout_.world->AllGather(TensorView(mine.data(), DType::kI64, {K}, Device::Cpu()),
                                                TensorView(counts_.data(), DType::kI64, {world_size_ * K}, Device::Cpu())));
  }
  int64_t total = 0;
  for (int64_t c : counts_) total += c;
  // Staged like an input (pinned, asynchronous): the seed steps copy them on the device.
  scales_.assign(size_t(K), 0.f);
  for (int64_t i = 0; i < K; ++i) {
    scales_[size_t(i)] = total > 0 ? float(double(mine[size_t(i)]) / double(total)) : 0.f;
  }
  const TensorView host_seeds(scales_.data(), DType::kF32, {K}, Device::Cpu());
  SG_RETURN_IF_ERROR(staging_.Stage(kSeedsInput, host_seeds, seeds_, executor_->compute_stream()));
  if (K > 1) return StageFullInputs(batch);
  return CopyInputs(batch);
}

absl::Status ShardedDataParallelStep::Run(const std::map<std::string, TensorView>& batch) {
  SG_RETURN_IF_ERROR(PrepareBatch(batch));
  SG_RETURN_IF_ERROR(executor_->Run());
  pending_ = Deferred();
  return absl::OkStatus();
}

absl::StatusOr<StepTrace> ShardedDataParallelStep::TraceStep(const std::map<std::string, TensorView>& batch) {
  SG_RETURN_IF_ERROR(PrepareBatch(batch));
  SG_ASSIGN_OR_RETURN(StepTrace trace, executor_->RunTraced());
  pending_ = Deferred();
  return trace;
}

absl::Status ShardedDataParallelStep::ApplyPendingUpdate() const {
  if (!pending_) return absl::OkStatus();
  SG_RETURN_IF_ERROR(Wait());
  const Stream& s = executor_->compute_stream();
  for (const auto& u : units_) {
    if (u->update_list == nullptr) continue;
    if (u->host) SG_RETURN_IF_ERROR(CopyTensor(HostGradients(*u), SlotView(u->fwd_slot, u->block), s));
    SG_RETURN_IF_ERROR(UpdateUnit(*u, s));
  }
  // Applied: the next step's deferred updates are skipped.
  SG_RETURN_IF_ERROR(kernels::Fill(clip_, std::nanf(""), s));
  SG_RETURN_IF_ERROR(Wait());
  pending_ = false;
  return absl::OkStatus();
}

absl::StatusOr<StepMetrics> ShardedDataParallelStep::ReadMetrics() const {
  SG_RETURN_IF_ERROR(Wait());
  // One loss per (rank, micro-batch), weighted by its token count.
  const int64_t n = losses_.numel();
  std::vector<float> losses(size_t(n), 0.f);
  StepMetrics m;
  int64_t step = 0;
  const Stream& s = executor_->compute_stream();
  SG_RETURN_IF_ERROR(CopyTensor(losses_, TensorView(losses.data(), DType::kF32, {n}, Device::Cpu()), s));
  SG_RETURN_IF_ERROR(CopyTensor(norm_, TensorView(&m.grad_norm, DType::kF32, {1}, Device::Cpu()), s));
  // Deferred: the units count their applied updates (all alike; the first with rows here is read),
  // and the pending one is counted.
  TensorView counter = counter_;
  for (const auto& u : units_) {
    if (Deferred() && u->update_list != nullptr) {
      counter = UnitStep(*u);
      break;
    }
  }
  SG_RETURN_IF_ERROR(CopyTensor(counter, TensorView(&step, DType::kI64, {}, Device::Cpu()), s));
  SG_RETURN_IF_ERROR(Wait());
  m.loss = TokenWeightedLoss(losses, counts_);
  m.step = step + (pending_ ? 1 : 0);
  return m;
}

absl::Status ShardedDataParallelStep::SetLearningRate(float lr) {
  SG_RETURN_IF_ERROR(CopyTensor(TensorView(&lr, DType::kF32, {1}, Device::Cpu()), lr_, executor_->compute_stream()));
  return Wait();
}

const ShardedDataParallelStep::Param* ShardedDataParallelStep::FindParam(const std::string& name,
                                                                         TensorView Param::*which,
                                                                         const std::string& prefix) const {
  (void)which;
  if (!absl::StartsWith(name, prefix)) return nullptr;
  auto it = param_index_.find(name.substr(prefix.size()));
  return it == param_index_.end() ? nullptr : params_[it->second].get();
}

absl::StatusOr<TensorView> ShardedDataParallelStep::View(const std::string& name) const {
  struct Kind {
    const char* prefix;
    TensorView Param::*which;
  };
  for (const Kind& k : {Kind{"", &Param::shard}, Kind{"opt.m.", &Param::m}, Kind{"opt.v.", &Param::v},
                        Kind{"grad:", &Param::grad}}) {
    const Param* p = FindParam(name, k.which, k.prefix);
    if (p == nullptr) continue;
    if (k.which == &Param::grad) return p->step_grad();
    SG_RETURN_IF_ERROR(ApplyPendingUpdate());  // the caller may read or write the shard
    return p->*k.which;
  }
  if (name == "lr") return lr_;
  if (name == "grad_norm") return norm_;
  return CompiledStep::View(name);
}

absl::Status ShardedDataParallelStep::Write(const std::string& name, const TensorView& host) {
  const Stream& s = executor_->compute_stream();
  if (name == kLrName) return SetLearningRate(*static_cast<const float*>(host.raw()));
  if (name == kStepName) {
    SG_RETURN_IF_ERROR(CheckFullF32(name, 1, host));
    SG_RETURN_IF_ERROR(ApplyPendingUpdate());
    int64_t n = int64_t(*static_cast<const float*>(host.raw()));
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(&n, DType::kI64, {}, Device::Cpu()), counter_, s));
    if (Deferred()) {
      std::vector<int64_t> all(units_.size(), n);
      SG_RETURN_IF_ERROR(CopyTensor(TensorView(all.data(), DType::kI64, {int64_t(all.size())}, Device::Cpu()),
                                    unit_steps_, s));
    }
    return Wait();
  }
  for (const char* prefix : {"", "opt.m.", "opt.v."}) {
    const Param* p = FindParam(name, nullptr, prefix);
    if (p == nullptr) continue;
    SG_RETURN_IF_ERROR(CheckFullF32(name, p->rows * p->row, host));
    SG_RETURN_IF_ERROR(ApplyPendingUpdate());  // else the pending update would land on what is written
    const TensorView dst = std::string(prefix).empty() ? p->shard : (prefix[4] == 'm' ? p->m : p->v);
    if (p->mine.length > 0) {
      const TensorView src(static_cast<char*>(host.raw()) + p->mine.offset * p->row * 4, DType::kF32,
                           {p->mine.length * p->row}, host.device());
      SG_RETURN_IF_ERROR(CopyTensor(src, dst, s));
    }
    return Wait();
  }
  return CompiledStep::Write(name, host);
}

// Every rank's rows of a sharded tensor into the full `host` (collective over the shard group).
absl::Status ShardedDataParallelStep::GatherRows(const TensorView& shard, const Param& p, const TensorView& host) const {
  SG_RETURN_IF_ERROR(CheckFullF32(p.name, p.rows * p.row, host));
  const int P = shard_size_;
  const int64_t block = p.chunk * p.row;
  const Device d = program_->device;
  SG_ASSIGN_OR_RETURN(Tensor send, Tensor::Empty({std::max<int64_t>(block, 1)}, DType::kF32, d));
  SG_ASSIGN_OR_RETURN(Tensor recv, Tensor::Empty({std::max<int64_t>(block * P, 1)}, DType::kF32, d));
  const Stream& s = executor_->compute_stream();
  SG_RETURN_IF_ERROR(ZeroTensor(send.view(), s));
  if (shard.numel() > 0) SG_RETURN_IF_ERROR(CopyTensor(shard, Flat(send.view(), 0, shard.numel()), s));
  if (layout_.shard != nullptr) {
    SG_RETURN_IF_ERROR(layout_.shard->AllGather(Flat(send.view(), 0, block), Flat(recv.view(), 0, block * P), s));
  } else {
    SG_RETURN_IF_ERROR(CopyTensor(Flat(send.view(), 0, block), Flat(recv.view(), 0, block), s));
  }
  for (int k = 0; k < P; ++k) {
    const sharding::ChunkRange r = sharding::Chunk(p.rows, P, k);
    if (r.length == 0) continue;
    SG_RETURN_IF_ERROR(CopyTensor(Flat(recv.view(), k * block, r.length * p.row),
                                  TensorView(static_cast<char*>(host.raw()) + r.offset * p.row * 4, DType::kF32,
                                             {r.length * p.row}, host.device()), s));
  }
  return Wait();
}

absl::Status ShardedDataParallelStep::Read(const std::string& name, const TensorView& host) const {
  SG_RETURN_IF_ERROR(Wait());
  struct Kind {
    const char* prefix;
    TensorView Param::*which;
  };
  for (const Kind& k : {Kind{"", &Param::shard}, Kind{"opt.m.", &Param::m}, Kind{"opt.v.", &Param::v},
                        Kind{"grad:", &Param::grad}}) {
    const Param* p = FindParam(name, k.which, k.prefix);
    if (p == nullptr) continue;
    if (k.which == &Param::grad) return GatherRows(p->step_grad(), *p, host);
    SG_RETURN_IF_ERROR(ApplyPendingUpdate());
    return GatherRows(p->*k.which, *p, host);
  }
  if (name == "loss" || name == "grad_norm") {
    SG_RETURN_IF_ERROR(CheckFullF32(name, 1, host));
    SG_ASSIGN_OR_RETURN(StepMetrics m, ReadMetrics());
    *static_cast<float*>(host.raw()) = name == "loss" ? m.loss : m.grad_norm;
    return absl::OkStatus();
  }
  if (name == kStepName) {
    SG_RETURN_IF_ERROR(CheckFullF32(name, 1, host));
    SG_ASSIGN_OR_RETURN(StepMetrics m, ReadMetrics());
    *static_cast<float*>(host.raw()) = float(m.step);
    return absl::OkStatus();
  }
  if (name == kLrName) return CopyTensor(lr_, host, executor_->compute_stream());
  return CompiledStep::Read(name, host);
}

}  // namespace sg::compiler
