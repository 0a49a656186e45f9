#include "trainer/run.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "comm/env.h"
#include "compiler/dist_context.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/fault_injection.h"
#include "trainer/io/file_io.h"
#include "trainer/job_link.h"
#include "trainer/progress/loss_curve_svg.h"
#include "trainer/progress/metrics_log.h"
#include "trainer/progress/progress_bar.h"
#include "trainer/sharded_save.h"
#include "trainer/train_data.h"
#include "trainer/train_loop.h"

namespace sg::trainer {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool Exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

absl::StatusOr<compiler::Strategy> ParseStrategy(const std::string& s) {
  if (s == "none") return compiler::Strategy::kNone;
  if (s == "fsdp") return compiler::Strategy::kFsdp;
  if (s == "hybrid") return compiler::Strategy::kHybridShard;
  if (s == "tp") return compiler::Strategy::kTensorParallel;
  if (s == "auto") return compiler::Strategy::kAuto;
  if (s == "cp") return compiler::Strategy::kContextParallel;
  if (s == "pp") return compiler::Strategy::kPipeline;
  return absl::InvalidArgumentError(
      absl::StrCat("--strategy: expected none, fsdp, hybrid, tp, auto, cp or pp, found '", s, "'"));
}

absl::StatusOr<std::vector<int64_t>> ParseMesh(const std::string& s) {
  std::vector<int64_t> mesh;
  if (s.empty()) return mesh;
  for (absl::string_view part : absl::StrSplit(s, 'x')) {
    int64_t d;
    if (!absl::SimpleAtoi(part, &d) || d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--mesh: expected sizes like 2x2, found '", s, "'"));
    }
    mesh.push_back(d);
  }
  return mesh;
}

// Under a launcher each process takes the GPU of its local rank (LOCAL_RANK or the like), so the
// ranks of one host do not share a device; a single process takes GPU 0.
absl::StatusOr<Device> LocalCudaDevice() {
  absl::StatusOr<comm::RankInfo> info = comm::RankInfoFromEnv();
  const int local = info.ok() ? info->local_rank : 0;
  const int count = CudaDeviceCount();
  if (local >= count) {
    return absl::FailedPreconditionError(absl::StrCat("--device=cuda: local rank ", local, " needs GPU ", local,
                                                      " but this host has ", count));
  }
  return Device::Cuda(local);
}

absl::StatusOr<Device> ParseDevice(const std::string& s) {
  if (s == "cpu") return Device::Cpu();
  if (s == "cuda") {
    if (!CudaAvailable()) return absl::FailedPreconditionError("--device=cuda: no CUDA device is available");
    return LocalCudaDevice();
  }
  if (s == "auto") return CudaAvailable() ? LocalCudaDevice() : absl::StatusOr<Device>(Device::Cpu());
  return absl::InvalidArgumentError(absl::StrCat("--device: expected auto, cpu or cuda, found '", s, "'"));
}

// Training defaults per model size; the tiny ones are tuned for two CPU cores and two minutes.
struct Recipe {
  int64_t batch, seq, warmup;
  double lr;
};
Recipe DefaultRecipe(const LlamaConfig& c) {
  if (ParameterCount(c) < 5'000'000) return {8, 128, 30, 3e-3};
  if (ParameterCount(c) < 500'000'000) return {8, 1024, 200, 6e-4};
  return {4, 2048, 500, 3e-4};
}

// Reads a number the checkpoint's notes recorded, or `fallback`.
double Note(const Checkpoint& c, const std::string& key, double fallback) {
  auto it = c.state.extra.find(key);
  double v;
  return it != c.state.extra.end() && absl::SimpleAtod(it->second, &v) ? v : fallback;
}

// The schedule's length a resumed run continues (its checkpoint's note), or 0 without one or when
// the checkpoint is already at or past it.
int64_t ResumedTotalSteps(const Checkpoint* r) {
  const int64_t total = r ? int64_t(Note(*r, "total_steps", 0)) : 0;
  return r != nullptr && total > r->state.step ? total : 0;
}

struct Setup {
  LlamaConfig config;
  std::string run_dir;
  std::unique_ptr<Checkpoint> resume;     // the checkpoint to continue (per-shard: no tensors)
  std::string resume_dir;
  bool resume_sharded = false;
  std::unique_ptr<Checkpoint> hf_init;    // Hugging Face weights to start from
};

absl::StatusOr<Setup> ResolveRun(const RunFlags& f) {
  Setup s;
  const bool from_hf = !f.init_from_hf.empty();
  if (!f.hf_config.empty()) {
    SG_ASSIGN_OR_RETURN(s.config, ReadHfConfig(f.hf_config));
  } else if (from_hf) {
    SG_ASSIGN_OR_RETURN(s.config, ReadHfConfig(JoinPath(f.init_from_hf, kConfigFile)));
  } else {
    SG_ASSIGN_OR_RETURN(s.config, LlamaPreset(f.preset));
  }
  const std::string name = !f.name.empty() ? f.name : (!f.hf_config.empty() || from_hf) ? "hf" : f.preset;
  s.run_dir = JoinPath("runs", name);
  if (from_hf) {
    SG_ASSIGN_OR_RETURN(Checkpoint c, LoadHfModel(f.init_from_hf));
    s.hf_init = std::make_unique<Checkpoint>(std::move(c));
  }
  if (!f.resume.empty()) {
    std::string dir = f.resume;
    if (dir == "latest" || dir == "auto") {
      absl::StatusOr<std::string> latest = FindLatestTrainerCheckpoint(s.run_dir);
      if (!latest.ok() && dir == "auto") return s;  // nothing saved yet: a fresh run
      if (!latest.ok()) {
        return absl::NotFoundError(absl::StrCat("--resume: no checkpoint under ", s.run_dir,
                                                " (run without --resume first, or pass --resume=<checkpoint dir>)"));
      }
      dir = *latest;
    }
    s.resume_sharded = IsShardedCheckpoint(dir);
    SG_ASSIGN_OR_RETURN(Checkpoint c, s.resume_sharded ? ReadTrainerShardState(dir) : LoadCheckpoint(dir));
    // The checkpoint defines the model; a config.json given explicitly must agree with it.
    if (!f.hf_config.empty() && c.config != s.config) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/", kConfigFile, ": the checkpoint's model (",
                                                     LlamaConfigToString(c.config), ") differs from ", f.hf_config,
                                                     " (", LlamaConfigToString(s.config), ")"));
    }
    s.config = c.config;
    s.resume = std::make_unique<Checkpoint>(std::move(c));
    s.resume_dir = dir;
    s.run_dir = DirName(dir);
  }
  return s;
}

