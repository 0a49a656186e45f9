// The sharded data-parallel runtime behind FSDP (ZeRO-3), HYBRID_SHARD and DDP: one lowered
// forward + backward (compiler/data_parallel_graph.h) whose parameter buffers are transient arena
// slots, plus the collectives and the optimizer on this rank's shards.
//
//   SG_ASSIGN_OR_RETURN(auto step, ShardedDataParallelStep::Create(train, options, layout, ctx, why));
//   step->Write("layers.0.attention.wq.weight", full_host);   // keeps rows of this rank's chunk
//   step->Run(my_batch);                                       // like CompiledStep::Run
//
// Per parameter p of dim-0 extent n over a shard group of size P: this rank keeps rows
// torch.chunk(n, P)[rank] (uneven chunks allowed, possibly empty) of p, its gradient, AdamW m and
// v (f32 master weights). Under bf16 mixed precision the parameters are gathered in bf16 (as
// PyTorch FSDP2's MixedPrecisionPolicy(param_dtype=bf16)): each gather casts this rank's f32 rows
// into its own block of the all-gather's output and gathers bf16 in place, and the program reads
// the bf16 buffers directly (compiler/data_parallel_graph.h's GatherInComputeDType); gradients,
// their reduce-scatter and the optimizer stay f32. The schedule, per FSDP unit (a transformer
// block; compiler/UnitOf):
//   forward   all-gather(unit k+1) is issued on the comm stream when unit k's compute starts
//             (prefetch), into transient buffers live from there to the unit's last forward use;
//   backward  the same into separate "@bwd" buffers, one unit ahead in backward order;
//   gradients once a unit's last gradient exists: one bucketed reduce-scatter (sum) of the whole
//             unit over the shard group, then an all-reduce (sum) over the replicate group;
//             compute waits for it only before the next unit's reduce-scatter is issued; a packed
//             unit's full gradient buffers are reused earlier, once compute has waited for the
//             copies into the bucket (after the second matmul that follows the issue);
//   optimizer global grad norm (local sums of squares, the P local norms all-gathered over the
//             shard group) for clipping, then one multi-tensor AdamW over the local shards.
// Collectives run on the executor's comm stream ordered against compute by events (on the CPU
// both are the host thread, in schedule order). A unit of one parameter whose rows split evenly
// (embeddings, output, final norm), or under CompileOptions::fsdp_per_parameter_collectives any
// unit whose parameters' rows all split evenly, is all-gathered straight into its full buffers
// and reduce-scattered straight from its full gradients into the shards, one collective per
// parameter, each reduce-scatter issued as soon as its gradient exists; other units go through two
// staging buffers: the unit packed rank-major and one rank's block (a bf16 gather uses the first
// half of the packed one only, its own block cast in place). Uneven chunks are zero-padded (only
// what the chunks leave is zeroed) to ceil(n/P) rows inside each bucket. Memory per rank: ShardedStepMemory (PlanMemory plans it). The loss is each rank's mean over its non-ignored tokens; Run counts them,
// all-gathers the counts, and seeds backward with local/global count; the reported loss is the
// count-weighted mean of the all-gathered local losses: the global mean.
//
// Gradient accumulation (CompileOptions::micro_batches = k > 1): the forward + backward is lowered
// for batch / k and Run takes the whole (per-rank) batch, staged into full-size input buffers and
// split along dim 0. The schedule runs the forward + backward k times (each after a device copy of
// its micro-batch into the step's input buffers), then the optimizer once. Micro-batch i seeds its
// backward with (its non-ignored tokens / all ranks' tokens over all micro-batches), so the summed
// gradients are those of the global mean over the whole batch. The gradient reduce-scatter (and
// the replicate all-reduce) runs once per micro-batch, as in the unaccumulated step, and the first
// micro-batch overwrites the f32 gradient shards while later ones add to them: the full-size
// gradients never outlive their micro-batch, so memory stays that of one micro-batch.
//
// The deferred optimizer (CompileOptions::fsdp_host_gradient_units = n > 0, one micro-batch):
//   backward  after each unit's reduce-scatter, on the comm stream, its squared norm (a kernel over
//             its gradient shards); for the first n units in backward order the reduce-scatter
//             writes into one of kHostGradientSlots device slots, and a copy stream (HostCopyStream)
//             then moves the slot to the unit's region of a pinned host buffer;
//   end       the local norm from the units' norms, the global norm and clip factor as above, and
//             the learning rate kept for the update; no AdamW;
//   forward   (next step) AdamW of each unit's shards with the kept learning rate and clip factor,
//             each unit with its own step counter (all equal): a unit on the device on the comm
//             stream just before its first all-gather; the host units from the step's start, in
//             forward order, each copied back into a slot on the copy stream once the unit before
//             it in that slot is updated (not the first two, the last two in backward order, whose
//             gradients are still in their slots) and updated on the step's own update stream,
//             the comm stream waiting for that update before the unit's all-gather. Steps with
//             copies back run eagerly (a replayed graph ran them behind the forward).
// Step N's update reads step N's gradients, learning rate and clip factor, and step N+1's forward
// gathers the updated shards: the parameters each forward sees are those of the eager optimizer.
// A clip factor of NaN skips an update (AdamWStep), which is how the first step, and a step right
// after the pending update was applied by Read/Write/View, have none. "step" counts the pending
// update.
#ifndef SGTRAIN_COMPILER_FSDP_H_
#define SGTRAIN_COMPILER_FSDP_H_

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "compiler/compile.h"
#include "compiler/data_parallel_graph.h"
#include "compiler/dist_context.h"
#include "kernels/core/stream.h"

