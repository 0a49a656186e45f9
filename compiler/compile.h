// The compiler's one declarative call: a captured model graph in, a runnable training step out.
//
//   sg::compiler::CompileOptions opt;
//   opt.device = sg::Device::Cuda(0);
//   opt.precision = sg::compiler::Precision::kBF16Mixed;
//   opt.binding = {{"batch", 8}, {"seq", 2048}};
//   SG_ASSIGN_OR_RETURN(auto step, sg::compiler::Compile(forward_graph, opt));
//   for (auto& [name, host] : initial_weights) SG_RETURN_IF_ERROR(step->Write(name, host));
//   SG_RETURN_IF_ERROR(step->SetLearningRate(3e-4f));
//   SG_RETURN_IF_ERROR(step->Run({{"tokens", tokens}, {"targets", targets}}));   // no host sync
//   SG_ASSIGN_OR_RETURN(sg::compiler::StepMetrics m, step->ReadMetrics());      // syncs
//
// Precision::kF16Mixed adds dynamic loss scaling decided on the device (LossScaleOptions below;
// StepMetrics reports the scale and skipped steps). Inside Compile: the mixed-precision rewrite
// (compiler/training_graph.h) and the graph layer's
// pipeline (graph/pipeline.h: fusion, autodiff, grad-norm clipping + AdamW, CSE, DCE, recompute)
// when given a forward graph; then lowering
// to a schedule over one memory-planned arena (compiler/lowering.h) and an executor that replays
// it as a CUDA graph after warm-up (compiler/executor.h). The prepared training graph is cached
// on disk under cache_dir (graph/cache.h's CompileCache), so a second process start skips
// autodiff and the passes.
//
// The model graph never changes with the strategy: distribution is an option here.
#ifndef SGTRAIN_COMPILER_COMPILE_H_
#define SGTRAIN_COMPILER_COMPILE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/executor.h"
#include "compiler/input_staging.h"
#include "compiler/lowering.h"
#include "compiler/trace.h"
#include "compiler/training_graph.h"
#include "graph/ir.h"
#include "graph/optimizer.h"
#include "graph/passes/passes.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

// kNone: one device. kFsdp (ZeRO-3 over every mesh dim), kHybridShard (2-D mesh: replicate across
// dim 0, shard within dim 1), kTensorParallel (Megatron over the mesh's last dim, DDP or, with
// tensor_parallel_fsdp, FSDP across dim 0 of a 2-D mesh; compiler/tensor_parallel.h),
// kAuto (sharding::ChooseStrategy picks): the job's
// processes (see compiler/distributed.h). kContextParallel (sequence sharded over the last mesh dim,
// ring attention; compiler/context_parallel/cp_step.h) and kPipeline (layers split into stages over
// the mesh, 1F1B; with a {dp, pp} mesh, replicas of the pipeline, optionally FSDP-sharded:
// pipeline_fsdp; compiler/pipeline/pp_step.h) are registered by those targets (link them).
enum class Strategy : uint8_t { kNone, kFsdp, kHybridShard, kTensorParallel, kAuto, kContextParallel, kPipeline };
const char* StrategyName(Strategy s);
// graph/passes/passes.h: kNone, kSelective (recompute norms, rope, elementwise), kFull (keep only
// values crossing a layer boundary).
using RecomputePolicy = graph::RecomputePolicy;

// Dynamic loss scaling under Precision::kF16Mixed (torch.cuda.amp.GradScaler's defaults), decided
// on the device every step (kernels/adamw's UpdateLossScale), so a captured step replays it: the
// loss's backward is seeded with the scale S ("loss_scale", a runtime-owned source), the gradient
// norm and AdamW see the gradients times 1/S, and a step whose gradient norm is not finite leaves
// parameters, moments and "step" unchanged, multiplies S by backoff (not below min_scale) and
// restarts the count of good steps; after growth_interval good steps in a row S is multiplied by
// growth.
struct LossScaleOptions {
  double initial_scale = 65536.0;
  int64_t growth_interval = 2000;
  double backoff = 0.5, growth = 2.0, min_scale = 1.0;
};

