// RoPE bandwidth: q and k read once and written once (out of place; in place moves the same bytes),
// positions computed from the offset. Llama-1B: 8 x 2048 tokens, 32 q heads, 8 kv heads, head_dim 64.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"
#include "kernels/rope/rope.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// kernel: SG_ROPE_KERNEL for this benchmark ("" = the default); calls: calls per timed iteration
// (1: events around one call, host launch latency included; kBatch: back-to-back calls, as in a
// CUDA-graph step).
constexpr int kBatch = 20;
void Run(benchmark::State& state, DType dtype, bool backward, bool table, const char* kernel = "", int calls = 1) {
  Setup s;
  if (*kernel != 0) {
    setenv("SG_ROPE_KERNEL", kernel, 1);
  } else {
    unsetenv("SG_ROPE_KERNEL");
  }
  const int64_t batch = state.range(0), seq = state.range(1), hq = state.range(2), hk = state.range(3),
                d = state.range(4);
  auto& rng = testing::Rng();
  Tensor q = testing::RandomTensor({batch, seq, hq, d}, dtype, s.device, rng);
  Tensor k = testing::RandomTensor({batch, seq, hk, d}, dtype, s.device, rng);
  Tensor qo = Tensor::Empty(q.shape(), dtype, s.device).value();
  Tensor ko = Tensor::Empty(k.shape(), dtype, s.device).value();
  RopeOptions opt;
  opt.theta = 500000.f;
  Tensor cos = Tensor::Empty({seq, d / 2}, DType::kF32, s.device).value();
  Tensor sin = Tensor::Empty({seq, d / 2}, DType::kF32, s.device).value();
  if (table) {
    (void)RopeTable(opt.theta, cos, sin, s.stream);
    opt.cos = cos;
    opt.sin = sin;
  }
  testing::TimeCalls(state, s.stream, calls, 2 * (q.nbytes() + k.nbytes()), [&] {
    return backward ? RopeBackward(q, k, qo, ko, opt, s.stream) : RopeForward(q, k, qo, ko, opt, s.stream);
  });
  unsetenv("SG_ROPE_KERNEL");
  state.SetLabel(std::string(DTypeName(dtype)) + (table ? " table@" : "@") + s.device.ToString() +
                 (*kernel ? std::string(" ") + kernel : std::string(" default")) +
                 (calls > 1 ? " batch" : " per-call"));
}

void BM_RopeForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, false); }
void BM_RopeBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, false); }
void BM_RopeForwardBF16Table(benchmark::State& st) { Run(st, DType::kBF16, false, true); }
void BM_RopeForwardF32(benchmark::State& st) { Run(st, DType::kF32, false, false); }
// The CUDA kernels side by side (rope.cu says what each does and what each measured), batch
// timing: the default (the flat kernel) and SG_ROPE_KERNEL=tokens (the token-run kernel).
void BM_RopeForwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "", kBatch); }
void BM_RopeBackwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "", kBatch); }
void BM_RopeForwardBF16TableBatch(benchmark::State& st) { Run(st, DType::kBF16, false, true, "", kBatch); }
void BM_RopeForwardBF16TokensBatch(benchmark::State& st) { Run(st, DType::kBF16, false, false, "tokens", kBatch); }
void BM_RopeBackwardBF16TokensBatch(benchmark::State& st) { Run(st, DType::kBF16, true, false, "tokens", kBatch); }
void BM_RopeForwardBF16TableTokensBatch(benchmark::State& st) { Run(st, DType::kBF16, false, true, "tokens", kBatch); }

// Llama-1B (head_dim 64), Llama-3-8B-like (head_dim 128), and a small CPU-sized case.
#define SG_SHAPES ->Args({8, 2048, 32, 8, 64})->Args({4, 2048, 32, 8, 128})->Args({1, 64, 4, 2, 64})->UseManualTime()
BENCHMARK(BM_RopeForwardBF16) SG_SHAPES;
BENCHMARK(BM_RopeBackwardBF16) SG_SHAPES;
BENCHMARK(BM_RopeForwardBF16Table) SG_SHAPES;
BENCHMARK(BM_RopeForwardF32) SG_SHAPES;
BENCHMARK(BM_RopeForwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_RopeBackwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_RopeForwardBF16TableBatch) SG_SHAPES;
BENCHMARK(BM_RopeForwardBF16TokensBatch) SG_SHAPES;
BENCHMARK(BM_RopeBackwardBF16TokensBatch) SG_SHAPES;
BENCHMARK(BM_RopeForwardBF16TableTokensBatch) SG_SHAPES;

}  // namespace
}  // namespace sg::kernels
