// AdamW bandwidth over a Llama-1B-sized parameter set (1.2e9 f32 parameters in 16 tensors): per
// element the update reads param, grad, m, v and writes param, m, v and the bf16 copy
// (4+g+4+4 + 4+4+4+2 bytes, g = 4 for f32 gradients, 2 for bf16; the NoCopy entries have no copy:
// 28 bytes with f32 gradients, byte for byte torch.optim.AdamW's step). GradNorm reads the gradients.
// H200, 2026-11-30, at 1258291200 elements, the current kernel (then the variant flat_u1): F32Grad
// 9.08 ms (4.16 TB/s), F32GradNoCopy 8.49 ms (4.15 TB/s); adamw.cu's header has the whole sweep.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// copy: a bf16 copy of every parameter written by the step.
void Run(benchmark::State& state, DType grad_dtype, bool norm, bool copy = true) {
  Setup s;
  const int64_t total = state.range(0), tensors = 16, n = total / tensors;
  std::vector<Tensor> owners;
  std::vector<AdamWParam> params;
  for (int64_t i = 0; i < tensors; ++i) {
    // Random parameters, gradients and first moments (not zeros); v starts at 0, its valid floor.
    Tensor p = testing::RandomTensor({n}, DType::kF32, s.device, testing::Rng());
    Tensor g = testing::RandomTensor({n}, grad_dtype, s.device, testing::Rng(), 1e-2f);
    Tensor m = testing::RandomTensor({n}, DType::kF32, s.device, testing::Rng(), 1e-3f);
    Tensor v = Tensor::Empty({n}, DType::kF32, s.device).value();
    Tensor c = copy ? Tensor::Empty({n}, DType::kBF16, s.device).value() : Tensor();
    (void)ZeroTensor(v, s.stream);
    params.push_back({p, g, m, v, copy ? c.view() : TensorView(), 0.1f});
    for (Tensor* t : {&p, &g, &m, &v, &c}) owners.push_back(*t);
  }
  auto list = AdamWTensorList::Create(params).value();
  Tensor lr = testing::FromHost({1e-4}, {}, DType::kF32, s.device);
  Tensor step = testing::FromHost({0}, {}, DType::kI32, s.device);
  Tensor out = Tensor::Empty({}, DType::kF32, s.device).value();
  Tensor clip = Tensor::Empty({}, DType::kF32, s.device).value();
  const int64_t g = SizeOf(grad_dtype);
  const int64_t bytes = list.numel() * (norm ? g : 4 + g + 4 + 4 + 4 + 4 + 4 + (copy ? 2 : 0));
  testing::TimeCalls(state, s.stream, 1, bytes, [&] {
    return norm ? GradNorm(list, 1.f, out, clip, s.stream) : AdamWStep(list, {}, lr, step, TensorView(), s.stream);
  });
  state.SetLabel(std::string("grad ") + std::string(DTypeName(grad_dtype)) + "@" + s.device.ToString() +
                 (norm ? "" : (copy ? " +bf16 copy" : " no copy")));
}

void BM_AdamWStepF32Grad(benchmark::State& st) { Run(st, DType::kF32, false); }
void BM_AdamWStepF32GradNoCopy(benchmark::State& st) { Run(st, DType::kF32, false, false); }
void BM_AdamWStepBF16Grad(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_GradNormF32(benchmark::State& st) { Run(st, DType::kF32, true); }

#define SG_SIZES ->Arg(int64_t(1200) << 20)->Arg(1 << 20)->UseManualTime()
BENCHMARK(BM_AdamWStepF32Grad) SG_SIZES;
BENCHMARK(BM_AdamWStepF32GradNoCopy) SG_SIZES;
BENCHMARK(BM_AdamWStepBF16Grad) SG_SIZES;
BENCHMARK(BM_GradNormF32) SG_SIZES;

}  // namespace
}  // namespace sg::kernels