absl::StatusOr<TrainingData> LoadData(const RunFlags& f, const Setup& s, const std::string& run_dir) {
  DataOptions d;
  d.paths = f.data;
  d.tokenizer = f.tokenizer;
  d.tokenizer_model = f.tokenizer_model;
  d.sp_vocab = f.sp_vocab;
  d.out_dir = run_dir;
  d.vocab_size = s.config.vocab_size;
  if (s.resume != nullptr) {
    auto it = s.resume->extra_files.find("tokenizer.model");
    if (it != s.resume->extra_files.end()) {
      d.tokenizer = "sentencepiece";
      d.tokenizer_model = it->second;
    }
  }
  return LoadTrainingData(d);
}

// The preset's vocabulary follows the tokenizer (a trained SentencePiece model); a given
// config.json must already cover it.
absl::Status FitVocabulary(const RunFlags& f, const TrainingData& data, Setup& s) {
  if (data.tokenizer == nullptr) return absl::OkStatus();
  const int64_t v = data.tokenizer->vocab_size();
  const bool preset = f.hf_config.empty() && f.init_from_hf.empty() && s.resume == nullptr;
  if (preset && s.config.vocab_size != v) {
    s.config.vocab_size = v;
    s.config.bos_token_id = data.tokenizer->bos_id();
    s.config.eos_token_id = data.tokenizer->eos_id();
  }
  if (v > s.config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("config vocab_size is ", s.config.vocab_size, " but the tokenizer (",
                                                   data.tokenizer->Describe(), ") produces ids up to ", v - 1));
  }
  return absl::OkStatus();
}

