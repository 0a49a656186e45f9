// SwiGLU bandwidth: forward reads gate and up and writes out (3 tensors of tokens x ffn); backward
// reads dout, gate, up and writes dgate, dup (5). On the first CUDA GPU, else the CPU.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "kernels/core/testing.h"
#include "kernels/swiglu/swiglu.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// kernel: "" = the default (the flat kernel); "fast" = its fast-math form (SG_SWIGLU_MATH=fast);
// "grid" = the grid-stride kernels (SG_SWIGLU_KERNEL=grid),
// "v1" / "unrolled" = those with that backward (SG_SWIGLU_BWD); calls: calls per timed iteration
// (1: events around one call, host launch latency included; kBatch: back-to-back calls, as in a
// CUDA-graph step).
constexpr int kBatch = 10;
void Run(benchmark::State& state, DType dtype, bool backward, bool packed, const char* kernel = "", int calls = 1) {
  Setup s;
  const std::string k = kernel;
  if (k == "v1" || k == "unrolled") {
    setenv("SG_SWIGLU_BWD", kernel, 1);
  } else {
    unsetenv("SG_SWIGLU_BWD");
  }
  if (k == "fast") {
    setenv("SG_SWIGLU_MATH", "fast", 1);
  } else if (!k.empty()) {
    setenv("SG_SWIGLU_KERNEL", "grid", 1);
  }
  const int64_t rows = state.range(0), f = state.range(1);
  auto& rng = testing::Rng();
  Tensor gu = testing::RandomTensor({rows, 2 * f}, dtype, s.device, rng, 3.0f);
  Tensor g = testing::RandomTensor({rows, f}, dtype, s.device, rng, 3.0f);
  Tensor u = testing::RandomTensor({rows, f}, dtype, s.device, rng);
  Tensor d = testing::RandomTensor({rows, f}, dtype, s.device, rng);
  Tensor o1 = Tensor::Empty({rows, f}, dtype, s.device).value();
  Tensor o2 = Tensor::Empty({rows, f}, dtype, s.device).value();
  Tensor dgu = Tensor::Empty({rows, 2 * f}, dtype, s.device).value();
  Event start = Event::Create(s.device, true).value(), stop = Event::Create(s.device, true).value();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)start.Record(s.stream);
    absl::Status st;
    for (int i = 0; i < calls && st.ok(); ++i) {
      st = packed ? (backward ? SwiGluPackedBackward(d, gu, dgu, s.stream) : SwiGluPackedForward(gu, o1, s.stream))
                  : (backward ? SwiGluBackward(d, g, u, o1, o2, s.stream) : SwiGluForward(g, u, o1, s.stream));
    }
    (void)stop.Record(s.stream);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
    if (s.device.is_cuda()) {
      (void)stop.Synchronize();
      state.SetIterationTime(stop.ElapsedMsSince(start).value() / 1e3 / calls);
    } else {
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
  }
  unsetenv("SG_SWIGLU_BWD");
  unsetenv("SG_SWIGLU_KERNEL");
  unsetenv("SG_SWIGLU_MATH");
  state.SetBytesProcessed(state.iterations() * rows * f * SizeOf(dtype) * (backward ? 5 : 3));
  state.SetLabel(std::string(DTypeName(dtype)) + (packed ? " packed@" : "@") + s.device.ToString() +
                 (*kernel ? std::string(" ") + kernel : std::string(" default")) +
                 (calls > 1 ? " batch" : " per-call"));
}

void BM_SwiGluForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, false); }
void BM_SwiGluBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, false); }
void BM_SwiGluPackedForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, true); }
void BM_SwiGluPackedBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, true); }
void BM_SwiGluForwardF32(benchmark::State& st) { Run(st, DType::kF32, false, false); }
// The backward kernels side by side (swiglu.cu), and the forward, batch timing.
void BM_SwiGluBackwardBF16UnrolledBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, false, "unrolled", kBatch);
}
void BM_SwiGluBackwardBF16V1Batch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "v1", kBatch); }
void BM_SwiGluForwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "", kBatch); }
void BM_SwiGluBackwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "", kBatch); }
void BM_SwiGluForwardBF16GridBatch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "grid", kBatch); }
void BM_SwiGluForwardBF16FastBatch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "fast", kBatch); }
void BM_SwiGluBackwardBF16FastBatch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "fast", kBatch); }

// Llama-1B (16384 tokens x ffn 5632 and 8192) and a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 5632})->Args({16384, 8192})->Args({64, 1024})->UseManualTime()
BENCHMARK(BM_SwiGluForwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluPackedForwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluPackedBackwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardF32) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16UnrolledBatch) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16V1Batch) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardBF16GridBatch) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardBF16FastBatch) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16FastBatch) SG_SHAPES;

}  // namespace
}  // namespace sg::kernels
