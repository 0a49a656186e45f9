// GEMM throughput (TFLOP/s = 2*M*N*K / time) at the Llama-1B shapes (16384 tokens, hidden 2048,
// MLP 8192, fused q/kv 2048+2*512, vocabulary 32000): the Linear forward and its two backward products.
// The peer is kernels/gemm/torch_gemm_peer.py (torch.matmul / F.linear at the same shapes, CUDA events);
// run both in one GPU session:
//   bazel-bin/kernels/gemm/gemm_benchmark --benchmark_counters_tabular=true
//   python3 kernels/gemm/torch_gemm_peer.py
// Without a GPU only the small shapes run, on the CPU (Eigen).
//
// Autotuning: every shape and kind runs twice, algo=0 with cuBLASLt's heuristic choice (what an
// untuned step runs) and algo=1 with the autotuned one (GemmAlgo::kTuned: the heuristic's top 8
// timed on the problem once, kernels/autotune); the TFLOP/s of the pair is the tuning's gain:
//   bazel-bin/kernels/gemm/gemm_benchmark --benchmark_filter='BM_Gemm/M:16384' --benchmark_counters_tabular=true
// kind 4 (dw = dy^T x into f32, overwritten) is the weight gradient as the compiled step issues it.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"

namespace sg::kernels {
namespace {

enum Kind : int64_t {
  kForward = 0,
  kBackwardDx = 1,
  kBackwardDw = 2,
  kBackwardDwAccumulateF32 = 3,
  kBackwardDwF32 = 4,
};

const char* KindName(int64_t k) {
  switch (k) {
    case kForward: return "fwd y=x@w^T";
    case kBackwardDx: return "bwd dx=dy@w";
    case kBackwardDw: return "bwd dw=dy^T@x";
    case kBackwardDwF32: return "bwd dw=dy^T@x (f32)";
    default: return "bwd dw+=dy^T@x (f32)";
  }
}

// Args: M (tokens), N (out features), K (in features), kind, algo (0 heuristic, 1 tuned).
void BM_Gemm(benchmark::State& state) {
  const Device dev = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2), kind = state.range(3);
  const bool tuned = state.range(4) != 0;
  if (dev.is_cpu() && m * n * k > (int64_t(1) << 30)) {
    state.SkipWithError("CPU run: shape too large (run on a GPU)");
    return;
  }
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  auto& rng = testing::Rng();
  const DType bf16 = DType::kBF16;
  Tensor x = testing::RandomTensor({m, k}, bf16, dev, rng);
  Tensor w = testing::RandomTensor({n, k}, bf16, dev, rng);
  Tensor y = Tensor::Empty({m, n}, bf16, dev).value();
  Tensor dy = testing::RandomTensor({m, n}, bf16, dev, rng);
  Tensor dx = Tensor::Empty({m, k}, bf16, dev).value();
  const bool dw_f32 = kind == kBackwardDwAccumulateF32 || kind == kBackwardDwF32;
  Tensor dw = Tensor::Empty({n, k}, dw_f32 ? DType::kF32 : bf16, dev).value();
  if (kind == kBackwardDwAccumulateF32) (void)ZeroTensor(dw, stream);

  GemmArgs g;
  switch (kind) {
    case kForward: g.a = x; g.b = w; g.trans_b = true; g.d = y; break;
    case kBackwardDx: g.a = dy; g.b = w; g.d = dx; break;
    default:
      g.a = dy; g.trans_a = true; g.b = x; g.d = dw;
      g.beta = kind == kBackwardDwAccumulateF32 ? 1.0f : 0.0f;
  }
  g.algo = tuned ? GemmAlgo::kTuned : GemmAlgo::kHeuristic;
  if (absl::Status st = Gemm(g, stream); !st.ok()) {  // warm-up: heuristic lookup or tuning, workspace
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  (void)stream.Synchronize();
  Event start = Event::Create(dev, true).value(), stop = Event::Create(dev, true).value();
  double seconds = 0;  // summed here: the rate counter must use the measured (manual) time
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    (void)start.Record(stream);
    absl::Status st = Gemm(g, stream);
    (void)stop.Record(stream);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
    if (dev.is_cuda()) {
      (void)stop.Synchronize();
      const double s = stop.ElapsedMsSince(start).value() / 1e3;
      seconds += s;
      state.SetIterationTime(s);
    } else {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      seconds += s;
      state.SetIterationTime(s);
    }
  }
  const double flops = 2.0 * double(m) * double(n) * double(k);
  if (seconds > 0) state.counters["TFLOP/s"] = flops * double(state.iterations()) / seconds / 1e12;
  state.SetLabel(std::string(KindName(kind)) + " bf16@" + dev.ToString() +
                 (dev.is_cuda() ? (tuned ? " tuned" : " heuristic") : ""));
}

void LlamaShapes(benchmark::internal::Benchmark* b) {
  const int64_t kTokens = 16384;
  const int64_t shapes[][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}, {2048 + 2 * 512, 2048}, {32000, 2048}};
  for (const auto& s : shapes) {
    for (int64_t kind : {kForward, kBackwardDx, kBackwardDw, kBackwardDwAccumulateF32, kBackwardDwF32}) {
      for (int64_t algo : {0, 1}) b->Args({kTokens, s[0], s[1], kind, algo});
    }
  }
  b->Args({512, 512, 512, kForward, 0});  // small enough for the CPU
  b->ArgNames({"M", "N", "K", "kind", "algo"});
}

BENCHMARK(BM_Gemm)->Apply(LlamaShapes)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace sg::kernels
