// The compiled single-device Llama training step at the peer's shapes (shared/BASELINES.md):
// prints one JSON line like benchmarks/llama_peer.py's, so compare_llama.sh can print ratios.
//
//   bazel-bin/benchmarks/llama_step_benchmark --config=1b                      # first CUDA device
//   bazel-bin/benchmarks/llama_step_benchmark --config=tiny --device=cpu --steps=3
//   bazel-bin/comm/launch --nproc=2 -- bazel-bin/benchmarks/llama_step_benchmark --config=1b --strategy=fsdp
//
// Flags: --config=124m|1b|7b|tiny, --device=cuda|cpu (default cuda when present), --steps=30,
// --warmup=10, --recompute=auto|none|selective|full (--recompute_swiglu_layers=k: selective with
// SwiGLU recomputed in the first k layers only; --offload_activations=n: the first n kept activations
// in host memory), --memory_budget_gib (auto: the least recompute
// whose planned arena + state fits the budget; --offload_first: no recompute with the fewest kept
// activations offloaded to host memory, when that fits, before any recompute; default the memory
// targets of issue #10: 124m 10, 1b 32, 7b 42; 1b at 32.8, 0.8x the peer's 41.02 GiB measured on
// 2026-11-30, measured within noise of 32), --lr=3e-4, --cuda_graph=1 (0, or SG_CUDA_GRAPH=0 in
// the environment: eager steps, to compare; distributed steps are captured too, collectives included, and rank 0 prints which mode
// runs and why on stderr; the JSON's "cuda_graph" says whether the timed steps were replays),
// --trace=<path> (a Chrome trace of one extra eager step, its summary line on stderr, and its
// compute / communication / exposed-communication figures in the JSON line),
// --strategy=none|fsdp|hsdp (fsdp/hsdp under a launcher: one process per GPU, the GPU of its local
// rank, the same per-GPU batch as one GPU; rank 0 prints the JSON line; auto recompute then plans
// fsdp with compiler::PlanFsdpMemory, its own buffers included, and hsdp with the state as sharded
// over the world), --fsdp_host_gradient_units=N (fsdp: the gradient shards of N units in host
// memory, AdamW deferred into the next forward, in place of auto's choice; e.g. the 7b over one
// GPU, `--nproc=1`, with full recompute, to measure the copies' cost where no second GPU is),
// --autotune=1 (0, or SG_AUTOTUNE=0: every GEMM on cuBLASLt's first heuristic choice; the JSON's
// "autotune" says which ran), --gradients=auto|f32|bf16 (the matmul weights' gradients; auto: bf16 on one device with one
// micro-batch, the values PyTorch's autocast stores in its f32 .grad, else f32; bf16 also with
// --strategy=fsdp|hsdp: bf16 buckets reduce-scattered in f32 into the f32 shards, FSDP2's
// reduce_dtype=f32; the JSON's "bf16_gradients" says which ran),
// --shipped_tuning=1 (start from the GEMM choices shipped for this GPU model,
// kernels/gemm/shipped_tuning.h; 0: only this run's),
// --autotune_energy_ms=N (the long GEMMs' fastest cuBLASLt candidates ranked by joules a call
// over N-ms windows at the power limit, benchmarks/gpu_energy.h's EnergyCostMeter; the JSON counts
// the choices so made and stderr lists them), --cache_dir=DIR (the tuned choices stored there and
// reused by a later run: tune once, then compare),
// --energy_profile_ms=N (single device: each group of steps replayed for ~N ms under the energy
// counter after everything else, then the whole step without each large group, every window from
// one on-device snapshot of the program's memory, then the groups summed by kind -- matmul,
// attention, optimizer, other -- with the matmuls' joules a TFLOP; benchmarks/step_energy.h).
// Timing: CUDA events between consecutive Run() calls (inputs are host batches, staged through
// pinned buffers, a fresh random batch per step); the median step after warm-up. Memory: the
// caching allocator's PeakBytes (state + arena + kernel scratch + library workspaces). Energy (on
// a GPU whose driver's NVML can be opened; benchmarks/gpu_energy.h): millijoules per token of this
// rank's GPU over the timed steps, its mean power and its SM clock (min / median / max of samples
// every 50 ms); the reason on stderr where it cannot be read.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "benchmarks/gpu_energy.h"
#include "benchmarks/step_energy.h"
#include "comm/env.h"
#include "compiler/autotune.h"
#include "compiler/compile.h"
#include "compiler/llama_step.h"
#include "compiler/trace.h"
#include "kernels/autotune/tuning_table.h"
#include "graph/models/llama.h"
#include "kernels/core/allocator.h"
#include "kernels/core/device.h"
#include "kernels/core/status.h"
#include "kernels/core/stream.h"
#include "kernels/gemm/gemm.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, config, "1b", "model: 124m, 1b, 7b or tiny");
ABSL_FLAG(std::string, device, "", "cuda or cpu (default: the local rank's CUDA device when there is one, else cpu)");
ABSL_FLAG(int, steps, 30, "timed steps (>= 1)");
ABSL_FLAG(int, warmup, 10, "untimed steps before them (>= 0)");
ABSL_FLAG(std::string, recompute, "auto", "auto, none, selective or full");
ABSL_FLAG(double, memory_budget_gib, 0, "--recompute=auto's budget (<= 0: issue #10's memory target for --config)");
ABSL_FLAG(bool, offload_first, false,
          "--recompute=auto: when no recompute does not fit, try no recompute with the fewest kept activations "
          "offloaded to pinned host memory before any recompute");
