// The training loop's state machine: one compiled training step (compiler/compile.h) plus the
// data loader, the learning-rate schedule, checkpoints and a forward-only path for validation and
// sampling. The `llama` binary (llama_main.cc) drives it; tests drive it the same way.
//
//   TrainOptions o;  o.config = LlamaPreset("tiny").value();  o.total_steps = 100;
//   SG_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, split));
//   while (t->step() < o.total_steps) { SG_ASSIGN_OR_RETURN(StepResult r, t->Step()); }
//   SG_ASSIGN_OR_RETURN(double val, t->ValidationLoss(/*max_batches=*/4));
//   SG_RETURN_IF_ERROR(t->Save(StepDir("runs/x", t->step())));
//
// Determinism: weights come from InitialWeights(config, seed), batches from a DataLoader seeded
// with `seed`, and the compiled CPU step is deterministic, so a run resumed from a checkpoint
// (weights, AdamW moments and step counter, data position, RNG) continues bit-exactly at the same
// world size.
//
// Gradient accumulation: `grad_accum` k compiles the step with CompileOptions::micro_batches = k
// over a k times larger batch: k forward + backward passes of `batch` sequences accumulate f32
// gradients (weighted so the update equals one pass over all k * batch * seq tokens), then one
// clip + AdamW. Activation memory is that of one micro-batch (compiler/fsdp.h runs it; on a
// single device eagerly, without a CUDA graph).
//
// Forward-only path: ValidationLoss and Sample run the same model's forward graph with a "logits"
// output (BuildEvalForward) through compiler::CompileForward (compiler/eval_step.h) on the
// training device and precision, with the weights copied from the training step at each call.
// The eval steps are compiled on first use: one at [batch, seq] for validation and one at
// [1, seq] for sampling (a shorter context is left-aligned and right-padded; causal attention
// makes the padding invisible to the last real position). Forward() keeps the f64 reference
// interpreter (graph/interpreter.h), for tests.
#ifndef SGTRAIN_TRAINER_TRAIN_LOOP_H_
#define SGTRAIN_TRAINER_TRAIN_LOOP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "compiler/eval_step.h"
#include "graph/interpreter.h"
#include "graph/ir.h"
#include "sharding/placement.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/llama_config.h"
#include "trainer/data/data_loader.h"
#include "trainer/safetensors/safetensors.h"

namespace sg::trainer {

struct TrainOptions {
  LlamaConfig config;
  int64_t batch = 8;  // sequences per rank per micro-batch
  int64_t seq = 128;
  int64_t grad_accum = 1;
  // Length of the schedule (warm-up + cosine decay to min_lr); Step() may run past it at min_lr.
  int64_t total_steps = 1000;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = 20;
  double grad_clip = 1.0;  // <= 0: no clipping
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;  // AdamW's
  uint64_t seed = 1;
  Device device = Device::Cpu();
  compiler::Precision precision = compiler::Precision::kF32;
  compiler::LossScaleOptions loss_scale;  // f16: dynamic loss scaling (initial scale, growth, backoff)
  compiler::Strategy strategy = compiler::Strategy::kNone;
  std::vector<int64_t> mesh;
  int micro_batches = 1;  // pipeline (Strategy::kPipeline): micro-batches per step
  bool pipeline_fsdp = false;  // pipeline on a {dp, pp} mesh: stages sharded over dp (CompileOptions)
  // Activation recompute: `recompute`, or with auto_recompute the least recompute whose planned
  // memory per GPU fits memory_budget_bytes (compiler::ChooseRecompute; a single device or FSDP,
  // gradient accumulation included; other strategies keep `recompute`). A budget of 0 is 90% of
  // the GPU's memory; on the CPU, auto means none.
  compiler::RecomputePolicy recompute = compiler::RecomputePolicy::kNone;
  bool auto_recompute = false;
  int64_t memory_budget_bytes = 0;
  // The LM head in this many blocks of tokens (compiler::CompileOptions::lm_head_chunks): the
  // [tokens, vocab] logits never exist whole (at a 128256 vocabulary and 16384 tokens, 4 GiB of
  // bf16 logits become one block's). A single device; 1: off.
  int lm_head_chunks = 1;
  // The matmul weights' gradients in bf16 (compiler::CompileOptions::bf16_gradients: the values
  // PyTorch's autocast stores in its f32 .grad, in half the bytes; FSDP / HSDP: bf16 buckets
  // reduce-scattered in f32 into the f32 shards). bf16 precision, strategy none, fsdp or hybrid,
  // grad_accum 1.
  bool bf16_gradients = false;
  // FSDP: AdamW deferred into the next step's forward, the gradient shards of this many units in
  // host memory between (compiler::CompileOptions::fsdp_host_gradient_units); auto_recompute's
  // plan on a GPU replaces it. 0: off.
  int fsdp_host_gradient_units = 0;
  int rank = 0;
  int world_size = 1;
  std::string cache_dir;  // the compiler's cache; "" = none
};

// The learning rate for optimizer update number `step` (0-based): linear warm-up from lr/warmup
// to lr over `warmup` updates, then cosine decay to min_lr at total_steps, min_lr afterwards.
double ScheduledLearningRate(int64_t step, const TrainOptions& o);

// One tensor of a per-shard checkpoint as this rank holds it: its global layout and this rank's
// piece (an f32 host copy).
struct LocalShard {
  std::string name;  // Hugging Face name; AdamW moments "<name>.exp_avg" / "<name>.exp_avg_sq"
  sharding::TensorSpec spec;
  Tensor local;
};

struct StepResult {
  int64_t step = 0;  // updates done after this one
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;  // tokens in this update over all ranks
  // f16 mixed precision: the loss scale the next step uses, and whether this step's update was
  // skipped (non-finite gradients; the learning-rate schedule still advances, as with PyTorch's
  // GradScaler). 1 and false otherwise.
  double loss_scale = 1;
  bool skipped = false;
};

class Trainer {
 public:
  // Validates the options, compiles the step, creates the data loader over `data.train`
  // (sharded by rank) and writes InitialWeights(config, seed). Errors name the option or the
  // compiler's reason (e.g. Unimplemented for a strategy the compiler cannot run yet).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainOptions& options, const TokenSplit& data);