struct CompileOptions {
  Strategy strategy = Strategy::kNone;
  // Device mesh shape for distributed strategies, e.g. {2, 2} ("dp" x "tp"); empty: {world size}.
  // The binding below is then per rank (each rank's share of the batch).
  std::vector<int64_t> mesh;
  int64_t comm_timeout_s = 300;  // deadline of every collective (a dead peer fails the step)
  Precision precision = Precision::kF32;
  LossScaleOptions loss_scale;  // kF16Mixed only (single device: kNone, micro_batches 1)
  RecomputePolicy recompute = RecomputePolicy::kNone;
  // kSelective: recompute SwiGLU only in the first n layers (-1: all); see ChooseRecompute.
  int recompute_swiglu_layers = -1;
  bool overlap = true;  // communication on its own stream, overlapped with compute
  // kFsdp: gather and reduce-scatter each parameter of a unit on its own, in place, when all its
  // rows split evenly (no f32 rank-major bucket: 0.77 GiB at 7b on 2 ranks), instead of one
  // bucketed collective per unit (transformer layer). It costs a collective per weight: the 1b
  // FSDP step on 2 H200s ran 3.1% slower (nine collectives a layer instead of one), so it is a
  // memory option that ChooseRecompute takes only when full recompute alone does not fit.
  bool fsdp_per_parameter_collectives = false;
  // Kept activations moved to host memory between their forward and backward uses: the first n
  // (in forward order) that the backward reads after a long gap (LowerOptions::offload_activations,
  // compiler/offload.h). A memory option: ChooseRecompute takes the fewest that fit once full
  // recompute (and per-parameter collectives) do not.
  int offload_activations = 0;
  // kFsdp / HYBRID_SHARD, one micro-batch: the gradient shards of the first n units in backward
  // order (the output layer, then the last transformer layers) wait in pinned host memory between
  // the backward and the optimizer, and AdamW runs one step late, unit by unit: step N's update of
  // a unit runs in step N+1's forward, on the comm stream just before that unit's all-gather, with
  // step N's learning rate and clip factor (the same updates, in the same order per parameter).
  // Each unit's reduce-scatter writes into one of two device slots, its squared norm is taken
  // there, then it is copied to the host; in the next forward it is copied back into a slot ahead
  // of its update. Saves 4 bytes a parameter on the device less the slots (7b on 2 ranks: 12.55
  // GiB of gradient shards); costs 4 bytes a parameter each way over PCIe every step (7b on 2
  // H200s, 2026-12-01: 41.89 GiB at 3.3% fewer tokens/s than the 52.8 GiB plan). Read, Write
  // and View of parameters, moments and "step" apply the pending update first. A memory option:
  // ChooseRecompute takes the fewest units that fit once activation offloading does not. 0: off.
  int fsdp_host_gradient_units = 0;
  // ChooseRecompute only: when no recompute does not fit, try no recompute with the fewest kept
  // activations offloaded before any recompute (copies over PCIe that may hide under compute,
  // instead of recomputed kernels). Opt-in: llama_step_benchmark --offload_first.
  bool offload_before_recompute = false;
  // Weight-gradient matmuls on a stream of their own, overlapping the backward's data-gradient chain
  // (LowerOptions::wgrad_stream; their inputs live longer, which the plan counts). One device, or
  // FSDP / HYBRID_SHARD (joined before the reduce-scatters that read them), one micro-batch.
  // Opt-in: llama_step_benchmark --wgrad_stream. Measured on H200s (2026-11-30): no gain (1b +0.1%,
  // 124m -1.3%, FSDP -0.85%): cuBLAS's GEMMs already occupy every SM.
  bool wgrad_stream = false;
  // The LM head in this many blocks of tokens (> 1; compiler/lowering_fusion.h): the logits
  // matmul, the fused cross-entropy and the matmuls of dh and dW run block by block in one launch,
  // so the [tokens, vocab] logits never exist (1b: 1000 MiB of bf16 logits at the step's peak, the
  // start of the backward, become one block). The same loss and dh; dW summed over the blocks in
  // f32. One device, one micro-batch, without wgrad_stream. 1: off (the default until measured).
  int lm_head_chunks = 1;
  // One device, one micro-batch: the MLP backward's dh = dy @ W2 and the SwiGLU backward reading it
  // as one Hopper kernel (LowerOptions::swiglu_backward_gemm; dh never stored), where it runs.
  // On by default: on an H200 (benchmarks/README.md, 2026-12-03) the 124m step +0.45% (every fused
  // run faster than every unfused one), the 1b within noise (-0.1% over 9 pairs).
  bool swiglu_backward_gemm = true;
  // One device, FSDP or HYBRID_SHARD, one micro-batch, bf16 mixed precision (else Compile returns
  // InvalidArgument): the matmul weights' gradients stay in bf16 where only the optimizer (or the
  // FSDP runtime) reads them (LowerOptions::bf16_gradients; "grad:<param>" of those weights is then
  // bf16 on one device). FSDP / HYBRID_SHARD pack every unit's gradients into a bf16 bucket (an f32
  // norm or embedding gradient rounded in, as FSDP2 computes all of them in bf16) and reduce-scatter
  // it summed in f32 into the f32 shards (FSDP2's reduce_dtype=f32): on two GPUs over CUDA IPC the
  // buckets cross NVLink in bf16. Not measured on two GPUs yet. The values PyTorch's autocast stores in its f32 .grad (the bf16 GEMM output, cast),
  // in half the bytes: at the 1b, 2.1 GB less written by the GEMMs and 2.1 GB less read by each of
  // the norm and AdamW. The peak (the start of the backward, when few gradients exist) drops only
  // 0.12 GiB. AdamW and the norm still compute in f32; the norm weights and the embedding keep f32
  // gradients. Off: the weight-gradient GEMMs write f32 straight from their f32 accumulators (more
  // precise than the peer).
  bool bf16_gradients = false;
  Device device = Device::Cpu();
  std::string cache_dir;  // "" disables the compile cache
  // Concrete sizes for the graph's symbols; the step is specialized to them (static shapes).
  graph::Binding binding;
  std::string loss = "loss";
  // AdamW and clipping (graph/optimizer.h); keep_grad_outputs is forced on so "grad:<param>"
  // stays readable after a step.
  graph::AdamWOptions adamw;
  bool fuse = true;  // the graph layer's kernel fusion pass
  // CUDA: capture the whole step after `warmup_steps` eager steps and replay it, for a single
  // device and for the distributed steps (FSDP, HYBRID_SHARD, tensor parallel: collectives included,
  // compiler/dist_cuda_graph.h). Off, or SG_CUDA_GRAPH=0 in the environment: eager. The
  // distributed steps' explanation() says which, and why.
  bool cuda_graph = true;
  int warmup_steps = 1;
  // kTensorParallel: split the token embedding and the LM head over the vocabulary (Megatron's
  // vocabulary-parallel embedding and cross-entropy; compiler/tensor_parallel.h); false keeps them
  // replicated on every tp rank, with full-vocabulary logits.
  bool tp_vocab_parallel = true;
  // kTensorParallel on a 2-D mesh {D, T}: shard each rank's tp slices ZeRO-3 style over mesh dim
  // 0 (FSDP x TP; compiler/tensor_parallel_fsdp.h) instead of replicating them there (DDP).
  bool tensor_parallel_fsdp = false;
  // kContextParallel: shard parameters ZeRO-3 style over every rank (FSDP x CP) instead of
  // replicating them (gradients all-reduced).
  bool context_parallel_fsdp = false;
  // kPipeline with mesh {dp, pp}: shard each stage's parameters, gradients and AdamW state ZeRO-3
  // style over its dp group (the ranks holding the same stage in the other replicas) instead of
  // replicating them (gradients all-reduced). Mesh {2, 2} on 4 ranks: 2 stages, each sharded over 2.
  bool pipeline_fsdp = false;
  // CUDA: the warm-up step times kernel variants (the GEMMs' cuBLASLt algorithms) once per shape
  // and device model and keeps the fastest, persisted in the compile cache under cache_dir
  // (compiler/autotune.h). SG_AUTOTUNE=0 in the environment turns it off. Needs warmup_steps >= 1
  // (inside a capture untuned GEMMs keep the heuristic's choice). Ignored on the CPU.
  bool autotune = true;
  // With autotune: also start from the choices shipped with the code for this device model and
  // library version (kernels/gemm/shipped_tuning.h: the H200's energy-ranked GEMM algorithms),
  // after the compile cache's own, which win. false: only what this machine measures or cached.
  bool shipped_tuning = true;
  // Gradient accumulation (kPipeline: its micro-batches): the step's batch (binding "batch", per rank) runs as this many
  // micro-batches of batch / micro_batches, each a forward + backward whose gradients are summed
  // (weighted by token counts: the same gradients as one pass over the whole batch), then one
  // optimizer update. Run still takes the whole batch. The data-parallel runtime runs it
  // (compiler/fsdp.h; also for kNone, on a group of one; captured as one CUDA graph like the
  // unaccumulated step). FSDP reduce-scatters
  // each micro-batch's gradients into the accumulated shards.
  int micro_batches = 1;
};

