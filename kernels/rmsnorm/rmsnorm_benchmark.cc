// RMSNorm bandwidth: bytes that must move (x read, y written; for the backward dy and x read, dx
// written) over time, on the first CUDA GPU, else the CPU.
// Run: bazel run -c opt //kernels/rmsnorm:rmsnorm_benchmark  (or .gpu/run on the GPU machine).
//
// Two timings. BM_RmsNorm{Forward,Backward}*: CUDA events around one call on an idle GPU, so the
// host's launch latency (a few us, ~10% of a 40 us kernel) is included, as in the PyTorch peer's
// default mode. "Batch": events around kBatch back-to-back calls, divided by kBatch, which is what a
// step captured in a CUDA graph sees (launches overlap the previous kernel); the peer's --batch mode
// measures the same way. BM_RmsNormSweep runs every launch configuration (rmsnorm_launch.h) in the
// batch mode so one run picks the best: --benchmark_filter=Sweep.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm_internal.h"
#include "kernels/rmsnorm/rmsnorm_sweep.h"

namespace sg::kernels {
namespace {

constexpr int kBatch = 20;

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

Setup& TheSetup() {
  static Setup* s = new Setup;
  return *s;
}

struct Buffers {
  Tensor x, w, dy, y, dx, rstd, dw;
};

// One set of buffers per shape, kept across benchmarks (filling 64 MiB tensors dominates otherwise);
// only the most recent shape stays alive.
Buffers& BuffersFor(int64_t rows, int64_t dim, DType dtype) {
  static std::tuple<int64_t, int64_t, DType> key{-1, -1, DType::kF32};
  static std::unique_ptr<Buffers> b;
  if (!b || key != std::make_tuple(rows, dim, dtype)) {
    b.reset();
    Setup& s = TheSetup();
    auto& rng = testing::Rng();
    b = std::make_unique<Buffers>();
    b->x = testing::RandomTensor({rows, dim}, dtype, s.device, rng);
    b->w = testing::RandomTensor({dim}, dtype, s.device, rng);
    b->dy = testing::RandomTensor({rows, dim}, dtype, s.device, rng);
    b->y = Tensor::Empty({rows, dim}, dtype, s.device).value();
    b->dx = Tensor::Empty({rows, dim}, dtype, s.device).value();
    b->rstd = Tensor::Empty({rows}, DType::kF32, s.device).value();
    b->dw = Tensor::Empty({dim}, DType::kF32, s.device).value();
    (void)RmsNormForward(b->x, b->w, 1e-5f, b->y, b->rstd, s.stream);
    key = std::make_tuple(rows, dim, dtype);
  }
  return *b;
}

// Times `calls` back-to-back runs of `fn` per iteration (testing::TimeCalls) and labels the result.
template <typename F>
void Time(benchmark::State& state, int calls, int64_t bytes_per_call, DType dtype, const std::string& label, F fn) {
  Setup& s = TheSetup();
  testing::TimeCalls(state, s.stream, calls, bytes_per_call, fn);
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + s.device.ToString() + " " + label);
}

int64_t Bytes(int64_t rows, int64_t dim, DType dtype, bool backward) {
  const int64_t elem = SizeOf(dtype);
  return backward ? rows * dim * elem * 3 + rows * 4 : rows * dim * elem * 2 + rows * 4;
}

// The public API, one call or kBatch calls per timing.
void Run(benchmark::State& state, DType dtype, bool backward, int calls) {
  const int64_t rows = state.range(0), dim = state.range(1);
  Buffers& b = BuffersFor(rows, dim, dtype);
  const Stream& stream = TheSetup().stream;
  Time(state, calls, Bytes(rows, dim, dtype, backward), dtype, calls == 1 ? "per-call" : "batch", [&] {
    return backward ? RmsNormBackward(b.dy, b.x, b.w, b.rstd, b.dx, b.dw, stream)
                    : RmsNormForward(b.x, b.w, 1e-5f, b.y, b.rstd, stream);
  });
}

void BM_RmsNormForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, 1); }
void BM_RmsNormBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, 1); }
void BM_RmsNormForwardF32(benchmark::State& st) { Run(st, DType::kF32, false, 1); }
void BM_RmsNormForwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, false, kBatch); }
void BM_RmsNormBackwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, true, kBatch); }

// The Llama-1B shape (8 x 2048 tokens, dim 2048), the 7B dim, and a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 2048})->Args({8192, 4096})->Args({256, 256})
BENCHMARK(BM_RmsNormForwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_RmsNormBackwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_RmsNormForwardF32) SG_SHAPES->UseManualTime();
BENCHMARK(BM_RmsNormForwardBF16Batch) SG_SHAPES->UseManualTime();
BENCHMARK(BM_RmsNormBackwardBF16Batch) SG_SHAPES->UseManualTime();

// The ceiling the targets are read against: a device-to-device copy of x into y (read + write of
// one activation, as the forward moves), batch timing.
void BM_CopyCeiling(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1);
  Buffers& b = BuffersFor(rows, dim, DType::kBF16);
  const Stream& stream = TheSetup().stream;
  const int64_t bytes = rows * dim * 2;
  Time(state, kBatch, 2 * bytes, DType::kBF16, "cudaMemcpyAsync", [&]() -> absl::Status {
    return CopyTensor(b.x.view(), b.y.view(), stream);
  });
}
BENCHMARK(BM_CopyCeiling)->Args({16384, 2048})->UseManualTime();

// Every launch configuration (rmsnorm_sweep.h), bf16, batch timing.
void BM_RmsNormSweep(benchmark::State& state) {
  const bool backward = rmsnorm_launch::SweepBackward(state);
  const int64_t rows = state.range(1), dim = state.range(2);
  const rmsnorm_internal::LaunchConfig cfg = rmsnorm_launch::SweepConfig(state);
#ifdef SG_WITH_CUDA
  if (!TheSetup().device.is_cuda()) {
    state.SkipWithError("the sweep needs a CUDA device");
    return;
  }
  Buffers& b = BuffersFor(rows, dim, DType::kBF16);
  const Setup& s = TheSetup();
  rmsnorm_internal::Problem p{rows, dim, DType::kBF16, 1e-5f};
  const int dev = s.device.ordinal;
  auto raw = [](const Tensor& t) { return t.view().raw(); };
  Time(state, kBatch, Bytes(rows, dim, DType::kBF16, backward), DType::kBF16, cfg.ToString(), [&] {
    return backward ? rmsnorm_internal::BackwardCuda(p, raw(b.dy), raw(b.x), raw(b.w), b.rstd.data<float>(),
                                                     raw(b.dx), b.dw.data<float>(), dev, s.stream.native(), cfg)
                    : rmsnorm_internal::ForwardCuda(p, raw(b.x), raw(b.w), raw(b.y), b.rstd.data<float>(), dev,
                                                    s.stream.native(), cfg);
  });
#else
  (void)backward, (void)rows, (void)dim, (void)cfg;
  state.SkipWithError("built without CUDA");
#endif
}

BENCHMARK(BM_RmsNormSweep)->Apply(rmsnorm_launch::SweepArgs)->UseManualTime()->MinTime(0.1);

}  // namespace
}  // namespace sg::kernels