ABSL_FLAG(bool, wgrad_stream, false,
          "weight-gradient matmuls on a stream of their own, overlapping the backward's data-gradient chain "
          "(CompileOptions::wgrad_stream; FSDP / HSDP join them before their reduce-scatters)");
ABSL_FLAG(float, lr, 3e-4f, "learning rate");
ABSL_FLAG(bool, cuda_graph, true, "replay the step as a CUDA graph (false: eager steps)");
ABSL_FLAG(std::string, trace, "", "write a Chrome trace of one extra eager step to this path");
ABSL_FLAG(std::string, strategy, "none", "none, fsdp or hsdp");
ABSL_FLAG(int, lm_head_chunks, 1,
          "the LM head (logits, cross-entropy, dh, dW) in this many blocks of tokens, so the logits never "
          "exist whole (CompileOptions::lm_head_chunks; --recompute=auto plans with it; 1: off)");
ABSL_FLAG(int, fsdp_host_gradient_units, -1,
          "--strategy=fsdp: the gradient shards of this many units wait in pinned host memory, AdamW deferred "
          "into the next forward (CompileOptions::fsdp_host_gradient_units; -1: --recompute=auto's choice, "
          "else 0; set, it replaces that choice)");
ABSL_FLAG(int, recompute_swiglu_layers, -1,
          "--recompute=selective: SwiGLU recomputed in the first this many layers only (0: none; -1: all; "
          "CompileOptions::recompute_swiglu_layers)");
ABSL_FLAG(int, offload_activations, -1,
          "with --recompute=none|selective|full: the first this many kept activations (forward order) wait in "
          "pinned host memory between their forward and backward uses (CompileOptions::offload_activations; "
          "-1: none, or --recompute=auto's choice)");
ABSL_FLAG(int, energy_profile_ms, 0,
          "after the timed steps (and the trace), each group of the schedule's steps (one operation at one place "
          "in every layer) replayed as a CUDA graph for about this many ms under the GPU's energy counter: "
          "joules, time and clock per group, then what the step saves without each group of >= 1% of the "
          "joules, on stderr and in the JSON (benchmarks/step_energy.h; 0: off)");
ABSL_FLAG(std::string, gradients, "auto",
          "the matmul weights' gradients: bf16 (the values PyTorch's autocast gives; CompileOptions::bf16_gradients, one "
          "micro-batch; fsdp / hsdp: bf16 buckets reduce-scattered in f32 into f32 shards), f32, or auto: bf16 on "
          "--strategy=none, else f32");
ABSL_FLAG(bool, autotune, true,
          "time cuBLASLt's top algorithms per GEMM in the warm-up and keep the fastest (CompileOptions::autotune); "
          "false: cuBLASLt's first heuristic choice, as SG_AUTOTUNE=0 (which also overrides true)");
ABSL_FLAG(int, autotune_energy_ms, 0,
          "> 0: rank each long GEMM's fastest cuBLASLt candidates by joules a call, each run back to back for this "
          "many ms under the energy counter at the power limit (benchmarks/gpu_energy.h EnergyCostMeter; >= 300), "
          "instead of by their few-call time; 0: time alone");
ABSL_FLAG(bool, shipped_tuning, true,
          "start from the GEMM choices shipped for this GPU model (CompileOptions::shipped_tuning, "
          "kernels/gemm/shipped_tuning.h); false: only this run's (or --cache_dir's) choices");
ABSL_FLAG(double, autotune_energy_min_us, 40,
          "--autotune_energy_ms: only GEMMs whose fastest candidate takes at least this long (us) are re-ranked");
ABSL_FLAG(double, autotune_energy_within, 1.3,
          "--autotune_energy_ms: the candidates within this factor of the fastest time are re-ranked (>= 1)");
ABSL_FLAG(int, autotune_energy_candidates, 8,
          "--autotune_energy_ms: at most this many of them, fastest first (>= 1; twice as many are timed)");
ABSL_FLAG(int, autotune_energy_variants, 0,
          "--autotune_energy_ms: also time up to this many cuBLASLt algorithm configurations the heuristic does not "
          "list (other cluster shapes, tiles, custom options of its first two; RerankPolicy::variants); 0: its list");
ABSL_FLAG(std::string, cache_dir, "",
          "compile cache directory (CompileOptions::cache_dir): the tuned GEMM choices are stored there and a later "
          "run with the same directory reuses them without timing; \"\": none");
ABSL_FLAG(int, micro_batches, 1,
          "gradient accumulation: the batch as this many micro-batches, one optimizer step "
          "(CompileOptions::micro_batches; --recompute=auto plans one micro-batch's activations)");

