// One training run as the `llama` binary performs it, from its flags: resolve the config (preset,
// config.json, Hugging Face directory or checkpoint), load data and tokenizer, build the Trainer,
// train with a progress line and per-step metrics until the step count or time budget, then
// validation loss, a text sample, a checkpoint and the loss curve. Only rank 0 prints and writes.
//
//   RunFlags f;  f.steps = 50;  f.name = "smoke";
//   SG_ASSIGN_OR_RETURN(RunSummary s, RunTraining(f));   // s.checkpoint == "runs/smoke/step_00000050"
//
// Outputs under `runs/<name>/` (relative to the working directory): step_<N>/ checkpoints (the last
// 3 kept), metrics.jsonl, loss.svg, and tokenizer.model when one was trained. A fresh run moves an
// existing runs/<name> aside to runs/<name>.previous first, so checkpoints of two runs never mix.
//
// Multi-rank runs (under //comm:launch) also start a JobLink (trainer/job_link.h): a lost, hung or
// lagging rank is reported by every survivor and the run exits non-zero. With
// --checkpoint_format=sharded every rank saves its own shards; --resume=auto reloads the newest
// checkpoint at whatever world size the job has now, which is how a `launch --max_restarts` job
// continues after losing a rank.
#ifndef SGTRAIN_TRAINER_RUN_H_
#define SGTRAIN_TRAINER_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sg::trainer {

// The binary's flags (llama_main.cc documents each); 0 / -1 / "" mean "the default".
struct RunFlags {
  std::string preset = "tiny";
  std::string hf_config;
  std::string init_from_hf;
  std::vector<std::string> data;
  std::string tokenizer = "bytes";
  std::string tokenizer_model;
  int sp_vocab = 2048;
  int64_t steps = 0;
  double time_budget = -1;
  int64_t batch = 0;
  int64_t seq = 0;
  double lr = 0;
  double min_lr = -1;
  int64_t warmup = -1;
  double grad_clip = 1.0;
  int64_t grad_accum = 1;
  double weight_decay = 0.1;
  double adam_eps = 1e-8;
  std::string strategy = "none";
  std::string mesh;
  int64_t micro_batches = 0;  // --strategy=pp: 0 = one sequence per micro-batch
  bool pp_fsdp = false;        // --strategy=pp --mesh=DPxPP: shard each stage over dp (FSDP)
  std::string recompute = "auto";  // auto, none, selective or full (TrainOptions::auto_recompute)
  double memory_budget_gib = 0;    // --recompute=auto's budget per GPU; 0: 90% of the GPU's memory
  int64_t lm_head_chunks = 1;      // the LM head in this many blocks of tokens (TrainOptions)
  // auto (bf16 where TrainOptions::bf16_gradients applies: bf16 precision, one device, no
  // accumulation), f32 or bf16
  std::string gradients = "auto";
  int64_t fsdp_host_gradient_units = 0;  // TrainOptions::fsdp_host_gradient_units
  std::string device = "auto";
  std::string precision;
  std::string name;
  std::string resume;  // "", "latest", "auto" (latest if any, else fresh) or a checkpoint directory
  int64_t checkpoint_every = 0;
  std::string checkpoint_format = "full";  // "full" or "sharded" (per-shard, trainer/sharded_save.h)
  double health_deadline_s = 30;       // multi-rank: heartbeat silence before a rank is reported; 0: off
  double straggler_deadline_s = 300;   // multi-rank: how long a rank may stay behind the others
  std::string inject_fault;            // tests: trainer/fault_injection.h
  int64_t eval_every = 0;
  int64_t eval_batches = 4;
  std::string metrics;
  uint64_t seed = 1;
  int64_t sample_tokens = 0;
  double temperature = 0.8;
  std::string prompt;
  bool quiet = false;  // tests: no progress line, header or sample on the console
};

struct RunSummary {
  int64_t first_step = 0;  // the step the run started from (non-zero when resumed)
  int64_t steps = 0;       // step reached
  double first_loss = 0;
  double last_loss = 0;
  double val_loss = 0;
  double tokens_per_s = 0;
  double train_seconds = 0;
  std::string run_dir;
  std::string checkpoint;
  std::string sample;
};

absl::StatusOr<RunSummary> RunTraining(const RunFlags& flags);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_RUN_H_
