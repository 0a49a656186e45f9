// `bazel run //trainer:llama`: trains a Llama. With no flags: the "tiny" preset on the CPU (or the
// GPU when there is one) for about two minutes on the default corpus with the byte tokenizer, then
// the validation loss, a text sample and a checkpoint under ./runs/tiny/.
//
//   bazel run //trainer:llama
//   bazel run //trainer:llama -- --resume                      # continue runs/tiny's latest checkpoint
//   bazel run //trainer:llama -- --tokenizer=sentencepiece --steps=500 --data=notes/
//   comm/launcher: launch --nproc=2 -- bazel-bin/trainer/llama --strategy=fsdp
//   # elastic: per-shard checkpoints; a lost rank is reported, the job restarts on the survivors
//   launch --nproc=4 --max_restarts=2 --min_nproc=2 --grace_s=75 -- bazel-bin/trainer/llama
//       --strategy=fsdp --checkpoint_format=sharded --checkpoint_every=100 --resume=auto   (one line)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "trainer/run.h"

ABSL_FLAG(std::string, preset, "tiny", "model preset: tiny, 124m, 1b or 7b");
ABSL_FLAG(std::string, hf_config, "", "a Hugging Face Llama config.json (replaces --preset)");
ABSL_FLAG(std::string, init_from_hf, "", "a Hugging Face Llama directory (config.json + model.safetensors) to start from");
ABSL_FLAG(std::vector<std::string>, data, {}, "text files/directories or llm.c .bin shards (default: Debian fortunes)");
ABSL_FLAG(std::string, tokenizer, "bytes", "bytes or sentencepiece");
ABSL_FLAG(std::string, tokenizer_model, "", "SentencePiece tokenizer.model to load (default: train one on the corpus)");
ABSL_FLAG(int, sp_vocab, 2048, "vocabulary size of a SentencePiece model trained on the corpus");
ABSL_FLAG(int64_t, steps, 0, "optimizer steps (0: as many as fit in --time_budget)");
ABSL_FLAG(double, time_budget, -1, "seconds of training; -1: 120 when --steps is not given, else no limit");
ABSL_FLAG(int64_t, batch, 0, "sequences per rank per micro-batch (0: the preset's default)");
ABSL_FLAG(int64_t, seq, 0, "sequence length (0: the preset's default)");
ABSL_FLAG(double, lr, 0, "peak learning rate (0: the preset's default)");
ABSL_FLAG(double, min_lr, -1, "final learning rate of the cosine decay (-1: lr / 10)");
ABSL_FLAG(int64_t, warmup, -1, "linear warm-up steps (-1: the preset's default)");
ABSL_FLAG(double, grad_clip, 1.0, "clip the global gradient norm to this (<= 0: off)");
ABSL_FLAG(int64_t, grad_accum, 1, "micro-batches per optimizer step");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW weight decay (matrices only)");
ABSL_FLAG(double, adam_eps, 1e-8, "AdamW's eps (added to the second moment's square root)");
ABSL_FLAG(std::string, strategy, "none", "distribution: none, fsdp, hybrid, tp, auto, cp (context parallel) or pp (pipeline)");
ABSL_FLAG(int64_t, micro_batches, 0, "--strategy=pp: micro-batches per step (0: one sequence each)");
ABSL_FLAG(bool, pp_fsdp, false,
          "--strategy=pp with --mesh=DPxPP: shard each stage's parameters and optimizer state over its dp replicas "
          "(FSDP inside the pipeline) instead of replicating them");
ABSL_FLAG(std::string, mesh, "", "device mesh for --strategy, e.g. 2x2");
ABSL_FLAG(std::string, recompute, "auto",
          "activation recompute: none, selective, full, or auto (the least that fits --memory_budget_gib; a single "
          "device or --strategy=fsdp; on the CPU: none)");
ABSL_FLAG(double, memory_budget_gib, 0, "--recompute=auto's memory per GPU (0: 90% of the GPU's memory)");
ABSL_FLAG(int64_t, lm_head_chunks, 1,
          "the LM head in this many blocks of tokens, so the [tokens, vocab] logits never exist whole (a single "
          "device; --recompute=auto plans with it; 1: off)");
