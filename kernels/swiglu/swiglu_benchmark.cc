// SwiGLU bandwidth: forward reads gate and up and writes out (3 tensors of tokens x ffn); backward
// reads dout, gate, up and writes dgate, dup (5). On the first CUDA GPU, else the CPU.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"
#include "kernels/swiglu/swiglu.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// kernel: "" = the default (the flat kernel); "grid" = the grid-stride kernels
// (SG_SWIGLU_KERNEL=grid); calls: calls per timed iteration (1: events around one call, host
// launch latency included; kBatch: back-to-back calls, as in a CUDA-graph step).
constexpr int kBatch = 10;
void Run(benchmark::State& state, DType dtype, bool backward, bool packed, const char* kernel = "", int calls = 1) {
  Setup s;
  if (*kernel != 0) {
    setenv("SG_SWIGLU_KERNEL", kernel, 1);
  } else {
    unsetenv("SG_SWIGLU_KERNEL");
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
  auto call = [&] {
    return packed ? (backward ? SwiGluPackedBackward(d, gu, dgu, s.stream) : SwiGluPackedForward(gu, o1, s.stream))
                  : (backward ? SwiGluBackward(d, g, u, o1, o2, s.stream) : SwiGluForward(g, u, o1, s.stream));
  };
  testing::TimeCalls(state, s.stream, calls, rows * f * SizeOf(dtype) * (backward ? 5 : 3), call);
  unsetenv("SG_SWIGLU_KERNEL");
  state.SetLabel(std::string(DTypeName(dtype)) + (packed ? " packed@" : "@") + s.device.ToString() +
                 (*kernel ? std::string(" ") + kernel : std::string(" default")) +
                 (calls > 1 ? " batch" : " per-call"));
}

void BM_SwiGluForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, false); }
void BM_SwiGluBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, false); }
void BM_SwiGluPackedForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, true); }
void BM_SwiGluPackedBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, true); }
void BM_SwiGluForwardF32(benchmark::State& st) { Run(st, DType::kF32, false, false); }
// The default and the grid-stride kernels side by side (swiglu.cu says what each measured), batch
// timing.
void BM_SwiGluForwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "", kBatch); }
void BM_SwiGluBackwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "", kBatch); }
void BM_SwiGluForwardBF16GridBatch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "grid", kBatch); }
void BM_SwiGluBackwardBF16GridBatch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "grid", kBatch); }

// Placement: does where the three forward tensors lie relative to each other change the bandwidth?
// gate, up and out are views into one buffer, each `gap` KiB after the end of the previous one
// (0: back to back, as one allocation; the default benchmark takes three caching-allocator blocks).
// The default kernel, batch timing; forward only. H200, 16384 x 8192 (2026-11-30): no effect,
// 3.91 TB/s at every gap.
void BM_SwiGluForwardBF16PlacedBatch(benchmark::State& state) {
  Setup s;
  const int64_t rows = state.range(0), f = state.range(1), gap = state.range(2) * 1024 / 2;  // elements
  const int64_t n = rows * f;
  auto& rng = testing::Rng();
  Tensor buf = testing::RandomTensor({3 * (n + gap)}, DType::kBF16, s.device, rng, 3.0f);
  auto view = [&](int64_t i) {
    return TensorView(static_cast<char*>(buf.view().raw()) + i * (n + gap) * 2, DType::kBF16, Shape{rows, f},
                      s.device);
  };
  const TensorView g = view(0), u = view(1), o = view(2);
  testing::TimeCalls(state, s.stream, kBatch, n * 2 * 3, [&] { return SwiGluForward(g, u, o, s.stream); });
  state.SetLabel("gap " + std::to_string(state.range(2)) + " KiB");
}
BENCHMARK(BM_SwiGluForwardBF16PlacedBatch)
    ->ArgsProduct({{16384}, {8192}, {0, 4, 64, 1028, 2048, 4096 + 512}})
    ->UseManualTime();

// Llama-1B (16384 tokens x ffn 5632 and 8192) and a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 5632})->Args({16384, 8192})->Args({64, 1024})->UseManualTime()
BENCHMARK(BM_SwiGluForwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluPackedForwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluPackedBackwardBF16) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardF32) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_SwiGluForwardBF16GridBatch) SG_SHAPES;
BENCHMARK(BM_SwiGluBackwardBF16GridBatch) SG_SHAPES;

}  // namespace
}  // namespace sg::kernels