namespace sg::compiler {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kH200BF16Flops = 989e12;

struct Flags {
  std::string config = "1b", device, recompute = "auto", trace, strategy = "none", gradients = "auto", cache_dir;
  double memory_budget_gib = 0;
  int steps = 30, warmup = 10, micro_batches = 1, lm_head_chunks = 1, fsdp_host_gradient_units = -1,
      recompute_swiglu_layers = -1, offload_activations = -1, energy_profile_ms = 0, autotune_energy_ms = 0;
  bool cuda_graph = true, offload_first = false, wgrad_stream = false, autotune = true, shipped_tuning = true;
  float lr = 3e-4f;
  kernels::autotune::RerankPolicy energy_policy;
};

absl::StatusOr<RecomputePolicy> ParseRecompute(const std::string& s) {
  if (s == "none") return RecomputePolicy::kNone;
  if (s == "selective") return RecomputePolicy::kSelective;
  if (s == "full") return RecomputePolicy::kFull;
  return absl::InvalidArgumentError(absl::StrCat("--recompute: expected auto|none|selective|full, found '", s, "'"));
}

// The issue-10 memory targets (0.8x the torch.compile peak), leaving room for kernel scratch.
double DefaultBudgetGiB(const std::string& config) {
  if (config == "124m") return 10;
  if (config == "1b") return 32;
  if (config == "7b") return 42;
  return 1;
}

absl::StatusOr<Strategy> ParseStrategy(const std::string& s) {
  if (s == "none") return Strategy::kNone;
  if (s == "fsdp") return Strategy::kFsdp;
  if (s == "hsdp") return Strategy::kHybridShard;
  return absl::InvalidArgumentError(absl::StrCat("--strategy: expected none|fsdp|hsdp, found '", s, "'"));
}

// The parsed command line; Abseil has checked each value's type, this checks the ranges.
absl::StatusOr<Flags> ReadFlags() {
  Flags f;
  f.config = absl::GetFlag(FLAGS_config);
  f.device = absl::GetFlag(FLAGS_device);
  f.recompute = absl::GetFlag(FLAGS_recompute);
  f.trace = absl::GetFlag(FLAGS_trace);
  f.strategy = absl::GetFlag(FLAGS_strategy);
  f.memory_budget_gib = absl::GetFlag(FLAGS_memory_budget_gib);
  f.steps = absl::GetFlag(FLAGS_steps);
  f.warmup = absl::GetFlag(FLAGS_warmup);
  f.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  f.lr = absl::GetFlag(FLAGS_lr);
  f.offload_first = absl::GetFlag(FLAGS_offload_first);
  f.wgrad_stream = absl::GetFlag(FLAGS_wgrad_stream);
  f.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  f.lm_head_chunks = absl::GetFlag(FLAGS_lm_head_chunks);
  f.fsdp_host_gradient_units = absl::GetFlag(FLAGS_fsdp_host_gradient_units);
  f.recompute_swiglu_layers = absl::GetFlag(FLAGS_recompute_swiglu_layers);
  f.offload_activations = absl::GetFlag(FLAGS_offload_activations);
  f.energy_profile_ms = absl::GetFlag(FLAGS_energy_profile_ms);
  f.gradients = absl::GetFlag(FLAGS_gradients);
  f.autotune = absl::GetFlag(FLAGS_autotune);
  f.autotune_energy_ms = absl::GetFlag(FLAGS_autotune_energy_ms);
  f.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  f.shipped_tuning = absl::GetFlag(FLAGS_shipped_tuning);
  f.energy_policy.min_us = absl::GetFlag(FLAGS_autotune_energy_min_us);
  f.energy_policy.within = absl::GetFlag(FLAGS_autotune_energy_within);
  f.energy_policy.max_candidates = absl::GetFlag(FLAGS_autotune_energy_candidates);
  f.energy_policy.variants = absl::GetFlag(FLAGS_autotune_energy_variants);
  if (f.energy_policy.variants < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--autotune_energy_variants: expected >= 0, found ", f.energy_policy.variants));
  }
  if (!(f.energy_policy.within >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--autotune_energy_within: expected a factor >= 1, found ", f.energy_policy.within));
  }
  if (f.energy_policy.max_candidates < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--autotune_energy_candidates: expected >= 1, found ", f.energy_policy.max_candidates));
  }
  if (f.autotune_energy_ms != 0 && f.autotune_energy_ms < 300) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--autotune_energy_ms: expected 0 (off) or >= 300 (three updates of the energy counter), found ",
        f.autotune_energy_ms));
  }
  if (f.autotune_energy_ms > 0 && !f.autotune) {
    return absl::InvalidArgumentError("--autotune_energy_ms: expected --autotune=1 (it ranks the tuned candidates), "
                                      "found --autotune=0");
  }
  if (f.autotune_energy_ms > 0 && f.device == "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--autotune_energy_ms: expected a CUDA step (--device=cuda or unset), found --device=", f.device));
  }
  if (f.energy_profile_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--energy_profile_ms: expected >= 0 (0: off), found ", f.energy_profile_ms));
  }
  if (f.steps < 1) return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 1, found ", f.steps));
  if (f.warmup < 0) return absl::InvalidArgumentError(absl::StrCat("--warmup: expected >= 0, found ", f.warmup));
  if (f.recompute != "auto") SG_RETURN_IF_ERROR(ParseRecompute(f.recompute).status());
  if (f.offload_first && f.recompute != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--offload_first: expected --recompute=auto, found --recompute=", f.recompute));
  }
  if (f.recompute_swiglu_layers < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recompute_swiglu_layers: expected -1 (all) or a count >= 0, found ", f.recompute_swiglu_layers));
  }
  if (f.recompute_swiglu_layers != -1 && f.recompute != "selective") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute_swiglu_layers: expected --recompute=selective, found --recompute=", f.recompute));
  }
  if (f.offload_activations < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--offload_activations: expected -1 (none or auto's) or a count >= 0, found ", f.offload_activations));
  }
  if (f.offload_activations != -1 && f.recompute == "auto") {
    return absl::InvalidArgumentError("--offload_activations: expected --recompute=none|selective|full (auto chooses "
                                      "its own), found --recompute=auto");
  }
  if (f.lm_head_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--lm_head_chunks: expected >= 1, found ", f.lm_head_chunks));
  }
  if (f.fsdp_host_gradient_units < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fsdp_host_gradient_units: expected -1 (auto) or a count >= 0, found ", f.fsdp_host_gradient_units));
  }
  if (f.fsdp_host_gradient_units > 0 && f.strategy != "fsdp") {
    return absl::InvalidArgumentError(
        absl::StrCat("--fsdp_host_gradient_units: expected --strategy=fsdp, found --strategy=", f.strategy));
  }
  if (f.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--micro_batches: expected >= 1, found ", f.micro_batches));
  }
  if (f.device != "" && f.device != "cuda" && f.device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("--device: expected cuda|cpu, found '", f.device, "'"));
  }
  SG_RETURN_IF_ERROR(ParseStrategy(f.strategy).status());
  if (f.gradients != "auto" && f.gradients != "f32" && f.gradients != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--gradients: expected auto|f32|bf16, found '", f.gradients, "'"));
  }
  if (f.gradients == "bf16" && f.micro_batches != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gradients=bf16: expected --micro_batches=1 (accumulation adds gradients in f32), found --micro_batches=",
        f.micro_batches));
  }
  if (f.energy_profile_ms > 0 && f.device == "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--energy_profile_ms: expected a CUDA step (--device=cuda or unset), found --device=", f.device));
  }
  if (f.energy_profile_ms > 0 && f.strategy != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--energy_profile_ms: expected --strategy=none (a group's steps replay alone, without their collectives), "
        "found --strategy=", f.strategy));
  }
  if (absl::Status c = LlamaBenchConfigNamed(f.config).status(); !c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--config: ", c.message()));
  }
  return f;
}