ABSL_FLAG(std::string, gradients, "auto",
          "the matmul weights' gradients: bf16 (the values PyTorch's autocast gives, half the bytes; --precision=bf16, "
          "--strategy=none|fsdp|hybrid, --grad_accum=1; fsdp/hybrid reduce them in f32), f32, or auto: bf16 on one "
          "device, else f32");
ABSL_FLAG(int64_t, fsdp_host_gradient_units, 0,
          "--strategy=fsdp: AdamW deferred into the next step's forward, with the gradient shards of this many units "
          "(output layer first, then the last layers) in host memory between (0: off; --recompute=auto on a GPU "
          "chooses it under --memory_budget_gib)");
ABSL_FLAG(std::string, device, "auto", "auto (CUDA when present), cpu or cuda");
ABSL_FLAG(std::string, precision, "", "f32, bf16 or f16 (f16: dynamic loss scaling; default: f32 on the CPU, bf16 on CUDA)");
ABSL_FLAG(std::string, name, "", "run name: outputs go to ./runs/<name> (default: the preset)");
ABSL_FLAG(std::string, resume, "", "'latest' (bare --resume) for the run's latest checkpoint, 'auto' for the latest "
          "if there is one (else a fresh run: what a restarting launcher needs), or a checkpoint path");
ABSL_FLAG(int64_t, checkpoint_every, 0, "save a checkpoint every N steps (0: only at the end)");
ABSL_FLAG(std::string, checkpoint_format, "full",
          "full (one directory Hugging Face can load) or sharded (each rank writes its own shards; loads at any "
          "world size)");
ABSL_FLAG(double, health_deadline_s, 30,
          "multi-rank: a rank silent this long is reported (rank, operation, sequence number) and the job stops; "
          "0: off");
ABSL_FLAG(double, straggler_deadline_s, 300, "multi-rank: how long a rank may stay behind the others' collectives");
ABSL_FLAG(std::string, inject_fault, "",
          "tests: kill_in_step|stop_in_step|sleep_in_step|kill_in_save:<rank>:<step> (first launcher attempt only)");
ABSL_FLAG(int64_t, eval_every, 0, "validation loss every N steps (0: only at the end)");
ABSL_FLAG(int64_t, eval_batches, 4, "validation batches per evaluation");
ABSL_FLAG(std::string, metrics, "", "JSON Lines metrics file (default: runs/<name>/metrics.jsonl)");
ABSL_FLAG(uint64_t, seed, 1, "seed for weights, data order and sampling");
ABSL_FLAG(int64_t, sample_tokens, 0, "tokens to generate at the end (0: 200 bytes' worth)");
ABSL_FLAG(double, temperature, 0.8, "sampling temperature (<= 0: greedy)");
ABSL_FLAG(std::string, prompt, "", "text the sample continues (default: start of a document)");