namespace sg::kernels {
struct AdamWParam;  // kernels/adamw/adamw.h
}  // namespace sg::kernels

namespace sg::compiler {

// Which ranks a sharded data-parallel step talks to. Null groups are this rank alone.
struct DataParallelLayout {
  comm::ProcessGroup* shard = nullptr;      // parameters are split over it
  comm::ProcessGroup* replicate = nullptr;  // holds identical shards (HYBRID_SHARD, DDP)
  comm::ProcessGroup* world = nullptr;      // every rank with a share of the batch
  // Context parallelism (compiler/context_parallel/cp_step.h) adapts the runtime through these:
  // rewrite_program runs once on the lowered program before the collectives are scheduled (ring
  // attention and global RoPE positions replace launches); shard_batch maps every Run's batch to
  // the inputs the program takes (this rank's sequence rows) before tokens are counted.
  std::function<absl::Status(Program&)> rewrite_program;
  std::function<absl::Status(const std::map<std::string, TensorView>& batch, const Stream& stream,
                             std::map<std::string, TensorView>* local)>
      shard_batch;
  // Tensor parallelism inside the shards (FSDP x TP, compiler/tensor_parallel_fsdp.h) adapts it
  // through these: rewrite_graph replaces SplitOptimizer's graph before anything is sized (with
  // the per-rank tp graph: parameters of local shape, tp collectives added by rewrite_program);
  // the local gradient norms are all-gathered over norm_group (null: the shard group), and a
  // parameter's shard enters this rank's local norm only when counts_in_norm says so (null: all),
  // so a copy replicated over another group is counted once.
  std::function<absl::StatusOr<DataParallelGraph>(DataParallelGraph)> rewrite_graph;
  comm::ProcessGroup* norm_group = nullptr;
  std::function<bool(const std::string& param)> counts_in_norm;
};

// Device memory of a sharded data-parallel step on one rank, by buffer (what Create takes from
// AllocatorFor(device)), plus the collectives' own scratch inside comm. Kernel library workspaces
// (cuBLASLt, autotuning) are not included.
struct ShardedStepMemory {
  int64_t arena_bytes = 0;   // the lowered forward + backward: activations, gathered (transient)
                             // parameters, full gradients until reduce-scattered, kernel scratch
  int64_t state_bytes = 0;   // the program's state: the (micro-batch) inputs
  int64_t shard_bytes = 0;   // this rank's f32 rows of every parameter, its gradient, AdamW m and v
  int64_t bucket_bytes = 0;  // collective staging: packed units (all-gather / reduce-scatter)
  int64_t other_bytes = 0;   // scalars; full-batch inputs with micro-batches
  // comm's reduce-scatter work buffer, the size of its input (the largest unit's gradients): the
  // host ring (CPU) copies its input into one for each call, the device ring keeps one when the
  // shard group has more than 2 ranks; 0 otherwise. Taken while the steps run, not by Create.
  int64_t comm_scratch_bytes = 0;
  // CompileOptions::fsdp_host_gradient_units: the gradient shards of those units in pinned host
  // memory (not device memory: not in Total). Their device slots are in shard_bytes.
  int64_t host_gradient_bytes = 0;
  // Parts of arena_bytes, for accounting (each the most live at one node, not necessarily at the
  // arena's peak): gathered parameters (forward and "@bwd" copies; f32, or bf16 under mixed
  // precision), f32 full unit gradients
  // until packed into the bucket (or, for a Direct unit, until its reduce-scatter is waited for).
  int64_t gathered_peak_bytes = 0, unit_grads_peak_bytes = 0;
  ArenaPeak arena_peak;  // what is live in the arena at its busiest node
  int64_t Total() const {
    return arena_bytes + state_bytes + shard_bytes + bucket_bytes + other_bytes + comm_scratch_bytes;
  }
  std::string ToString() const;
};

class ShardedDataParallelStep : public CompiledStep {
 public:
  // What Create would allocate on rank `shard_rank` of a shard group of `shard_size` (with
  // `world_size` ranks in all), planning only: e.g. the 1b FSDP step's per-GPU memory, checked on
  // a machine without a GPU. The same errors as Create's lowering.
  //
  //   SG_ASSIGN_OR_RETURN(ShardedStepMemory m, ShardedDataParallelStep::PlanMemory(train, o, 2, 0, 2));
  static absl::StatusOr<ShardedStepMemory> PlanMemory(const graph::Graph& train, const CompileOptions& options,
                                                      int shard_size, int shard_rank, int world_size);