// The GPU of this process's local rank under a launcher, GPU 0 otherwise.
absl::StatusOr<Device> PickDevice(const std::string& s) {
  if (s == "cpu") return Device::Cpu();
  if (s == "cuda" || s.empty()) {
    const absl::StatusOr<comm::RankInfo> info = comm::RankInfoFromEnv();
    const int local = info.ok() ? info->local_rank : 0;
    if (CudaDeviceCount() > local) return Device::Cuda(local);
    if (s == "cuda") return absl::FailedPreconditionError("--device=cuda: no CUDA device");
    return Device::Cpu();
  }
  return absl::InvalidArgumentError(absl::StrCat("--device: expected cuda|cpu, found '", s, "'"));
}

std::map<std::string, TensorView> Views(const std::map<std::string, Tensor>& t) {
  std::map<std::string, TensorView> v;
  for (const auto& [k, x] : t) v[k] = x.view();
  return v;
}

// Seconds per step for steps [warmup, steps): event (or host clock) deltas between Run() calls.
// With a `meter`, its window is the timed steps: started after a synchronization before the first
// timed step, stopped after the last one's; *energy gets the reading.
absl::StatusOr<std::vector<double>> TimedSteps(CompiledStep& step, const Flags& f,
                                               const std::vector<std::map<std::string, Tensor>>& batches,
                                               std::vector<float>* losses, sg::benchmarks::GpuEnergyMeter* meter,
                                               sg::benchmarks::GpuEnergyReading* energy) {
  const Device d = step.program().device;
  const int total = f.warmup + f.steps;
  std::vector<Event> marks;
  std::vector<std::chrono::steady_clock::time_point> host_marks;
  const Stream& s = step.executor().compute_stream();
  for (int i = 0; i <= total; ++i) {
    if (i == f.warmup && meter != nullptr) {
      SG_RETURN_IF_ERROR(step.executor().Synchronize());
      SG_RETURN_IF_ERROR(meter->Start());
    }
    if (i >= f.warmup) {
      if (d.is_cuda()) {
        SG_ASSIGN_OR_RETURN(Event e, Event::Create(d, /*timing=*/true));
        SG_RETURN_IF_ERROR(e.Record(s));
        marks.push_back(std::move(e));
      } else {
        host_marks.push_back(std::chrono::steady_clock::now());
      }
    }
    if (i == total) break;
    SG_RETURN_IF_ERROR(step.Run(Views(batches[size_t(i) % batches.size()])));
    if (i == 0 || i == total - 1) {  // a sync outside the timed window's steady state
      SG_ASSIGN_OR_RETURN(StepMetrics m, step.ReadMetrics());
      losses->push_back(m.loss);
    }
  }
  SG_RETURN_IF_ERROR(step.executor().Synchronize());
  if (meter != nullptr) {
    SG_ASSIGN_OR_RETURN(*energy, meter->Stop());
  }
  std::vector<double> secs;
  for (int i = 0; i + 1 < int(d.is_cuda() ? marks.size() : host_marks.size()); ++i) {
    if (d.is_cuda()) {
      SG_ASSIGN_OR_RETURN(float ms, marks[i + 1].ElapsedMsSince(marks[i]));
      secs.push_back(ms / 1e3);
    } else {
      secs.push_back(std::chrono::duration<double>(host_marks[i + 1] - host_marks[i]).count());
    }
  }
  return secs;
}

