// Pipeline-parallel GPU benchmark; run one process per GPU (one stage each) under the launcher:
//
//   bazel build -c opt //compiler/pipeline:pp_benchmark
//   comm/launch --nproc=2 -- bazel-bin/compiler/pipeline/pp_benchmark
//
// BM_PipelineStep/<micro>/<layers>: a bf16 training step of the 1b model's shapes (<layers>
// layers, split evenly over the ranks) through Compile(Strategy::kPipeline), <micro> micro-batches
// of one 2048-token sequence. Counters: bubble (measured: the mean over stages of the idle share
// of the step's span, from each stage's busy intervals, PipelineStep::last_times: CUDA events on
// the compute stream), bubble_theory (1F1B: (p-1)/(m+p-1)), device_transfers (1: activations and
// gradients go device to device over NCCL on the communication stream, the host never waiting
// inside the schedule; 0: through host memory) and tokens_per_s. The measured bubble sits above
// the theory by the transfer time left exposed and the stage imbalance (the first stage holds the
// embedding, the last the output projection and loss, and the last stage runs each micro-batch's
// forward again in its backward).
// Fixed iteration counts (every rank takes part); skips with a message without a GPU or 2+ ranks.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/llama_step.h"
#include "compiler/pipeline/pp_step.h"
#include "compiler/pipeline/schedule.h"
#include "kernels/core/device.h"

namespace sg::compiler {
namespace {

#define BENCH_OK(expr)                                           \
  do {                                                           \
    absl::Status sg_s_ = (expr);                                 \
    if (!sg_s_.ok()) {                                           \
      state.SkipWithError(std::string(sg_s_.message()).c_str()); \
      return;                                                    \
    }                                                            \
  } while (0)

void BM_PipelineStep(benchmark::State& state) {
  // SG_BENCH_CPU=1: the tiny model on the CPU (a smoke run of this benchmark without a GPU).
  const bool cpu = std::getenv("SG_BENCH_CPU") != nullptr;
  if (CudaDeviceCount() == 0 && !cpu) {
    state.SkipWithError("needs a CUDA GPU");
    return;
  }
  auto info = comm::RankInfoFromEnv();
  if (!info.ok() || info->world_size < 2) {
    state.SkipWithError("needs 2+ ranks: run under comm/launch --nproc=2");
    return;
  }
  const int micro = int(state.range(0));
  const int64_t layers = state.range(1);
  const Device device = cpu ? Device::Cpu() : Device::Cuda(info->local_rank % CudaDeviceCount());
  auto c = LlamaBenchConfigNamed(cpu ? "tiny" : "1b");
  BENCH_OK(c.status());
  c->model.n_layers = layers;
  c->batch = micro;
  if (cpu) c->seq = 64;
  auto fwd = graph::BuildLlamaForward(c->model);
  BENCH_OK(fwd.status());
  CompileOptions o = LlamaStepOptions(*c, device, RecomputePolicy::kNone);
  if (cpu) o.precision = Precision::kF32;
  o.strategy = Strategy::kPipeline;
  o.micro_batches = micro;
  o.comm_timeout_s = 120;
  auto compiled = Compile(*fwd, o);
  BENCH_OK(compiled.status());
  auto* step = dynamic_cast<PipelineStep*>(compiled->get());
  if (step == nullptr) {
    state.SkipWithError("Compile did not return a pipeline step");
    return;
  }
  BENCH_OK(InitLlamaParameters(*step, *fwd, 1));
  BENCH_OK(step->SetLearningRate(1e-4f));
  auto batch = RandomTokenBatch(*c, 2);
  BENCH_OK(batch.status());
  std::map<std::string, TensorView> views;
  for (const auto& [name, t] : *batch) views[name] = t.view();
  BENCH_OK(step->Run(views));  // warm-up
  auto ctx = DistContext::FromEnv(device, {});
  BENCH_OK(ctx.status());
  comm::ProcessGroup& world = (*ctx)->world();
  const int p = world.size();
  double bubble_sum = 0;
  for (auto _ : state) {
    const absl::Time t0 = absl::Now();
    BENCH_OK(step->Run(views));
    state.SetIterationTime(absl::ToDoubleSeconds(absl::Now() - t0));
    // Every stage's busy time and span, gathered: BubbleFraction over the stages.
    float mine[3] = {0, 1e30f, 0};
    for (const Interval& i : step->last_times()) {
      mine[0] += float(i.end - i.start);
      mine[1] = std::min(mine[1], float(i.start));
      mine[2] = std::max(mine[2], float(i.end));
    }
    std::vector<float> all(size_t(3 * p));
    BENCH_OK(world.AllGather(TensorView(mine, DType::kF32, {3}, Device::Cpu()),
                             TensorView(all.data(), DType::kF32, {3 * p}, Device::Cpu())));
    double lo = 1e30, hi = 0, idle = 0;
    for (int s = 0; s < p; ++s) {
      lo = std::min(lo, double(all[size_t(3 * s + 1)]));
      hi = std::max(hi, double(all[size_t(3 * s + 2)]));
    }
    for (int s = 0; s < p; ++s) idle += (hi - lo - all[size_t(3 * s)]) / (hi - lo);
    bubble_sum += idle / p;
  }
  state.counters["bubble"] = bubble_sum / double(state.iterations());
  state.counters["bubble_theory"] = OneFOneBBubbleTheory(p, micro);
  state.counters["device_transfers"] = step->device_transfers() ? 1 : 0;
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(micro * c->seq), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(absl::StrCat(c->name, " shapes, ", layers, " layers over ", p, " stages, ", micro, " micro-batches x ",
                              c->seq, " tokens, ", step->device_transfers() ? "device" : "host", " transfers"));
}
BENCHMARK(BM_PipelineStep)
    ->ArgsProduct({{1, 2, 4, 8, 16}, {8}})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sg::compiler