  // `train`: the prepared training step (adamw nodes, "grad:<p>" outputs). Collective: every
  // rank calls it with the same graph and options.
  static absl::StatusOr<std::unique_ptr<ShardedDataParallelStep>> Create(const graph::Graph& train,
                                                                        const CompileOptions& options,
                                                                        DataParallelLayout layout,
                                                                        std::shared_ptr<DistContext> context,
                                                                        std::string explanation);

  absl::Status Run(const std::map<std::string, TensorView>& batch) override;
  absl::StatusOr<StepMetrics> ReadMetrics() const override;
  absl::Status SetLearningRate(float lr) override;
  // Parameters, "opt.m.<p>", "opt.v.<p>" take and "grad:<p>" also gives full tensors (Read gathers:
  // collective over the shard group); "loss" and "grad_norm" are the global values.
  absl::Status Write(const std::string& name, const TensorView& host) override;
  absl::Status Read(const std::string& name, const TensorView& host) const override;
  // This rank's shard of a parameter, its optimizer state or "grad:<p>" (host memory for a unit
  // whose gradients wait there); otherwise as the base. A parameter or its state: the pending
  // deferred update applied first, so the view holds the values after the last step.
  absl::StatusOr<TensorView> View(const std::string& name) const override;
  absl::StatusOr<StepTrace> TraceStep(const std::map<std::string, TensorView>& batch) override;
  // What this step allocated (equal to PlanMemory's answer for its options and groups).
  const ShardedStepMemory& memory() const { return memory_; }

  ~ShardedDataParallelStep() override;

  // Device slots a unit's gradient shards pass through on their way to and from host memory.
  static constexpr int kHostGradientSlots = 2;

 protected:
  // Waits for the queued steps with the deadline comm_timeout_ (compiler/dist_cuda_graph.h).
  absl::Status Wait() const;
  ShardedDataParallelStep() = default;
  // Create's body: for a subclass that adapts the step through the layout's hooks.
  absl::Status Init(const graph::Graph& train, const CompileOptions& options, DataParallelLayout layout,
                    std::shared_ptr<DistContext> context, std::string explanation);