// Model FLOPs per token of a training step (forward + backward): 6 per weight plus attention.
double FlopsPerToken(const LlamaConfig& c, int64_t seq) {
  return 6.0 * double(ParameterCount(c) - c.vocab_size * c.dim) + 6.0 * double(c.n_layers * seq * c.dim);
}

int64_t MemoryBytes(Device d) {
  if (d.is_cuda()) {
    absl::StatusOr<Allocator*> a = AllocatorFor(d);
    return a.ok() ? (*a)->PeakBytes() : -1;
  }
  return CurrentRssBytes();
}

// --recompute and --memory_budget_gib as TrainOptions' auto_recompute, recompute and
// memory_budget_bytes.
struct RecomputeChoice {
  bool automatic = false;
  compiler::RecomputePolicy policy = compiler::RecomputePolicy::kNone;
  int64_t budget_bytes = 0;
};
absl::StatusOr<RecomputeChoice> ParseRecompute(const RunFlags& f) {
  RecomputeChoice c;
  if (f.recompute == "auto") {
    c.automatic = true;
  } else if (f.recompute == "none" || f.recompute == "selective" || f.recompute == "full") {
    c.policy = f.recompute == "none"        ? compiler::RecomputePolicy::kNone
               : f.recompute == "selective" ? compiler::RecomputePolicy::kSelective
                                            : compiler::RecomputePolicy::kFull;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--recompute: expected auto, none, selective or full, found '", f.recompute, "'"));
  }
  if (!(f.memory_budget_gib >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--memory_budget_gib: expected >= 0, found ", f.memory_budget_gib));
  }
  c.budget_bytes = int64_t(f.memory_budget_gib * double(int64_t(1) << 30));
  return c;
}

// Makes the run directory: a fresh run (no checkpoint to resume) first moves an earlier run's
// non-empty directory aside to <dir>.previous (the lead rank only).
absl::Status PrepareRunDir(const Setup& s, bool lead, bool talk) {
  // A fresh run never mixes its checkpoints with an earlier run's. An empty directory holds
  // nothing to keep: it may be one another rank of this job has just made, which must not move.
  const auto empty_dir = [](const std::string& dir) {
    std::error_code ec;
    return std::filesystem::is_directory(dir, ec) && std::filesystem::is_empty(dir, ec);
  };
  if (lead && s.resume == nullptr && Exists(s.run_dir) && !empty_dir(s.run_dir)) {
    const std::string aside = s.run_dir + ".previous";
    SG_RETURN_IF_ERROR(RemoveAll(aside));
    if (std::rename(s.run_dir.c_str(), aside.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot move the earlier run ", s.run_dir, " aside to ", aside));
    }
    if (talk) std::fprintf(stderr, "note: moved the earlier run in %s to %s\n", s.run_dir.c_str(), aside.c_str());
  }
  // The lead may be moving an earlier run aside right now (between its rename and its mkdir the
  // name is briefly absent): other ranks retry for up to a second.
  absl::Status made = MakeDirectories(s.run_dir);
  for (int attempt = 0; !made.ok() && !lead && attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    made = MakeDirectories(s.run_dir);
  }
  SG_RETURN_IF_ERROR(made);
  return absl::OkStatus();
}

// The trainer's options from the flags, the resumed checkpoint's notes (for what the flags leave
// unset) and the model's default recipe.
absl::StatusOr<TrainOptions> MakeTrainOptions(const RunFlags& f, const Setup& s, Device device,
                                              compiler::Strategy strategy, const std::vector<int64_t>& mesh,
                                              const RecomputeChoice& recompute, int rank, int world) {
  const Recipe recipe = DefaultRecipe(s.config);
  const Checkpoint* r = s.resume.get();
  TrainOptions o;
  o.config = s.config;
  o.batch = f.batch > 0 ? f.batch : int64_t(r ? Note(*r, "batch", recipe.batch) : recipe.batch);
  o.seq = f.seq > 0 ? f.seq : int64_t(r ? Note(*r, "seq", recipe.seq) : std::min(recipe.seq, s.config.max_seq_len));
  o.grad_accum = f.grad_accum > 1 ? f.grad_accum : int64_t(r ? Note(*r, "grad_accum", 1) : 1);
  o.lr = f.lr > 0 ? f.lr : (r ? Note(*r, "lr", recipe.lr) : recipe.lr);
  o.min_lr = f.min_lr >= 0 ? f.min_lr : (r ? Note(*r, "min_lr", o.lr / 10) : o.lr / 10);
  o.warmup = f.warmup >= 0 ? f.warmup : int64_t(r ? Note(*r, "warmup", recipe.warmup) : recipe.warmup);
  o.grad_clip = f.grad_clip;
  o.weight_decay = f.weight_decay;
  o.eps = f.adam_eps;
  o.seed = f.seed;
  o.device = device;
  o.precision = (f.precision == "bf16" || (f.precision.empty() && device.is_cuda())) ? compiler::Precision::kBF16Mixed
                                                                                     : compiler::Precision::kF32;
  if (f.precision == "f16") o.precision = compiler::Precision::kF16Mixed;  // dynamic loss scaling
  if (!f.precision.empty() && f.precision != "bf16" && f.precision != "f16" && f.precision != "f32") {
    return absl::InvalidArgumentError(absl::StrCat("--precision: expected f32, bf16 or f16, found '", f.precision, "'"));
  }
  o.auto_recompute = recompute.automatic;
  o.recompute = recompute.policy;
  o.memory_budget_bytes = recompute.budget_bytes;
  o.lm_head_chunks = int(f.lm_head_chunks);
  if (f.gradients != "auto" && f.gradients != "f32" && f.gradients != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--gradients: expected auto, f32 or bf16, found '", f.gradients, "'"));
  }
  o.bf16_gradients = f.gradients == "bf16" ||
                     (f.gradients == "auto" && strategy == compiler::Strategy::kNone && o.grad_accum == 1 &&
                      o.precision == compiler::Precision::kBF16Mixed);
  o.fsdp_host_gradient_units = int(f.fsdp_host_gradient_units);
  o.strategy = strategy;
  o.mesh = mesh;
  o.rank = rank;
  o.world_size = world;
  // Context, pipeline and tensor parallel ranks share one batch: the data is sharded over the
  // data-parallel dim only (the first dim of a {dp, cp}, {dp, pp} or {dp, tp} mesh).
  if (strategy == compiler::Strategy::kContextParallel || strategy == compiler::Strategy::kPipeline ||
      strategy == compiler::Strategy::kTensorParallel) {
    const int cut = std::max(1, mesh.empty() ? world : int(mesh.back()));
    o.world_size = world / cut;
    o.rank = rank / cut;
  }
  if (strategy == compiler::Strategy::kPipeline) {
    o.micro_batches = int(f.micro_batches > 0 ? f.micro_batches : o.batch * o.grad_accum);
    o.pipeline_fsdp = f.pp_fsdp;
  }
  // Until the second step is timed, a time-budgeted run assumes a long schedule (the warm-up
  // does not depend on it).
  const int64_t resumed_total = ResumedTotalSteps(r);
  o.total_steps = f.steps > 0 ? f.steps : (resumed_total > 0 ? resumed_total : 1'000'000);
  return o;
}

// What the lead rank prints before the first step.
void PrintRunHeader(const Setup& s, const TrainOptions& o, Trainer& t, const TrainingData& data, double budget,
                    int world) {
  const Checkpoint* r = s.resume.get();
  std::fprintf(stderr, "model   : Llama %s, %.2fM parameters\n", LlamaConfigToString(o.config).c_str(),
               double(ParameterCount(o.config)) / 1e6);
  std::fprintf(stderr, "data    : %s\n", data.description.c_str());
  std::fprintf(stderr, "training: %s, %s, batch %ld x seq %ld x accum %ld x ranks %d = %ld tokens/step, lr %g -> %g "
               "(warm-up %ld, cosine)%s\n", o.device.ToString().c_str(),
               o.precision == compiler::Precision::kF32 ? "f32"
               : o.precision == compiler::Precision::kF16Mixed ? "f16 mixed (loss scaling)"
               : o.bf16_gradients                                 ? "bf16 mixed (bf16 weight gradients)"
                                                                  : "bf16 mixed", long(o.batch), long(o.seq),
               long(o.grad_accum), o.world_size, long(t.tokens_per_step()), o.lr, o.min_lr, long(o.warmup),
               budget > 0 ? absl::StrFormat(", time budget %.0f s", budget).c_str() : "");
  std::fprintf(stderr, "recompute: %s\n", t.memory_plan().c_str());
  const std::string& how = t.compiled().explanation();
  if (!how.empty()) std::fprintf(stderr, "step    : %s\n", how.c_str());
  if (r != nullptr) {
    std::fprintf(stderr, "resumed : step %ld from %s (%s, saved on %d ranks, now %d)\n", long(t.step()),
                 s.resume_dir.c_str(), s.resume_sharded ? "per-shard" : "full", r->state.world_size, world);
  }
  std::fprintf(stderr, "outputs : %s\n", s.run_dir.c_str());
}

// One training run: the state its steps share and the steps, which Train takes in order. Members
// are declared in the order the run makes them, so that they are destroyed in the reverse order:
// the metrics log and progress line before the trainer, the trainer before its data and options.
struct TrainingRun {
  TrainingRun(const RunFlags& flags, std::unique_ptr<JobLink>& job_link) : f(flags), link(job_link) {}

  // Set-up: the run resolved and the flags parsed, the run directory made, the data loaded and the
  // trainer's options chosen.
  absl::Status SetUp();
  // The trainer, the job link of a multi-rank run, and the weights or resumed state it starts from.
  absl::Status StartTrainer();
  // The header, the metrics log and the progress line.
  absl::Status OpenOutputs();
  // Steps until the schedule's end or the time budget, then the training part of the summary.
  absl::Status TrainSteps();
  // A step's metrics (and validation loss) to the log, the progress line and a periodic checkpoint.
  absl::Status RecordStep(const StepResult& step, double tps, double elapsed);
  // The end: validation loss, a text sample, the last checkpoint, the loss curve and the job's end.
  absl::Status Validate();
  absl::Status SampleText();
  absl::Status Finish();

  // What a checkpoint's notes record, for a resumed run's defaults.
  std::map<std::string, std::string> Notes(double loss) const;
  // A checkpoint in `dir`, which every rank takes part in (the weights' reads are collective).
  absl::Status Save(const std::string& dir, double loss);

  const RunFlags& f;
  std::unique_ptr<JobLink>& link;  // set once the job link starts (multi-rank runs)
  int rank = 0, world = 1;
  bool lead = true, talk = true;
  Setup s;
  compiler::Strategy strategy = compiler::Strategy::kNone;
  Device device;
  FaultPlan fault;
  bool sharded_save = false;
  TrainingData data;
  const Checkpoint* r = nullptr;  // s.resume: the checkpoint to continue, or null
  TrainOptions o;
  double budget = 0;
  bool estimate_total = false;
  std::unique_ptr<Trainer> t;
  RunSummary sum;
  std::string metrics_path;
  std::unique_ptr<MetricsLog> log;
  ProgressBar bar{stderr, false, 1e300};  // OpenOutputs picks the console's
  std::map<std::string, std::string> extra_files;
  int64_t saved_step = -1;
  // The step loop's clocks: the training time's start and the rate's (after the first step).
  Clock::time_point start, rate_start;
  int64_t rate_tokens = 0, done = 0;
  double loss = 0, last_step_s = 0;
};

absl::Status TrainingRun::SetUp() {
  rank = EnvInt("RANK", 0), world = EnvInt("WORLD_SIZE", 1);
  lead = rank == 0;
  talk = lead && !f.quiet;
  SG_ASSIGN_OR_RETURN(s, ResolveRun(f));
  SG_ASSIGN_OR_RETURN(strategy, ParseStrategy(f.strategy));
  SG_ASSIGN_OR_RETURN(std::vector<int64_t> mesh, ParseMesh(f.mesh));
  SG_ASSIGN_OR_RETURN(device, ParseDevice(f.device));
  SG_ASSIGN_OR_RETURN(fault, FaultPlan::Parse(f.inject_fault));
  SG_ASSIGN_OR_RETURN(const RecomputeChoice recompute, ParseRecompute(f));
  if (f.checkpoint_format != "full" && f.checkpoint_format != "sharded") {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_format: expected full or sharded, found '", f.checkpoint_format, "'"));
  }
  sharded_save = f.checkpoint_format == "sharded";

  SG_RETURN_IF_ERROR(PrepareRunDir(s, lead, talk));
  SG_ASSIGN_OR_RETURN(data, LoadData(f, s, s.run_dir));
  SG_RETURN_IF_ERROR(FitVocabulary(f, data, s));

  r = s.resume.get();
  SG_ASSIGN_OR_RETURN(o, MakeTrainOptions(f, s, device, strategy, mesh, recompute, rank, world));
  budget = f.time_budget >= 0 ? f.time_budget : (f.steps > 0 ? 0.0 : 120.0);
  estimate_total = f.steps <= 0 && ResumedTotalSteps(r) == 0;
  return absl::OkStatus();
}

absl::Status TrainingRun::StartTrainer() {
  SG_ASSIGN_OR_RETURN(t, Trainer::Create(o, data.split));
  // Multi-rank: failure detection and checkpoint coordination, started right after the compiler's
  // rendezvous so that every rank's first heartbeat comes within moments of the others'.
  if (world > 1) {
    JobLinkOptions lo;
    lo.deadline = absl::Seconds(std::max(0.0, f.health_deadline_s));
    lo.straggler_deadline = absl::Seconds(f.straggler_deadline_s);
    SG_ASSIGN_OR_RETURN(link, JobLink::Start(lo));
  }
  if (s.hf_init != nullptr) {
    SG_RETURN_IF_ERROR(t->SetWeights(s.hf_init->model, f.init_from_hf + "/model.safetensors"));
  }
  if (r != nullptr) {
    SG_RETURN_IF_ERROR(s.resume_sharded ? t->RestoreShards(s.resume_dir, r->state) : t->Restore(*r));
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::OpenOutputs() {
  sum.run_dir = s.run_dir;
  sum.first_step = t->step();
  if (talk) PrintRunHeader(s, o, *t, data, budget, world);

  metrics_path = !f.metrics.empty() ? f.metrics : JoinPath(s.run_dir, "metrics.jsonl");
  if (lead) {
    SG_ASSIGN_OR_RETURN(log, MetricsLog::Open(metrics_path, /*append=*/r != nullptr));
  }
  bar = f.quiet ? ProgressBar(stderr, false, 1e300) : ProgressBar::ForStderr(5.0);
  if (!data.tokenizer_file.empty()) extra_files["tokenizer.model"] = data.tokenizer_file;
  return absl::OkStatus();
}

std::map<std::string, std::string> TrainingRun::Notes(double loss) const {
  return {{"loss", absl::StrCat(loss)},           {"batch", absl::StrCat(o.batch)},
          {"seq", absl::StrCat(o.seq)},           {"grad_accum", absl::StrCat(o.grad_accum)},
          {"lr", absl::StrCat(o.lr)},             {"min_lr", absl::StrCat(o.min_lr)},
          {"warmup", absl::StrCat(o.warmup)},     {"total_steps", absl::StrCat(t->options().total_steps)},
          {"tokenizer", data.tokenizer ? data.tokenizer->Describe() : "pre-tokenized shards"}};
}

absl::Status TrainingRun::Save(const std::string& dir, double loss) {
  saved_step = t->step();
  if (sharded_save) {
    // Every rank writes its own shard; rank 0 commits the manifest once all are written.
    ShardedSaveOptions so;
    so.notes = Notes(loss);
    so.extra_files = extra_files;
    if (fault.Applies(FaultPlan::Kind::kKillInSave, rank, t->step())) {
      so.after_write = [&] { KillSelfNow(absl::StrCat("after writing rank ", rank, "'s shard of ", dir)); };
    }
    SG_RETURN_IF_ERROR(SaveTrainerShards(*t, dir, so, link.get()));
    if (talk) std::fprintf(stderr, "\nsaved   : %s (per-shard, %d ranks)\n", dir.c_str(), world);
    return lead ? PruneShardedCheckpoints(s.run_dir, 3, link ? link->attempt() : "0") : absl::OkStatus();
  }
  // Every rank reads the (possibly sharded) weights: the reads are collective. Rank 0 writes.
  if (!lead) return t->Save(dir, {}, {}, /*write=*/false);
  SG_RETURN_IF_ERROR(t->Save(dir, Notes(loss), extra_files));
  return PruneCheckpoints(s.run_dir, 3);
}

absl::Status TrainingRun::TrainSteps() {
  start = Clock::now();
  rate_start = start;
  while (t->step() < t->options().total_steps && !(budget > 0 && Since(start) >= budget)) {
    for (FaultPlan::Kind k : {FaultPlan::Kind::kKillInStep, FaultPlan::Kind::kStopInStep}) {
      // Half-way through the step (by the last one's time): the others are inside its collectives.
      if (fault.Applies(k, rank, t->step() + 1)) {
        ArmStepFault(fault, absl::Milliseconds(last_step_s > 0 ? std::max(20.0, 500 * last_step_s) : 200.0));
      }
    }
    if (fault.Applies(FaultPlan::Kind::kSleepInStep, rank, t->step() + 1)) StallNow(fault);
    const Clock::time_point step_start = Clock::now();
    SG_ASSIGN_OR_RETURN(StepResult step, t->Step());
    last_step_s = Since(step_start);
    ++done;
    loss = step.loss;
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("the loss became ", loss, " at step ", step.step, " (lr ", step.lr,
                                              "); try a smaller --lr"));
    }
    if (done == 1) {
      sum.first_loss = loss;
      rate_start = Clock::now();  // the first step includes warm-up work (allocation, capture)
    } else {
      rate_tokens += step.tokens;
    }
    const double elapsed = Since(start);
    const double tps = done > 1 ? double(rate_tokens) / std::max(1e-9, Since(rate_start)) : 0.0;
    if (estimate_total && done == 2) {
      const double per_step = Since(rate_start);
      const int64_t fit = int64_t((budget - elapsed) / std::max(per_step, 1e-6));
      t->SetTotalSteps(t->step() + std::max<int64_t>(fit, 1));
    }
    SG_RETURN_IF_ERROR(RecordStep(step, tps, elapsed));
  }
  if (talk) bar.Finish();
  sum.train_seconds = Since(start);
  sum.steps = t->step();
  sum.last_loss = loss;
  sum.tokens_per_s = done > 1 ? double(rate_tokens) / std::max(1e-9, Since(rate_start)) : 0.0;
  return absl::OkStatus();
}

absl::Status TrainingRun::RecordStep(const StepResult& step, double tps, double elapsed) {
  std::map<std::string, double> m = {{"loss", loss}, {"lr", step.lr}, {"grad_norm", step.grad_norm},
                                     {"tokens_per_s", tps}, {"memory_bytes", double(MemoryBytes(device))}};
  if (o.precision == compiler::Precision::kF16Mixed) {
    m["loss_scale"] = step.loss_scale;
    m["skipped"] = step.skipped ? 1 : 0;
  }
  if (device.is_cuda()) {
    const double peak = o.precision == compiler::Precision::kF32 ? 67e12 : 989e12;  // H200 dense
    m["mfu"] = tps * FlopsPerToken(o.config, o.seq) / peak;
  }
  if (f.eval_every > 0 && step.step % f.eval_every == 0) {
    SG_ASSIGN_OR_RETURN(const double val, t->ValidationLoss(f.eval_batches));
    m["val_loss"] = val;
  }
  if (log != nullptr) SG_RETURN_IF_ERROR(log->Write(step.step, m));
  ProgressUpdate u;
  u.step = step.step;
  u.total_steps = estimate_total && done < 2 ? 0 : t->options().total_steps;  // 0: not known yet
  u.loss = loss;
  u.tokens_per_s = tps;
  u.elapsed_s = elapsed;
  u.memory_bytes = MemoryBytes(device);
  u.memory_label = device.is_cuda() ? "gpu" : "mem";
  if (talk) bar.Update(u);
  if (f.checkpoint_every > 0 && step.step % f.checkpoint_every == 0) {
    SG_RETURN_IF_ERROR(Save(StepDir(s.run_dir, step.step), loss));
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::Validate() {
  SG_ASSIGN_OR_RETURN(sum.val_loss, t->ValidationLoss(f.eval_batches));
  if (log != nullptr) {
    SG_RETURN_IF_ERROR(log->Write(t->step(), {{"val_loss", sum.val_loss}}));
  }
  if (talk) {
    std::fprintf(stderr, "trained %ld steps in %.1f s: loss %.4f -> %.4f, %.0f tokens/s\n",
                 long(sum.steps - sum.first_step), sum.train_seconds, sum.first_loss, sum.last_loss, sum.tokens_per_s);
    std::fprintf(stderr, "validation loss: %.4f nats/token\n", sum.val_loss);
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::SampleText() {
  // Sampling runs one forward pass per token: minutes for a large model on the CPU.
  const bool sample = device.is_cuda() || ParameterCount(o.config) <= 50'000'000;
  if (sample && data.tokenizer != nullptr && !f.quiet) {
    std::vector<int32_t> prompt = {data.tokenizer->bos_id()};
    SG_ASSIGN_OR_RETURN(std::vector<int32_t> p, data.tokenizer->Encode(f.prompt));
    prompt.insert(prompt.end(), p.begin(), p.end());
    const int64_t n = f.sample_tokens > 0 ? f.sample_tokens : (data.tokenizer->vocab_size() <= 258 ? 200 : 80);
    SG_ASSIGN_OR_RETURN(std::vector<int32_t> gen, t->Sample(prompt, n, f.temperature));
    SG_ASSIGN_OR_RETURN(std::string text, data.tokenizer->Decode(gen));
    sum.sample = f.prompt + text;
    if (talk) std::fprintf(stderr, "sample (temperature %g):\n----\n%s\n----\n", f.temperature, sum.sample.c_str());
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::Finish() {
  sum.checkpoint = StepDir(s.run_dir, t->step());
  if (!(sharded_save && saved_step == t->step())) SG_RETURN_IF_ERROR(Save(sum.checkpoint, loss));
  if (lead) {
    SG_ASSIGN_OR_RETURN(auto train_curve, ReadMetric(metrics_path, "loss"));
    SG_ASSIGN_OR_RETURN(auto val_curve, ReadMetric(metrics_path, "val_loss"));
    SG_RETURN_IF_ERROR(WriteLossCurveSvg(JoinPath(s.run_dir, "loss.svg"),
                                         {{"train loss", train_curve, ""}, {"validation loss", val_curve, ""}}));
  }
  if (link != nullptr) SG_RETURN_IF_ERROR(link->Finish(absl::Seconds(120)));
  if (talk) {
    std::fprintf(stderr, "checkpoint: %s\nmetrics   : %s\nloss curve: %s\n", sum.checkpoint.c_str(),
                 metrics_path.c_str(), JoinPath(s.run_dir, "loss.svg").c_str());
  }
  if (strategy != compiler::Strategy::kNone && world > 1) {
    // Rank 0 hosts the store: it waits for every rank before exiting, so a rank still in its last
    // collective (a checkpoint read) keeps the store.
    SG_ASSIGN_OR_RETURN(std::shared_ptr<compiler::DistContext> ctx, compiler::DistContext::FromEnv(device, {}));
    SG_RETURN_IF_ERROR(ctx->Finalize(absl::Now() + absl::Seconds(60)));
  }
  return absl::OkStatus();
}

// RunTraining; `link` is set once the job link starts (multi-rank runs).
absl::StatusOr<RunSummary> Train(const RunFlags& f, std::unique_ptr<JobLink>& link) {
  TrainingRun run(f, link);
  SG_RETURN_IF_ERROR(run.SetUp());
  SG_RETURN_IF_ERROR(run.StartTrainer());
  SG_RETURN_IF_ERROR(run.OpenOutputs());
  SG_RETURN_IF_ERROR(run.TrainSteps());
  SG_RETURN_IF_ERROR(run.Validate());
  SG_RETURN_IF_ERROR(run.SampleText());
  SG_RETURN_IF_ERROR(run.Finish());
  return run.sum;
}

}  // namespace

absl::StatusOr<RunSummary> RunTraining(const RunFlags& f) {
  std::unique_ptr<JobLink> link;
  absl::StatusOr<RunSummary> sum = Train(f, link);
  if (sum.ok() || link == nullptr) return sum;
  // Often a collective that failed because a peer was lost: say which one, as the monitor saw it.
  const std::string report = link->ConcludeFailure();
  return absl::Status(sum.status().code(), absl::StrCat(sum.status().message(), "\nhealth: ", report));
}

}  // namespace sg::trainer
