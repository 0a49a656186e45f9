// Elementwise bandwidth: each input read once and each output written once, over time, on the first
// CUDA GPU (else the CPU). Shapes: Llama-1B activations (16384 x 2048) and a 1.2B-element cast.
#include <benchmark/benchmark.h>

#include <functional>

#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"
#include "kernels/elementwise/elementwise.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// Times `op` (testing::TimeCalls, one call per iteration); `bytes` is what one call must move.
void Time(benchmark::State& state, Setup& s, int64_t bytes, const std::function<absl::Status()>& op) {
  testing::TimeCalls(state, s.stream, 1, bytes, op);
  state.SetLabel(s.device.ToString());
}

int64_t N(benchmark::State& st) { return st.range(0); }

void BM_AddBF16(benchmark::State& st) {
  Setup s;
  Tensor a = testing::RandomTensor({N(st)}, DType::kBF16, s.device, testing::Rng());
  Tensor b = testing::RandomTensor({N(st)}, DType::kBF16, s.device, testing::Rng());
  Tensor o = Tensor::Empty({N(st)}, DType::kBF16, s.device).value();
  Time(st, s, 3 * 2 * N(st), [&] { return Add(a, b, o, s.stream); });
}

void BM_AddScaledF32InPlace(benchmark::State& st) {
  Setup s;
  Tensor x = testing::RandomTensor({N(st)}, DType::kF32, s.device, testing::Rng());
  Tensor y = testing::RandomTensor({N(st)}, DType::kF32, s.device, testing::Rng());
  Time(st, s, 3 * 4 * N(st), [&] { return AddScaled(x, 1e-3f, y, y, s.stream); });
}

void BM_ScaleBF16(benchmark::State& st) {
  Setup s;
  Tensor x = testing::RandomTensor({N(st)}, DType::kBF16, s.device, testing::Rng());
  Tensor o = Tensor::Empty({N(st)}, DType::kBF16, s.device).value();
  Time(st, s, 2 * 2 * N(st), [&] { return Scale(x, 0.5f, o, s.stream); });
}

void BM_CastF32ToBF16(benchmark::State& st) {
  Setup s;
  Tensor x = testing::RandomTensor({N(st)}, DType::kF32, s.device, testing::Rng());
  Tensor o = Tensor::Empty({N(st)}, DType::kBF16, s.device).value();
  Time(st, s, (4 + 2) * N(st), [&] { return Cast(x, o, s.stream); });
}

void BM_CastBF16ToF32(benchmark::State& st) {
  Setup s;
  Tensor x = testing::RandomTensor({N(st)}, DType::kBF16, s.device, testing::Rng());
  Tensor o = Tensor::Empty({N(st)}, DType::kF32, s.device).value();
  Time(st, s, (4 + 2) * N(st), [&] { return Cast(x, o, s.stream); });
}

void BM_FillF32(benchmark::State& st) {
  Setup s;
  Tensor o = Tensor::Empty({N(st)}, DType::kF32, s.device).value();
  Time(st, s, 4 * N(st), [&] { return Fill(o, 0.f, s.stream); });
}

void BM_SumRowsBF16(benchmark::State& st) {
  Setup s;
  const int64_t rows = st.range(0) / 2048;
  Tensor x = testing::RandomTensor({rows, 2048}, DType::kBF16, s.device, testing::Rng());
  Tensor o = Tensor::Empty({2048}, DType::kF32, s.device).value();
  Time(st, s, 2 * rows * 2048 + 4 * 2048, [&] { return SumRows(x, o, s.stream); });
}

// 16384 x 2048 activations, a 1.2B-element parameter buffer, and a small CPU-sized case.
#define SG_SIZES ->Arg(int64_t(16384) * 2048)->Arg(int64_t(1200) << 20)->Arg(1 << 16)->UseManualTime()
BENCHMARK(BM_AddBF16) SG_SIZES;
BENCHMARK(BM_AddScaledF32InPlace) SG_SIZES;
BENCHMARK(BM_ScaleBF16) SG_SIZES;
BENCHMARK(BM_CastF32ToBF16) SG_SIZES;
BENCHMARK(BM_CastBF16ToF32) SG_SIZES;
BENCHMARK(BM_FillF32) SG_SIZES;
BENCHMARK(BM_SumRowsBF16)->Arg(int64_t(16384) * 2048)->Arg(1 << 16)->UseManualTime();

}  // namespace
}  // namespace sg::kernels