 private:
  struct Param;
  struct Unit;
  // Ranks whose local gradient norms make the global one (the norm group's size, or the shard's).
  int NormRanks() const;
  // Plans the step (fsdp_plan.cc), then allocates it, schedules it and starts its executor.
  absl::Status Build(const graph::Graph& train, const CompileOptions& options);
  // The planning steps of Build, in order: params_ and units_ from dp_ (each parameter's first and
  // last uses and its gradient's producer); the node each unit's gathers and reduce-scatters are
  // issued at and waited for; the lowering options (the parameters as transient buffers, when each
  // gradient is read and freed); the binding of one micro-batch (batch / micro_batches, checked).
  void CollectUnits();
  void PlanIssuePoints(const graph::Binding& binding);
  LowerOptions PlanLowering(const CompileOptions& options) const;
  absl::StatusOr<graph::Binding> MicroBatchBinding(const CompileOptions& options);
  // What the plan chose, appended to explanation_ (per-parameter collectives, gather dtype, the
  // deferred optimizer's host units).
  void ExplainPlan();
  // The executor (a CUDA graph where the plan allows), input staging, zeroed shards and scalars.
  absl::Status StartExecutor(const CompileOptions& options);
  // Fills the parameters' and units' sizes and offsets and memory_, allocating nothing.
  absl::Status SizeBuffers();
  // Its steps, in order: each parameter's sizes, gather dtypes and place in its unit's block; the
  // units' regions of the shards and of the host buffer (their offsets into `unit_base`, the shard
  // bytes returned); the units' norm scratch; the staging buckets and the largest collective; the
  // peaks of the gathered parameters and unit gradients in the arena; the micro-batches' inputs.
  absl::Status SizeParams();
  int64_t LayOutShards(std::vector<int64_t>* unit_base, int64_t* host_bytes);
  void SizeNormScratch();
  void SizeStaging(int64_t* packed, int64_t* block, int64_t* largest) const;
  void PlanArenaPeaks();
  void AddMicroBatchInputs();
  int64_t ScalarBytes() const;
  // The buffers SizeBuffers sized, then in order: each parameter's views into the shards (and
  // slots or host memory for a host unit); the scalars' views; AdamW's tensor lists (this rank's
  // shards, those counted in the norm, each unit's for the deferred update and norm); the events
  // (and the deferred updates' stream).
  absl::Status Allocate();
  void ViewShards();
  void CarveScalars();
  static kernels::AdamWParam Adam(const Param& p, const TensorView& grad);
  absl::Status CreateOptimizerLists();
  absl::Status CreateEvents();
  // A unit of one parameter whose rows split evenly, or (CompileOptions::
  // fsdp_per_parameter_collectives) of parameters whose rows all split evenly: each parameter
  // gathered straight into its full buffer and reduce-scattered straight from its full gradient
  // into its gradient shard, one collective per parameter (no packing through the buckets).
  bool Direct(const Unit& u) const;
  // A Direct unit under fsdp_per_parameter_collectives: each parameter's reduce-scatter issued as
  // soon as its gradient exists and waited for after the second matmul from there. Otherwise a
  // Direct unit's one parameter is reduce-scattered on the unit schedule (as the bucketed units).
  bool PerParameter(const Unit& u) const;
  // A unit that is not Direct whose reduce-scatter writes this rank's sum straight into its
  // gradient shards (laid out as the bucket block): every chunk of this rank full length, and
  // 16-bit gathers (an f32 gather stages through the block).
  bool ScatterIntoShards(const Unit& u) const;
  absl::Status Schedule();
  absl::Status PrepareBatch(const std::map<std::string, TensorView>& batch);
  absl::Status Gather(const Unit& u, bool backward, const Stream& s);
  absl::Status GatherCast(const Unit& u, bool backward, const Stream& s);
  absl::Status Unpack(const Unit& u, bool backward, const TensorView& packed, const Stream& s);
  // Sums a unit's gradients over the groups into this rank's shards: overwriting them, or adding to
  // them when `accumulate` (micro-batches after the first).
  absl::Status ReduceScatter(const Unit& u, bool accumulate, const Stream& s);
  // One parameter of a Direct unit.
  absl::Status ReduceScatterParam(const Param& p, bool accumulate, const Stream& s);
  absl::Status ReduceBlock(const TensorView& input, const TensorView& sum, const Stream& s);
  // The schedule of micro-batch `index`: the lowered steps with the collectives inserted.
  std::vector<Step> MicroBatchSteps(int index, const std::vector<Step>& lowered);
  // The deferred optimizer: which units wait on the host, their slots and issue points.
  absl::Status PlanDeferredUpdate();
  // Its steps inside the step's schedule, keyed by node as in MicroBatchSteps: the copies back and
  // the updates (added before the gathers, so an update precedes its unit's gather at the same
  // node), then the norms and copies to the host (added after the reduce-scatters).
  void AddDeferredUpdates(std::multimap<int, Step>* before);
  void AddDeferredStaging(std::multimap<int, Step>* before);
  TensorView SlotView(int slot, int64_t elements) const;
  TensorView HostGradients(const Unit& u) const;  // the unit's region of the host buffer
  TensorView UnitStep(const Unit& u) const;       // its step counter (i64)
  // The unit's deferred AdamW (its gradients already in its forward slot) on `s`; none without rows.
  absl::Status UpdateUnit(const Unit& u, const Stream& s) const;
  // The stream of the host gradient copies: the executor's 4th when the weight-gradient matmuls do
  // not use it, so they run beside the activation offloads' copies (the copy stream), which go the
  // other way over PCIe in each phase; the copy stream otherwise.
  const Stream& HostCopyStream() const {
    return wgrad_stream_ ? executor_->copy_stream() : executor_->wgrad_stream();
  }
  // Records ready_ on the compute stream and makes each of `streams` wait for it.
  absl::Status OrderAfterCompute(std::initializer_list<const Stream*> streams) const;
  // The pending deferred update applied now (eagerly, after the queued steps), so the shards and
  // moments hold the values after the last step; nothing pending afterwards.
  absl::Status ApplyPendingUpdate() const;
  bool Deferred() const { return host_gradient_units_ > 0; }
  // Full-batch input buffers for micro_batches_ > 1 (staged into by Run, sliced per micro-batch).
  absl::Status AllocateFullInputs();
  absl::Status StageFullInputs(const std::map<std::string, TensorView>& batch);
  // CompiledStep::CommStep ordered after compute through this step's `ready_` event.
  Step CommStep(std::string name, graph::Phase phase, std::function<absl::Status(const Stream&)> body, Event* done) {
    return CompiledStep::CommStep(std::move(name), phase, ready_.get(), std::move(body), done);
  }
  absl::Status GatherRows(const TensorView& shard, const Param& p, const TensorView& host) const;
  const Param* FindParam(const std::string& name, TensorView Param::*which, const std::string& prefix) const;