// --energy_profile_ms: where the step's energy goes (benchmarks/step_energy.h), last (the replays
// train on one batch). From one snapshot of the program's memory, restored before each window:
//  - the whole step replayed as one graph (checks the protocol against the timed steps);
//  - each group alone: its joules, time, watts, clock and TFLOP/s;
//  - the whole step without each group holding >= 1% of the groups' joules, between replays of
//    the whole step every 4: what removing the group would save the step, power-limit coupling
//    included (a group alone runs at the clock its own draw leaves it).
// Tables on stderr; rows in the JSON as "energy_profile", "energy_leave_one_out" and
// "energy_profile_whole_step".
absl::Status EnergyProfile(CompiledStep& step, const Flags& f, sg::benchmarks::GpuEnergyMeter* meter,
                           const sg::benchmarks::GpuEnergyReading& timed, nlohmann::json* j) {
  namespace sb = sg::benchmarks;
  if (step.program().device.is_cpu()) {
    return absl::InvalidArgumentError("--energy_profile_ms: expected a CUDA step, found a CPU one");
  }
  if (meter == nullptr) {
    return absl::FailedPreconditionError("--energy_profile_ms: expected a CUDA device whose NVML can be read, found none");
  }
  const Stream& stream = step.executor().compute_stream();
  SG_RETURN_IF_ERROR(step.executor().Synchronize());
  std::vector<int> skipped;
  const std::vector<sb::StepGroup> groups = sb::GroupSteps(step.program(), &skipped);
  SG_ASSIGN_OR_RETURN(const sb::ProgramSnapshot snap, sb::ProgramSnapshot::Take(step.program(), stream));
  const absl::Duration group_window = absl::Milliseconds(f.energy_profile_ms);
  const absl::Duration whole_window = absl::Milliseconds(std::max(2000, f.energy_profile_ms));
  const sb::StepGroup whole = sb::WholeStep(groups);
  auto row_json = [](const sb::GroupEnergy& r) {
    return nlohmann::json{{"group", r.key}, {"steps", r.steps}, {"replays", r.replays}, {"ms", r.ms_per_step},
                          {"joules", r.joules_per_step}, {"watts", r.mean_watts}, {"sm_clock_mhz", r.sm_clock_median_mhz},
                          {"temperature_max_c", r.temperature_max_c}, {"tflops", r.tflops}};
  };
  auto line = [](const sb::GroupEnergy& r) {
    return absl::StrFormat("%.2f J, %.2f ms, %.0f W, %.0f MHz, %d C, %d replays", r.joules_per_step, r.ms_per_step,
                           r.mean_watts, r.sm_clock_median_mhz, r.temperature_max_c, r.replays);
  };

  SG_ASSIGN_OR_RETURN(StepMetrics before, step.ReadMetrics());
  SG_ASSIGN_OR_RETURN(std::vector<sb::GroupEnergy> first,
                      sb::ProfileGroups(step.program(), {whole}, stream, *meter, whole_window, &snap));
  SG_ASSIGN_OR_RETURN(StepMetrics after_first, step.ReadMetrics());
  const double step_j = timed.joules / f.steps, step_ms = 1e3 * timed.seconds / f.steps;
  std::cerr << absl::StrFormat("snapshot %.2f GiB; timed steps %.2f J, %.2f ms, %d C; whole step replayed: %s; "
                               "loss %.4f -> %.4f\n",
                               snap.bytes() / double(1 << 30), step_j, step_ms, timed.temperature_max_c,
                               line(first[0]), before.loss, after_first.loss);

  SG_ASSIGN_OR_RETURN(std::vector<sb::GroupEnergy> rows,
                      sb::ProfileGroups(step.program(), groups, stream, *meter, group_window, &snap));
  double sum_j = 0, sum_ms = 0;
  for (const auto& r : rows) sum_j += r.joules_per_step, sum_ms += r.ms_per_step;
  std::vector<int> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return rows[a].joules_per_step > rows[b].joules_per_step; });

  // Leave-one-out: [whole, without g1..g4, whole, without g5..g8, ..., whole]; each "without" row
  // against the mean of the two wholes around it.
  std::vector<int> big;
  for (int i : order) {
    if (rows[i].joules_per_step >= 0.01 * sum_j) big.push_back(i);
  }
  std::vector<sb::StepGroup> plan;
  std::vector<int> plan_group;  // -1: a whole step
  for (size_t k = 0; k < big.size(); ++k) {
    if (k % 4 == 0) plan.push_back(whole), plan_group.push_back(-1);
    plan.push_back(sb::WholeStep(groups, &groups[big[k]])), plan_group.push_back(big[k]);
  }
  plan.push_back(whole), plan_group.push_back(-1);
  // Leaving out a group whose outputs the rest of the step reads leaves the readers stale arena
  // bytes; where that ends in non-finite numbers the window's power is not the step's (a GPU on
  // NaNs draws far less), so a row counts only when the window's last loss and gradient norm are
  // finite (gpu_call105: leaving out a forward matmul "saved" 6x its own energy, on NaNs).
  std::vector<sb::GroupEnergy> loo;
  std::vector<StepMetrics> loo_metrics;
  for (const sb::StepGroup& g : plan) {
    SG_ASSIGN_OR_RETURN(std::vector<sb::GroupEnergy> r,
                        sb::ProfileGroups(step.program(), {g}, stream, *meter, whole_window, &snap));
    loo.push_back(r[0]);
    SG_ASSIGN_OR_RETURN(StepMetrics m, step.ReadMetrics());
    loo_metrics.push_back(m);
  }
  const StepMetrics after_last = loo_metrics.back();
  auto finite = [](const StepMetrics& m) { return std::isfinite(m.loss) && std::isfinite(m.grad_norm); };
  std::map<int, std::pair<double, double>> saved;  // group -> (J, ms) the step saves without it
  std::set<int> non_finite;                        // groups whose leaving out ended in NaN or inf
  std::vector<double> whole_j, whole_ms;
  for (size_t k = 0; k < plan.size(); ++k) {
    if (plan_group[k] >= 0) continue;
    whole_j.push_back(loo[k].joules_per_step), whole_ms.push_back(loo[k].ms_per_step);
  }
  for (size_t k = 0, w = 0; k < plan.size(); ++k) {
    if (plan_group[k] < 0) {
      ++w;
      continue;
    }
    if (!finite(loo_metrics[k])) {
      non_finite.insert(plan_group[k]);
      continue;
    }
    const double base_j = (whole_j[w - 1] + whole_j[w]) / 2, base_ms = (whole_ms[w - 1] + whole_ms[w]) / 2;
    saved[plan_group[k]] = {base_j - loo[k].joules_per_step, base_ms - loo[k].ms_per_step};
  }

  std::cerr << absl::StrFormat("energy profile: %d groups alone %.2f J and %.2f ms a step summed; whole step "
                               "replayed %.2f-%.2f J, %.2f-%.2f ms over the leave-one-out windows (loss then %.4f); "
                               "%zu steps off the compute stream not profiled\n",
                               rows.size(), sum_j, sum_ms, *std::min_element(whole_j.begin(), whole_j.end()),
                               *std::max_element(whole_j.begin(), whole_j.end()),
                               *std::min_element(whole_ms.begin(), whole_ms.end()),
                               *std::max_element(whole_ms.begin(), whole_ms.end()), after_last.loss, skipped.size());
  std::cerr << "alone:     J   share      ms      W    MHz    C  TFLOP/s  steps | step saves without it:     J      ms"
               "  | group\n";
  for (int i : order) {
    const auto& r = rows[i];
    const auto s = saved.find(i);
    std::cerr << absl::StrFormat("       %6.2f  %5.1f%%  %6.2f  %5.0f  %5.0f  %3d  %7s  %5d | %28s  | %s\n",
                                 r.joules_per_step, 100 * r.joules_per_step / sum_j, r.ms_per_step, r.mean_watts,
                                 r.sm_clock_median_mhz, r.temperature_max_c,
                                 r.tflops > 0 ? absl::StrFormat("%.0f", r.tflops) : std::string("-"), r.steps,
                                 s != saved.end() ? absl::StrFormat("%6.2f  %6.2f", s->second.first, s->second.second)
                                 : non_finite.count(i) ? std::string("non-finite without it")
                                                       : std::string(""),
                                 r.key);
  }
  nlohmann::json a = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    nlohmann::json r = row_json(rows[i]);
    if (const auto s = saved.find(int(i)); s != saved.end()) {
      r["step_saves_joules"] = s->second.first;
      r["step_saves_ms"] = s->second.second;
    }
    if (non_finite.count(int(i))) r["non_finite_without_it"] = true;
    a.push_back(std::move(r));
  }
  // The ledger by kind (benchmarks/README.md, "Where the 1b step's energy goes").
  nlohmann::json kinds = nlohmann::json::array();
  std::cerr << "by kind:   J   share      ms      W  J/TFLOP  groups | kind\n";
  for (const sb::KindEnergy& k : sb::SumByKind(groups, rows)) {
    std::cerr << absl::StrFormat("       %6.2f  %5.1f%%  %6.2f  %5.0f  %7s  %6d | %s\n", k.joules_per_step,
                                 100 * k.joules_per_step / sum_j, k.ms_per_step, k.mean_watts(),
                                 k.joules_per_tflop > 0 ? absl::StrFormat("%.3f", k.joules_per_tflop) : std::string("-"),
                                 k.groups, k.kind);
    kinds.push_back({{"kind", k.kind}, {"groups", k.groups}, {"joules", k.joules_per_step}, {"ms", k.ms_per_step},
                     {"watts", k.mean_watts()}, {"tflop", k.flops / 1e12}, {"joules_per_tflop", k.joules_per_tflop}});
  }
  (*j)["energy_profile_by_kind"] = kinds;
  nlohmann::json l = nlohmann::json::array();
  for (size_t k = 0; k < loo.size(); ++k) {
    nlohmann::json r = row_json(loo[k]);
    r["loss"] = loo_metrics[k].loss;
    r["grad_norm"] = loo_metrics[k].grad_norm;
    l.push_back(std::move(r));
  }
  (*j)["energy_profile"] = a;
  (*j)["energy_leave_one_out"] = l;
  (*j)["energy_profile_whole_step"] = row_json(first[0]);
  (*j)["energy_profile_loss"] = {before.loss, after_first.loss, after_last.loss};
  (*j)["energy_profile_joules"] = sum_j;
  (*j)["energy_profile_ms"] = sum_ms;
  (*j)["timed_step_joules"] = step_j;
  return absl::OkStatus();
}