namespace {

// Abseil string flags need a value; a bare `--resume` means the run's latest checkpoint.
std::vector<char*> RewriteBareResume(int argc, char** argv) {
  static char kLatest[] = "--resume=latest";
  std::vector<char*> out(argv, argv + argc);
  for (char*& a : out) {
    if (std::string(a) == "--resume") a = kLatest;
  }
  return out;
}

// --help: this binary's flags with their defaults.
void PrintHelp() {
  std::fprintf(stderr, "%s\n\nflags:\n", std::string(absl::ProgramUsageMessage()).c_str());
  std::vector<std::pair<std::string, const absl::CommandLineFlag*>> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename().find("trainer/llama_main") != std::string::npos) flags.push_back({std::string(name), flag});
  }
  std::sort(flags.begin(), flags.end());
  for (const auto& [name, flag] : flags) {
    std::fprintf(stderr, "  --%s (default '%s')\n      %s\n", name.c_str(), flag->DefaultValue().c_str(),
                 flag->Help().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a Llama model. With no flags: the tiny preset for ~2 minutes on the default corpus.\n"
      "  bazel run //trainer:llama [-- --preset=tiny --steps=N --resume ...]");
  std::vector<char*> args = RewriteBareResume(argc, argv);
  for (char* a : args) {
    if (std::string(a) == "--help" || std::string(a) == "-h") {
      PrintHelp();
      return 0;
    }
  }
  std::vector<char*> rest = absl::ParseCommandLine(int(args.size()), args.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "error: unexpected argument '%s' (flags are --name=value; see --help)\n", rest[1]);
    return 2;
  }
  // `bazel run` starts us in the runfiles tree; outputs and relative paths belong to the user's
  // directory.
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY"); wd != nullptr && *wd != '\0') {
    if (chdir(wd) != 0) {
      std::fprintf(stderr, "error: cannot enter BUILD_WORKING_DIRECTORY %s\n", wd);
      return 1;
    }
  }

  sg::trainer::RunFlags f;
  f.preset = absl::GetFlag(FLAGS_preset);
  f.hf_config = absl::GetFlag(FLAGS_hf_config);
  f.init_from_hf = absl::GetFlag(FLAGS_init_from_hf);
  f.data = absl::GetFlag(FLAGS_data);
  f.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  f.tokenizer_model = absl::GetFlag(FLAGS_tokenizer_model);
  f.sp_vocab = absl::GetFlag(FLAGS_sp_vocab);
  f.steps = absl::GetFlag(FLAGS_steps);
  f.time_budget = absl::GetFlag(FLAGS_time_budget);
  f.batch = absl::GetFlag(FLAGS_batch);
  f.seq = absl::GetFlag(FLAGS_seq);
  f.lr = absl::GetFlag(FLAGS_lr);
  f.min_lr = absl::GetFlag(FLAGS_min_lr);
  f.warmup = absl::GetFlag(FLAGS_warmup);
  f.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  f.grad_accum = absl::GetFlag(FLAGS_grad_accum);
  f.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  f.adam_eps = absl::GetFlag(FLAGS_adam_eps);
  f.strategy = absl::GetFlag(FLAGS_strategy);
  f.mesh = absl::GetFlag(FLAGS_mesh);
  f.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  f.pp_fsdp = absl::GetFlag(FLAGS_pp_fsdp);
  f.recompute = absl::GetFlag(FLAGS_recompute);
  f.memory_budget_gib = absl::GetFlag(FLAGS_memory_budget_gib);
  f.lm_head_chunks = absl::GetFlag(FLAGS_lm_head_chunks);
  f.gradients = absl::GetFlag(FLAGS_gradients);
  f.fsdp_host_gradient_units = absl::GetFlag(FLAGS_fsdp_host_gradient_units);
  f.device = absl::GetFlag(FLAGS_device);
  f.precision = absl::GetFlag(FLAGS_precision);
  f.name = absl::GetFlag(FLAGS_name);
  f.resume = absl::GetFlag(FLAGS_resume);
  f.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  f.checkpoint_format = absl::GetFlag(FLAGS_checkpoint_format);
  f.health_deadline_s = absl::GetFlag(FLAGS_health_deadline_s);
  f.straggler_deadline_s = absl::GetFlag(FLAGS_straggler_deadline_s);
  f.inject_fault = absl::GetFlag(FLAGS_inject_fault);
  f.eval_every = absl::GetFlag(FLAGS_eval_every);
  f.eval_batches = absl::GetFlag(FLAGS_eval_batches);
  f.metrics = absl::GetFlag(FLAGS_metrics);
  f.seed = absl::GetFlag(FLAGS_seed);
  f.sample_tokens = absl::GetFlag(FLAGS_sample_tokens);
  f.temperature = absl::GetFlag(FLAGS_temperature);
  f.prompt = absl::GetFlag(FLAGS_prompt);

  absl::StatusOr<sg::trainer::RunSummary> s = sg::trainer::RunTraining(f);
  if (!s.ok()) {
    std::fprintf(stderr, "\nerror: %s\n", std::string(s.status().message()).c_str());
    return 1;
  }
  return 0;
}