struct StepMetrics {
  float loss = 0;       // unscaled, also under kF16Mixed
  float grad_norm = 0;  // of the unscaled gradients, before clipping (non-finite on a skipped step)
  int64_t step = 0;     // optimizer updates done
  // kF16Mixed: the loss scale the next step uses, and whether the last step's update was skipped
  // (non-finite gradients). 1 and false otherwise.
  float loss_scale = 1;
  bool skipped = false;
};

class CompiledStep {
 public:
  // Waits for the queued steps before the step's memory is freed.
  virtual ~CompiledStep();
  // Enqueues one training step: copies `batch` (every graph input by name, host or device
  // tensors with the bound shapes) into the step's static input buffers (host tensors through
  // pinned staging buffers, compiler/input_staging.h), then runs forward, backward and the
  // optimizer. Does not synchronize the device. InvalidArgument naming a missing, unknown
  // or ill-shaped input.
  virtual absl::Status Run(const std::map<std::string, TensorView>& batch);
  // Waits for the last step and reads its loss, gradient norm and step counter.
  virtual absl::StatusOr<StepMetrics> ReadMetrics() const;
  // Sets the learning rate the next steps use (device memory the captured step reads).
  virtual absl::Status SetLearningRate(float lr);

  // Copies into / out of any source: parameters by model name, "opt.m.<param>",
  // "opt.v.<param>", "step" (updates done), "lr", and under kF16Mixed "loss_scale" (f32[]) and
  // "loss_scale.good_steps" (f32[]). `host` must match dtype and element count. Read also accepts
  // graph outputs ("loss", "grad_norm", "grad:<param>": under kF16Mixed the gradients of
  // loss_scale * loss, as the backward computed them) and "loss_scale.skipped" (f32[], 1 when the
  // last step was skipped). A bf16 or f16 value (the gradients under bf16_gradients) may also be
  // read into f32 host memory: it is widened.
  // Distributed steps take and give the FULL (global) tensors: Write keeps this rank's shard,
  // Read gathers the shards (collective: every rank calls it in the same order).
  virtual absl::Status Write(const std::string& name, const TensorView& host);
  virtual absl::Status Read(const std::string& name, const TensorView& host) const;
  // The device view of a source or output (valid while the step lives). NotFound names it.
  // Steps write it on executor().compute_stream() (a non-blocking stream): call
  // executor().Synchronize() before reading it another way (Read does).
  virtual absl::StatusOr<TensorView> View(const std::string& name) const;