  DataParallelLayout layout_;
  std::shared_ptr<DistContext> context_;
  DataParallelGraph dp_;
  int shard_size_ = 1, shard_rank_ = 0, world_size_ = 1;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::map<std::string, int> param_index_;
  DeviceMemory shards_, buckets_, scalars_;
  // Staging, f32: packed_ holds a whole unit rank-major (all-gather output, reduce-scatter input)
  // for units that are not Direct; block_ one rank's block (all-gather input, reduce-scatter output).
  TensorView packed_, block_;
  bool plan_only_ = false;
  bool per_parameter_collectives_ = false;  // CompileOptions::fsdp_per_parameter_collectives
  ShardedStepMemory memory_;
  std::vector<int64_t> shard_offsets_;  // per parameter, in shards_
  TensorView lr_, counter_, norm_local_, norms_, norm_, clip_, losses_, dummy_[3];
  std::shared_ptr<void> local_list_, norm_list_;  // kernels::AdamWTensorList
  std::shared_ptr<void> counted_list_;  // the shards counts_in_norm keeps (null: local_list_)
  std::unique_ptr<Event> ready_, comm_done_, norms_done_;
  // Non-ignored tokens per (world rank, micro-batch), rank-major, last Run.
  std::vector<int64_t> counts_;
  std::vector<float> scales_;  // this rank's loss seed per micro-batch, last Run
  TensorView seeds_;           // f32[micro_batches_]: scales_ on the device (staged by Run)
  absl::Duration comm_timeout_ = absl::Seconds(300);  // CompileOptions::comm_timeout_s
  int micro_batches_ = 1;
  TensorView local_losses_;  // f32[micro_batches_]: this rank's loss per micro-batch
  DeviceMemory full_inputs_;
  // The deferred optimizer (Deferred()): host units requested, the slots' offset in shards_ and
  // bytes each, the host buffer, the learning rate the update uses, the per-unit norms and step
  // counters (i64), dummies for the norm list over unit_norms_, and whether an update is pending.
  int host_gradient_units_ = 0;
  bool wgrad_stream_ = false;  // CompileOptions::wgrad_stream
  // CompileOptions::bf16_gradients (plain FSDP / HSDP, one micro-batch): the matmul weights'
  // gradients stay bf16, every unit's bucket is bf16 (an f32 gradient is rounded into it, as FSDP2
  // computes every gradient in bf16), and the reduce-scatter sums the bf16 blocks in f32 into the
  // f32 gradient shards (FSDP2's reduce_dtype=f32).
  bool bf16_gradients_ = false;
  int64_t slots_offset_ = 0, slot_bytes_ = 0;
  int64_t norm_scratch_ = 0;       // f32 elements: GradNorm's partial sums of the largest unit
  TensorView norm_scratch_view_;   // (the norms run on the comm stream, off the caching allocator)
  std::shared_ptr<void> host_grads_;
  // The host units in forward order (their updates' order), and the stream of their updates (a
  // stream of the step's own, so an update waiting for its copy back holds up no collective).
  std::vector<const Unit*> host_order_;
  std::optional<Stream> update_stream_;
  TensorView lr_pending_, unit_norms_, unit_steps_, unit_dummy_[3];
  std::shared_ptr<void> unit_norm_list_;
  mutable bool pending_ = false;
  std::map<std::string, TensorView> full_input_views_;  // by input name, [k * micro dim 0, ...]
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_FSDP_H_