absl::Status Main(const Flags& f) {
  SG_ASSIGN_OR_RETURN(Device device, PickDevice(f.device));
  SG_ASSIGN_OR_RETURN(Strategy strategy, ParseStrategy(f.strategy));
  int rank = 0, world = 1;
  if (strategy != Strategy::kNone) {
    SG_ASSIGN_OR_RETURN(comm::RankInfo info, comm::RankInfoFromEnv());
    rank = info.rank;
    world = info.world_size;
  }
  SG_ASSIGN_OR_RETURN(LlamaBenchConfig c, LlamaBenchConfigNamed(f.config));
  SG_ASSIGN_OR_RETURN(graph::Graph fwd, graph::BuildLlamaForward(c.model));
  CompileOptions o = LlamaStepOptions(c, device, RecomputePolicy::kNone);
  // Set before ChooseRecompute: an FSDP step is planned with its own buffers (PlanFsdpMemory), and
  // the weight-gradient stream keeps its matmuls' inputs longer.
  o.strategy = strategy;
  o.wgrad_stream = f.wgrad_stream;
  o.lm_head_chunks = f.lm_head_chunks;
  o.micro_batches = f.micro_batches;
  o.bf16_gradients = f.gradients == "bf16" || (f.gradients == "auto" && strategy == Strategy::kNone && f.micro_batches == 1);
  if (f.recompute == "auto") {
    // The budget less what the plan does not count (kernel scratch, library workspaces: ~0.2 GiB
    // at 1b); sharded strategies hold 1/world of the state per GPU.
    const double budget = (f.memory_budget_gib > 0 ? f.memory_budget_gib : DefaultBudgetGiB(c.name)) - 0.25;
    o.offload_before_recompute = f.offload_first;
    SG_RETURN_IF_ERROR(ChooseRecompute(fwd, int64_t(budget * kGiB), world, &o).status());
  } else {
    SG_ASSIGN_OR_RETURN(o.recompute, ParseRecompute(f.recompute));
    o.recompute_swiglu_layers = f.recompute_swiglu_layers;
    if (f.offload_activations >= 0) o.offload_activations = f.offload_activations;
  }
  if (f.fsdp_host_gradient_units >= 0) o.fsdp_host_gradient_units = f.fsdp_host_gradient_units;
  const RecomputePolicy rp = o.recompute;
  o.cuda_graph = f.cuda_graph;
  o.autotune = f.autotune;
  o.cache_dir = f.cache_dir;
  o.shipped_tuning = f.shipped_tuning;
  o.warmup_steps = 2;
  if (f.autotune_energy_ms > 0) {
    if (!device.is_cuda()) return absl::FailedPreconditionError("--autotune_energy_ms: no CUDA device");
    SG_ASSIGN_OR_RETURN(std::string bus, CudaDevicePciBusId(device.ordinal));
    SG_ASSIGN_OR_RETURN(std::unique_ptr<sg::benchmarks::EnergyCostMeter> energy_meter,
                        sg::benchmarks::EnergyCostMeter::Open(bus, absl::Milliseconds(f.autotune_energy_ms),
                                                              absl::Milliseconds(300), rank == 0 ? &std::cerr : nullptr));
    kernels::autotune::Tuner::Global().set_meter(std::move(energy_meter), f.energy_policy);
  }
  o.strategy = strategy;
  if (strategy == Strategy::kHybridShard) o.mesh = {world / 2, 2};
  SG_ASSIGN_OR_RETURN(PlannedMemory plan, PlanMemory(fwd, o));
  if (rank == 0) std::cerr << absl::StrFormat("planned: arena %.2f GiB (%.2f without reuse), state %.2f GiB, %d activations offloaded%s\n",
                               plan.arena_bytes / kGiB, plan.arena_without_reuse_bytes / kGiB,
                               plan.state_bytes / kGiB, o.offload_activations,
                               o.micro_batches > 1 ? " (one pass over the whole batch: not the micro-batched step's)" : "");
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(device));
  const auto t0 = std::chrono::steady_clock::now();
  SG_ASSIGN_OR_RETURN(std::unique_ptr<CompiledStep> step, Compile(fwd, o));
  const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0 && !step->explanation().empty()) std::cerr << "strategy: " << step->explanation() << "\n";
  SG_RETURN_IF_ERROR(InitLlamaParameters(*step, fwd, 1234));
  SG_RETURN_IF_ERROR(step->SetLearningRate(f.lr));
  std::vector<std::map<std::string, Tensor>> batches;
  // A fresh random batch for every step, as the peer draws one per step: with a repeated batch the
  // model memorizes it and the loss curve says nothing about matching the peer's behaviour.
  for (int64_t seed = 1; seed <= f.warmup + f.steps; ++seed) {
    SG_ASSIGN_OR_RETURN(auto b, RandomTokenBatch(c, uint64_t(seed * world + rank)));
    batches.push_back(std::move(b));
  }
  std::vector<float> losses;
  // The GPU's energy over the timed steps, where NVML can read it (the reason on stderr otherwise).
  std::unique_ptr<sg::benchmarks::GpuEnergyMeter> meter;
  if (device.is_cuda()) {
    absl::StatusOr<std::unique_ptr<sg::benchmarks::GpuEnergyMeter>> m = [&] {
      absl::StatusOr<std::string> bus = CudaDevicePciBusId(device.ordinal);
      return bus.ok() ? sg::benchmarks::GpuEnergyMeter::Open(*bus) : bus.status();
    }();
    if (m.ok()) {
      meter = *std::move(m);
    } else if (rank == 0) {
      std::cerr << "no energy reading: " << m.status() << "\n";
    }
  }
  sg::benchmarks::GpuEnergyReading energy;
  SG_ASSIGN_OR_RETURN(std::vector<double> secs, TimedSteps(*step, f, batches, &losses, meter.get(), &energy));
  std::vector<double> sorted = secs;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double tokens = double(c.batch * c.seq);
  const double tok_s = tokens / median;
  nlohmann::json j;
  j["system"] = "sgtrain";
  j["config"] = c.name;
  j["device"] = device.ToString();
  j["strategy"] = f.strategy;
  j["world"] = world;
  j["recompute"] = std::string(graph::RecomputePolicyName(rp));
  j["recompute_swiglu_layers"] = o.recompute_swiglu_layers;
  j["offload_activations"] = o.offload_activations;
  j["fsdp_host_gradient_units"] = o.fsdp_host_gradient_units;
  j["wgrad_stream"] = o.wgrad_stream;
  j["micro_batches"] = o.micro_batches;
  j["lm_head_chunks"] = o.lm_head_chunks;
  j["bf16_gradients"] = o.bf16_gradients;
  j["offload_host_gib"] = step->program().offload_host_bytes / kGiB;
  j["cuda_graph"] = step->executor().replaying_graph();
  j["autotune"] = AutotuneEnabled(o);
  j["autotune_energy_ms"] = f.autotune_energy_ms;
  j["autotune_energy_variants"] = f.energy_policy.variants;
  j["shipped_tuning"] = o.shipped_tuning;
  {
    // The tuned GEMMs whose choice a meter made (this run's or a cache's), on stderr one a line.
    const kernels::autotune::TuningTable table = kernels::autotune::Tuner::Global().Snapshot();
    int metered = 0, changed = 0;
    for (const auto& [key, choice] : table.entries()) {
      if (choice.cost_unit.empty()) continue;
      ++metered;
      changed += choice.cost < choice.fastest_cost;
      if (rank == 0) {
        const std::string config = key.kernel == "gemm.cublaslt" ? kernels::DescribeCublasLtChoice(choice.variant) : "";
        std::cerr << absl::StrFormat("metered choice: %s: %.1f us, %.4f %s a call (the fastest's: %.4f) %s\n",
                                     key.problem, choice.microseconds, choice.cost, choice.cost_unit,
                                     choice.fastest_cost, config);
      }
    }
    j["tuned_choices"] = table.size();
    j["metered_choices"] = metered;
    j["metered_choices_not_fastest"] = changed;
  }
  int fused_swiglu_backward = 0;  // swiglu_backward steps run as WgmmaGemmSwiGluBackward with their dh matmul
  for (const Step& st : step->program().schedule.steps) {
    fused_swiglu_backward += absl::StartsWith(st.name, "matmul + swiglu_backward");
  }
  j["fused_swiglu_backward"] = fused_swiglu_backward;
  j["tokens_per_s_per_gpu"] = std::round(tok_s * 10) / 10;
  j["step_ms_median"] = median * 1e3;
  j["step_ms_min"] = sorted.front() * 1e3;
  j["mfu"] = tok_s * c.FlopsPerToken() / kH200BF16Flops;
  j["peak_gib"] = alloc->PeakBytes() / kGiB;
  j["planned_arena_gib"] = plan.arena_bytes / kGiB;
  j["planned_state_gib"] = plan.state_bytes / kGiB;
  j["params"] = c.Parameters();
  j["loss_first"] = losses.front();
  j["loss_last"] = losses.back();
  j["ln_vocab"] = std::log(double(c.model.vocab));
  if (meter != nullptr) {  // this rank's GPU over the timed steps (at a power limit, tokens/s follows J/token)
    j["gpu_millijoules_per_token"] = 1e3 * energy.joules / (tokens * f.steps);
    j["gpu_mean_watts"] = energy.mean_watts;
    j["sm_clock_median_mhz"] = energy.sm_clock_median_mhz;
    j["gpu_temperature_max_c"] = energy.temperature_max_c;
    j["sm_clock_min_mhz"] = energy.sm_clock_min_mhz;
    j["sm_clock_max_mhz"] = energy.sm_clock_max_mhz;
  }
  j["steps"] = f.steps;
  j["warmup"] = f.warmup;
  j["compile_s"] = compile_s;
  j["schedule_steps"] = step->program().schedule.steps.size();
  if (!f.trace.empty()) {  // every rank traces (a collective step); rank 0 writes it
    SG_ASSIGN_OR_RETURN(StepTrace t, step->TraceStep(Views(batches[0])));
    const TraceSummary sum = Summarize(t);
    // Of the traced (eager, event-timed) step: the share of it where communication runs and no
    // compute overlaps it.
    j["trace_step_ms"] = sum.step_us / 1e3;
    j["trace_comm_ms"] = sum.comm_us / 1e3;
    j["exposed_comm_ms"] = sum.exposed_comm_us / 1e3;
    j["exposed_comm_share"] = sum.exposed_comm_share();
    if (rank == 0) {
      std::ofstream(f.trace) << ToChromeTraceJson(t);
      std::cerr << SummaryLine(t) << "\n";
    }
  }
  if (f.energy_profile_ms > 0) SG_RETURN_IF_ERROR(EnergyProfile(*step, f, meter.get(), energy, &j));
  if (rank == 0) std::cout << j.dump() << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace sg::compiler

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The compiled Llama training step at the peer's shapes; prints one JSON line.\n"
      "  llama_step_benchmark --config=tiny --device=cpu --steps=3");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "llama_step_benchmark: expected only --flag=value arguments, found '" << rest[1] << "'\n";
    return 2;
  }
  // Usage errors (exit 2) are told apart from failures of the run (exit 1).
  const absl::StatusOr<sg::compiler::Flags> f = sg::compiler::ReadFlags();
  if (!f.ok()) {
    std::cerr << "llama_step_benchmark: " << f.status().message() << "\n";
    return 2;
  }
  const absl::Status s = sg::compiler::Main(*f);
  if (!s.ok()) {
    std::cerr << "llama_step_benchmark: " << s << "\n";
    return 1;
  }
  return 0;
}