  // Trainable parameters, in graph order.
  const std::vector<std::string>& parameter_names() const { return parameter_names_; }
  // True when Compile found the prepared training graph in the cache.
  bool cache_hit() const { return cache_hit_; }
  const Program& program() const { return *program_; }
  const graph::Graph& training_graph() const { return program_->graph; }
  Executor& executor() { return *executor_; }

  // Runs one step eagerly with per-step timestamps (a real training step: it updates the
  // weights) and returns its timeline; see compiler/trace.h.
  virtual absl::StatusOr<StepTrace> TraceStep(const std::map<std::string, TensorView>& batch);

  // Distributed steps: which strategy runs and why (the planner's explanation for kAuto, the
  // sharding plan's collectives); "" for a single device.
  const std::string& explanation() const { return explanation_; }
  // Which share of the global batch Run expects: data_ranks() shares, this rank's is data_rank().
  // Ranks with the same data_rank() take the same batch (tensor-parallel peers). (0, 1) on one
  // device; (rank, world size) for FSDP.
  int data_rank() const { return data_rank_; }
  int data_ranks() const { return data_ranks_; }

 protected:
  friend absl::StatusOr<std::unique_ptr<CompiledStep>> Compile(const graph::Graph&, const CompileOptions&);
  CompiledStep() = default;
  absl::Status CopyInputs(const std::map<std::string, TensorView>& batch);
  // For the distributed runtimes' schedules (compiler/fsdp.h, compiler/tensor_parallel.h): a step
  // on the communication stream that first waits for everything enqueued on the compute stream
  // (through `ready`), runs `body` there and records `done`; the compute stream is looked up when
  // the step runs, so the schedule may be built before the executor.
  Step CommStep(std::string name, graph::Phase phase, Event* ready, std::function<absl::Status(const Stream&)> body,
                Event* done);
  // A step that makes its stream wait for `done`.
  static Step WaitStep(std::string name, graph::Phase phase, const Event* done);
  absl::Status AddStepCounter();

