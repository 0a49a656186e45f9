// Fused residual add + RMSNorm bandwidth: bytes that must move over time. Forward: x and delta read,
// h and y written; backward: dy, dh_in and h read, dh written (plus rstd and weights, negligible).
// An unfused add + RMSNorm moves 3 + 2 = 5 tensors forward instead of 4.
// Run: bazel-bin/kernels/add_rmsnorm/add_rmsnorm_benchmark on the GPU machine (CPU without one).
//
// As in rmsnorm_benchmark: the plain names time one call between CUDA events (host launch latency
// included), "Batch" times kBatch back-to-back calls (what a CUDA-graph step sees), and
// BM_AddRmsNormSweep runs every launch configuration of the shared kernels (batch timing).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/add_rmsnorm/add_rmsnorm_internal.h"
#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"
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
  Tensor x, delta, w, dy, dh_in, h, y, dh, rstd, dw;
};

// One set of buffers per shape, kept across benchmarks; only the most recent shape stays alive.
Buffers& BuffersFor(int64_t rows, int64_t dim, DType dtype) {
  static std::tuple<int64_t, int64_t, DType> key{-1, -1, DType::kF32};
  static std::unique_ptr<Buffers> b;
  if (!b || key != std::make_tuple(rows, dim, dtype)) {
    b.reset();
    Setup& s = TheSetup();
    auto& rng = testing::Rng();
    const Shape shape = {rows, dim};
    b = std::make_unique<Buffers>();
    b->x = testing::RandomTensor(shape, dtype, s.device, rng);
    b->delta = testing::RandomTensor(shape, dtype, s.device, rng);
    b->w = testing::RandomTensor({dim}, dtype, s.device, rng);
    b->dy = testing::RandomTensor(shape, dtype, s.device, rng);
    b->dh_in = testing::RandomTensor(shape, dtype, s.device, rng);
    b->h = Tensor::Empty(shape, dtype, s.device).value();
    b->y = Tensor::Empty(shape, dtype, s.device).value();
    b->dh = Tensor::Empty(shape, dtype, s.device).value();
    b->rstd = Tensor::Empty({rows}, DType::kF32, s.device).value();
    b->dw = Tensor::Empty({dim}, DType::kF32, s.device).value();
    (void)AddRmsNormForward(b->x, b->delta, b->w, 1e-5f, b->h, b->y, b->rstd, s.stream);
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

int64_t Bytes(int64_t rows, int64_t dim, DType dtype) { return 4 * rows * dim * SizeOf(dtype) + rows * 4; }

void Run(benchmark::State& state, DType dtype, bool backward, int calls) {
  const int64_t rows = state.range(0), dim = state.range(1);
  Buffers& b = BuffersFor(rows, dim, dtype);
  const Stream& stream = TheSetup().stream;
  Time(state, calls, Bytes(rows, dim, dtype), dtype, calls == 1 ? "per-call" : "batch", [&] {
    return backward ? AddRmsNormBackward(b.dy, b.dh_in, b.h, b.w, b.rstd, b.dh, b.dw, stream)
                    : AddRmsNormForward(b.x, b.delta, b.w, 1e-5f, b.h, b.y, b.rstd, stream);
  });
}

void BM_AddRmsNormForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false, 1); }
void BM_AddRmsNormBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true, 1); }
void BM_AddRmsNormForwardF32(benchmark::State& st) { Run(st, DType::kF32, false, 1); }
void BM_AddRmsNormForwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, false, kBatch); }
void BM_AddRmsNormBackwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, true, kBatch); }

// The Llama-1B shape (8 x 2048 tokens, dim 2048), the 7B dim, and a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 2048})->Args({8192, 4096})->Args({256, 256})
BENCHMARK(BM_AddRmsNormForwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_AddRmsNormBackwardBF16) SG_SHAPES->UseManualTime();
BENCHMARK(BM_AddRmsNormForwardF32) SG_SHAPES->UseManualTime();
BENCHMARK(BM_AddRmsNormForwardBF16Batch) SG_SHAPES->UseManualTime();
BENCHMARK(BM_AddRmsNormBackwardBF16Batch) SG_SHAPES->UseManualTime();

// Every launch configuration (rmsnorm_sweep.h), bf16, batch timing.
void BM_AddRmsNormSweep(benchmark::State& state) {
  const bool backward = rmsnorm_launch::SweepBackward(state);
  const int64_t rows = state.range(1), dim = state.range(2);
  const add_rmsnorm_internal::LaunchConfig cfg = rmsnorm_launch::SweepConfig(state);
#ifdef SG_WITH_CUDA
  if (!TheSetup().device.is_cuda()) {
    state.SkipWithError("the sweep needs a CUDA device");
    return;
  }
  Buffers& b = BuffersFor(rows, dim, DType::kBF16);
  const Setup& s = TheSetup();
  const add_rmsnorm_internal::Problem p{rows, dim, DType::kBF16, 1e-5f};
  const int dev = s.device.ordinal;
  auto raw = [](const Tensor& t) { return t.view().raw(); };
  Time(state, kBatch, Bytes(rows, dim, DType::kBF16), DType::kBF16, cfg.ToString(), [&] {
    return backward ? add_rmsnorm_internal::BackwardCuda(p, raw(b.dy), raw(b.dh_in), raw(b.h), raw(b.w),
                                                         b.rstd.data<float>(), raw(b.dh), b.dw.data<float>(), dev,
                                                         s.stream.native(), cfg)
                    : add_rmsnorm_internal::ForwardCuda(p, raw(b.x), raw(b.delta), raw(b.w), raw(b.h), raw(b.y),
                                                        b.rstd.data<float>(), dev, s.stream.native(), cfg);
  });
#else
  (void)backward, (void)rows, (void)dim, (void)cfg;
  state.SkipWithError("built without CUDA");
#endif
}

BENCHMARK(BM_AddRmsNormSweep)->Apply(rmsnorm_launch::SweepArgs)->UseManualTime()->MinTime(0.1);

}  // namespace
}  // namespace sg::kernels
