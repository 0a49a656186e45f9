// Fused residual add + RMSNorm bandwidth: bytes that must move over time. Forward: x and delta read,
// h and y written; backward: dy, dh_in and h read, dh written (plus rstd and weights, negligible).
// An unfused add + RMSNorm moves 3 + 2 = 5 tensors forward instead of 4.
// Run: bazel-bin/kernels/add_rmsnorm/add_rmsnorm_benchmark on the GPU machine (CPU without one).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

void Run(benchmark::State& state, DType dtype, bool backward) {
  const Device dev = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  const int64_t rows = state.range(0), dim = state.range(1);
  const Shape shape = {rows, dim};
  auto& rng = testing::Rng();
  Tensor x = testing::RandomTensor(shape, dtype, dev, rng), delta = testing::RandomTensor(shape, dtype, dev, rng);
  Tensor w = testing::RandomTensor({dim}, dtype, dev, rng);
  Tensor dy = testing::RandomTensor(shape, dtype, dev, rng), dh_in = testing::RandomTensor(shape, dtype, dev, rng);
  Tensor h = Tensor::Empty(shape, dtype, dev).value(), y = Tensor::Empty(shape, dtype, dev).value();
  Tensor dh = Tensor::Empty(shape, dtype, dev).value();
  Tensor rstd = Tensor::Empty({rows}, DType::kF32, dev).value(), dw = Tensor::Empty({dim}, DType::kF32, dev).value();
  if (!AddRmsNormForward(x, delta, w, 1e-5f, h, y, rstd, stream).ok()) state.SkipWithError("forward failed");
  Event start = Event::Create(dev, true).value(), stop = Event::Create(dev, true).value();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)start.Record(stream);
    absl::Status st = backward ? AddRmsNormBackward(dy, dh_in, h, w, rstd, dh, dw, stream)
                               : AddRmsNormForward(x, delta, w, 1e-5f, h, y, rstd, stream);
    (void)stop.Record(stream);
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
    if (dev.is_cuda()) {
      (void)stop.Synchronize();
      state.SetIterationTime(stop.ElapsedMsSince(start).value() / 1e3);
    } else {
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const int64_t tensor_bytes = rows * dim * SizeOf(dtype);
  state.SetBytesProcessed(state.iterations() * (4 * tensor_bytes + rows * 4));
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + dev.ToString());
}

void BM_AddRmsNormForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_AddRmsNormBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true); }
void BM_AddRmsNormForwardF32(benchmark::State& st) { Run(st, DType::kF32, false); }

// The Llama-1B shape (8 x 2048 tokens, dim 2048), the 7B dim, and a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 2048})->Args({8192, 4096})->Args({256, 256})
BENCHMARK(BM_AddRmsNormForwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_AddRmsNormBackwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_AddRmsNormForwardF32) SG_SHAPES->UseManualTime();

}  // namespace
}  // namespace sg::kernels