  // Replaces the weights with `hf` (Hugging Face names, host tensors of any float dtype that
  // converts to f32), after checking every name and shape against the config (the error names
  // `source`, the tensor, the shape found and the shape expected).
  absl::Status SetWeights(const std::vector<NamedTensor>& hf, absl::string_view source);
  // The current weights under Hugging Face names (f32 host tensors, HfLlamaParameters order).
  absl::StatusOr<std::vector<NamedTensor>> Weights() const;

  // Restores a checkpoint saved by Save(): weights, AdamW moments, step counter, data position and
  // RNG. FailedPrecondition when it was saved at another world size (resharding is not supported
  // yet) or lacks an optimizer tensor (naming it).
  absl::Status Restore(const Checkpoint& ckpt);
  // Saves a checkpoint directory atomically (checkpoint.h). `notes` go to training_state.json's
  // extra, `extra_files` are copied in (e.g. the tokenizer model). Distributed runs: every rank
  // must call it (reading sharded weights is collective); only the one with `write` set writes.
  absl::Status Save(const std::string& dir, const std::map<std::string, std::string>& notes = {},
                    const std::map<std::string, std::string>& extra_files = {}, bool write = true) const;

  // Per-shard checkpoints (trainer/checkpoint/sharded.h, written by trainer/sharded_save.h): this
  // rank's pieces of every parameter and AdamW moment, under the layout the compiled step keeps
  // them in (one world rank: replicated; FSDP: S(0) over the world; HYBRID_SHARD: [R, S(0)] over
  // the mesh). Not collective. Unimplemented for a strategy whose layout is not one of these
  // (e.g. tensor parallelism: save the full format instead).
  absl::StatusOr<std::vector<LocalShard>> LocalShards() const;
  // The step counter, data position, RNG and world size a checkpoint records (`notes` go to extra).
  TrainingState Progress(const std::map<std::string, std::string>& notes) const;
  // Restores a per-shard checkpoint saved at any world size: this rank's pieces are read from the
  // shards they overlap (LoadShards verifies each shard's hash and names a corrupted one), then
  // the progress (`state`, from the manifest) as Restore does. Not collective.
  absl::Status RestoreShards(const std::string& dir, const TrainingState& state);

  // One optimizer update: sets the scheduled learning rate, feeds the next batch, runs the
  // compiled step and reads its metrics.
  absl::StatusOr<StepResult> Step();

  // Mean cross-entropy over the first `max_batches` batches of `data.val` (in stream order, the
  // same windows every call), through the forward-only path.
  absl::StatusOr<double> ValidationLoss(int64_t max_batches) const;
  // Continues `prompt` by `n` tokens: greedy when temperature <= 0, else sampling from
  // softmax(logits / temperature) with the trainer's RNG. The context is the last `seq` tokens.
  absl::StatusOr<std::vector<int32_t>> Sample(const std::vector<int32_t>& prompt, int64_t n, double temperature);
  // Loss and logits of the f64 reference interpreter on `tokens`/`targets` (i32 [b, s]), for tests.
  absl::StatusOr<std::pair<double, std::vector<double>>> Forward(const Tensor& tokens, const Tensor& targets) const;

  // Changes the schedule's length (a time-budgeted run sets it once the first steps are timed).
  void SetTotalSteps(int64_t n) { options_.total_steps = n; }

  int64_t step() const { return step_; }
  DataPosition data_position() const { return loader_->position(); }
  const TrainOptions& options() const { return options_; }
  int64_t tokens_per_step() const;
  compiler::CompiledStep& compiled() { return *compiled_; }
  // What the step recomputes and, when auto_recompute planned it, the planned memory against the
  // budget ("selective (SwiGLU in 3 of the layers), 31.59 GiB planned of 31.75"); "none" otherwise.
  const std::string& memory_plan() const { return memory_plan_; }

 private:
  Trainer() = default;
  absl::StatusOr<graph::Feeds> WeightFeeds() const;
  // Step counter, data seed and position, RNG: the part of Restore that follows the tensors.
  absl::Status RestoreProgress(const TrainingState& state);
  // The layout LocalShards / RestoreShards use for a parameter of `shape` (train_loop_shards.cc).
  absl::StatusOr<sharding::TensorSpec> ShardLayout(const Shape& shape) const;
  // The eval step at [batch, seq] (compiled on first use) holding the current weights.
  absl::StatusOr<compiler::EvalStep*> EvalStepWithWeights(int64_t batch) const;

  TrainOptions options_;
  std::string memory_plan_;
  TokenSplit data_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<compiler::CompiledStep> compiled_;
  graph::Graph eval_graph_;
  mutable std::map<int64_t, std::unique_ptr<compiler::EvalStep>> eval_steps_;  // by batch size
  std::mt19937_64 rng_;
  int64_t step_ = 0;
};

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_TRAIN_LOOP_H_