  std::unique_ptr<Program> program_;
  std::unique_ptr<Executor> executor_;
  std::vector<std::string> parameter_names_;
  bool cache_hit_ = false;
  DeviceMemory one_;  // f32 1.0, added to "step" at the start of every step
  std::string explanation_;
  int data_rank_ = 0, data_ranks_ = 1;
  InputStaging staging_;  // pinned double buffers for host batches
};

// Compiles `graph`: a forward graph (with a floating scalar output options.loss and no
// optimizer nodes) or an already complete training graph (with adamw nodes and "update:"
// outputs, used as is). Optimizer state and the step counter start at zero; parameters are
// uninitialized until written. Errors: InvalidArgument for a bad graph or binding, Unimplemented
// for a strategy or an op the current build cannot run on the device (naming them).
absl::StatusOr<std::unique_ptr<CompiledStep>> Compile(const graph::Graph& graph, const CompileOptions& options);

// The least recompute whose plan fits `budget_bytes` (arena + state / state_shards; for
// options->strategy == kFsdp with state_shards > 1, or options->micro_batches > 1, PlanFsdpMemory's
// total per rank): none, then
// (options->offload_before_recompute) none with the fewest kept activations offloaded, then
// selective with SwiGLU recomputed in 0, 1, 2, ... layers, then full, then (FSDP over > 1 ranks)
// full with per-parameter collectives, then that with the fewest kept activations offloaded to host
// memory (options->offload_activations), then (one micro-batch) that with all of them offloaded and
// the gradient shards of the fewest units in host memory (options->fsdp_host_gradient_units). Sets
// options->recompute, options->recompute_swiglu_layers, options->fsdp_per_parameter_collectives,
// options->offload_activations and options->fsdp_host_gradient_units; returns the planned bytes.
// When nothing fits, the last (least memory) choice is set and its bytes returned. Plans only
// (allocates nothing).
absl::StatusOr<int64_t> ChooseRecompute(const graph::Graph& forward, int64_t budget_bytes, int state_shards,
                                        CompileOptions* options);
// A strategy whose runtime lives in a target above this one (context and pipeline parallelism):
// that target registers its compile function once (a static initializer; alwayslink), and Compile
// calls it for the strategy. Compile returns Unimplemented naming the target when none is linked.
using StrategyCompiler =
    std::function<absl::StatusOr<std::unique_ptr<CompiledStep>>(const graph::Graph&, const CompileOptions&)>;
bool RegisterStrategyCompiler(Strategy strategy, StrategyCompiler compile);

// The memory plan Compile would allocate at options.binding on options.device (arena and state
// sizes, steps per impl), allocating nothing: e.g. the 1b step's activation peak, and that every
// op has a CUDA kernel, checked on a machine without a GPU. Single-device (options.strategy is
// ignored): an FSDP rank's memory is PlanFsdpMemory's (compiler/distributed.h).
absl::StatusOr<PlannedMemory> PlanMemory(const graph::Graph& graph, const CompileOptions& options);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_COMPILE_H_
