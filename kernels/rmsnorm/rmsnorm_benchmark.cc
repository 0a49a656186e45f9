// RMSNorm bandwidth: bytes that must move (x read, y written; for the backward dy and x read, dx
// written) over time, on the device given by the first available CUDA GPU, else the CPU.
// Run: bazel run -c opt //kernels/rmsnorm:rmsnorm_benchmark  (or .gpu/run on the GPU machine).
#include <benchmark/benchmark.h>

#include "kernels/core/testing.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

void Run(benchmark::State& state, DType dtype, bool backward) {
  Setup s;
  const int64_t rows = state.range(0), dim = state.range(1);
  auto& rng = testing::Rng();
  Tensor x = testing::RandomTensor({rows, dim}, dtype, s.device, rng);
  Tensor w = testing::RandomTensor({dim}, dtype, s.device, rng);
  Tensor dy = testing::RandomTensor({rows, dim}, dtype, s.device, rng);
  Tensor y = Tensor::Empty({rows, dim}, dtype, s.device).value();
  Tensor dx = Tensor::Empty({rows, dim}, dtype, s.device).value();
  Tensor rstd = Tensor::Empty({rows}, DType::kF32, s.device).value();
  Tensor dw = Tensor::Empty({dim}, DType::kF32, s.device).value();
  if (!RmsNormForward(x, w, 1e-5f, y, rstd, s.stream).ok()) state.SkipWithError("forward failed");
  Event start = Event::Create(s.device, true).value(), stop = Event::Create(s.device, true).value();
  for (auto _ : state) {
    (void)start.Record(s.stream);
    absl::Status st = backward ? RmsNormBackward(dy, x, w, rstd, dx, dw, s.stream)
                               : RmsNormForward(x, w, 1e-5f, y, rstd, s.stream);
    (void)stop.Record(s.stream);
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
    if (s.device.is_cuda()) {
      (void)stop.Synchronize();
      state.SetIterationTime(stop.ElapsedMsSince(start).value() / 1e3);
    }
  }
  const int64_t elem = SizeOf(dtype);
  const int64_t bytes = backward ? rows * dim * elem * 3 + rows * 4 : rows * dim * elem * 2 + rows * 4;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + s.device.ToString());
}

void BM_RmsNormForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_RmsNormBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true); }
void BM_RmsNormForwardF32(benchmark::State& st) { Run(st, DType::kF32, false); }

// The Llama-1B shape (8 x 2048 tokens, dim 2048), the 7B dim, and a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 2048})->Args({8192, 4096})->Args({256, 256})
BENCHMARK(BM_RmsNormForwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_RmsNormBackwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_RmsNormForwardF32) SG_SHAPES->UseManualTime();

}  // namespace
}  // namespace sg::kernels
