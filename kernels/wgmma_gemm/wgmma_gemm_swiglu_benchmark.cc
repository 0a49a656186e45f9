// The Llama MLP's up-projection + SwiGLU, h[M, F] = silu(x W1^T) * (x W3^T), bf16, x [M, K], at the
// 1B shapes (M = 16384 tokens, K = 2048, F = 8192 and 5632 per projection), fused against unfused:
//   mode 0: two cuBLASLt GEMMs (MatmulForward into gate and up) + SwiGluForward;
//   mode 1: one cuBLASLt GEMM on the concatenated [W1; W3] into [gate | up] + SwiGluPackedForward;
//   mode 2: our WgmmaGemm on the interleaved W13 + SwiGluPackedForward on the [M F / 128, 256] view
//           (the unfused form on our GEMM: mode 2 - mode 3 is what the epilogue saves);
//   mode 3: WgmmaGemmSwiGlu, h only (the forward when the backward recomputes gate | up);
//   mode 4: WgmmaGemmSwiGlu writing h and the interleaved gate_up (the training forward);
//   modes 5, 6: the GEMM alone, gate_up = x W13^T, by cuBLASLt and by WgmmaGemm (what the SwiGLU
//           epilogue costs on top of the GEMM: mode 3 or 4 against mode 6).
// Batch timing (10 back-to-back calls, CUDA events; kernels/core/benchmark_timing.h). Counters:
// median_us per call; TFLOP/s of the GEMM work 2 M (2F) K; saved_MB, the DRAM bytes the form does not
// move against modes 0-2 (gate_up's write and read back: 2 x 2 M F x 2 bytes for mode 3, the read
// back only for mode 4). The *_TBps counters divide one fixed byte count (x, W13 and h once) by the
// time, so they rank the modes like the time does.
//
// BM_MlpDownSwiGluBackward, the backward's other end at the same shapes: dh = dy[M, K] @ W2[K, F]
// (the down projection's data gradient) and SwiGLU's backward from it, dgate and dup over [M, F]:
//   mode 0: cuBLASLt (MatmulBackward's dx form, W2 as stored) into dh + SwiGluBackward (the step now);
//   mode 1: WgmmaGemm on W2^T into dh + SwiGluBackward (the unfused form on our GEMM);
//   mode 2: WgmmaGemmSwiGluBackward, W2^T ready (dh never written or read back);
//   mode 3: TransposeMatrix(W2) + WgmmaGemmSwiGluBackward (what a step without a kept W2^T runs);
//   mode 4: TransposeMatrix(W2) alone; mode 5: the cuBLASLt GEMM alone.
// Counters as above; TFLOP/s of 2 M F K; saved_MB the dh write and read back (modes 2, 3).
// Run on the GPU machine: bazel-bin/kernels/wgmma_gemm/wgmma_gemm_swiglu_benchmark
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <string>

#include "kernels/core/benchmark_timing.h"
#include "kernels/core/status.h"
#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"
#include "kernels/swiglu/swiglu.h"
#include "kernels/wgmma_gemm/wgmma_gemm.h"
#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

namespace sg::kernels {
namespace {

constexpr int kCalls = 10;

void BM_MlpUpSwiGlu(benchmark::State& state) {
  const int64_t m = state.range(0), f = state.range(1), k = state.range(2), mode = state.range(3);
  if (!CudaAvailable()) {
    state.SkipWithError("needs a CUDA GPU (the fused kernel is sm_90 only)");
    return;
  }
  unsetenv("SG_SWIGLU_KERNEL");  // the default (flat) SwiGLU kernel
  const Device dev = Device::Cuda(0);
  Stream stream = Stream::Create(dev).value();
  auto& rng = testing::Rng();
  const DType t = DType::kBF16;
  Tensor x = testing::RandomTensor({m, k}, t, dev, rng);
  Tensor w13 = testing::RandomTensor({2 * f, k}, t, dev, rng);  // [W1; W3] for mode 1, interleaved else
  Tensor gate_up = Tensor::Empty({m, 2 * f}, t, dev).value(), h = Tensor::Empty({m, f}, t, dev).value();
  const int64_t bytes = (m * k + 2 * f * k + m * f) * SizeOf(t);
  const TensorView w1 = TensorView(w13.view().raw(), t, {f, k}, dev);
  const TensorView w3 = TensorView(static_cast<char*>(w13.view().raw()) + f * k * SizeOf(t), t, {f, k}, dev);
  const TensorView gate = TensorView(gate_up.view().raw(), t, {m, f}, dev);
  const TensorView up = TensorView(static_cast<char*>(gate_up.view().raw()) + m * f * SizeOf(t), t, {m, f}, dev);
  const TensorView gate_up_blocks = gate_up.view().Reshape({m * f / kSwiGluBlock, 2 * kSwiGluBlock}).value();
  const TensorView h_blocks = h.view().Reshape({m * f / kSwiGluBlock, kSwiGluBlock}).value();
  auto call = [&]() -> absl::Status {
    switch (mode) {
      case 0:
        SG_RETURN_IF_ERROR(MatmulForward(x, w1, std::nullopt, gate, stream));
        SG_RETURN_IF_ERROR(MatmulForward(x, w3, std::nullopt, up, stream));
        return SwiGluForward(gate, up, h, stream);
      case 1:
        SG_RETURN_IF_ERROR(MatmulForward(x, w13, std::nullopt, gate_up, stream));
        return SwiGluPackedForward(gate_up, h, stream);
      case 2:
        SG_RETURN_IF_ERROR(WgmmaGemm(x, w13, std::nullopt, gate_up, stream, WgmmaGemmVariant::kTmaStore));
        return SwiGluPackedForward(gate_up_blocks, h_blocks, stream);
      case 3:
        return WgmmaGemmSwiGlu(x, w13, std::nullopt, h, std::nullopt, stream);
      case 4:
        return WgmmaGemmSwiGlu(x, w13, std::nullopt, h, gate_up.view(), stream);
      case 5:
        return MatmulForward(x, w13, std::nullopt, gate_up, stream);
      default:
        return WgmmaGemm(x, w13, std::nullopt, gate_up, stream, WgmmaGemmVariant::kTmaStore);
    }
  };
  testing::TimeCalls(state, stream, kCalls, bytes, call);
  const auto median = state.counters.find("median_TBps");
  if (median != state.counters.end() && median->second.value > 0) {
    const double seconds = double(bytes) / (median->second.value * 1e12);
    state.counters["median_us"] = seconds * 1e6;
    state.counters["TFLOP/s"] = 2.0 * double(m) * double(2 * f) * double(k) / seconds / 1e12;
  }
  const double gate_up_mb = double(m * 2 * f * SizeOf(t)) / 1e6;
  state.counters["saved_MB"] = mode == 3 ? 2 * gate_up_mb : mode == 4 ? gate_up_mb : 0.0;
  const char* names[] = {"cublas x2 + swiglu", "cublas [W1;W3] + packed swiglu", "wgmma W13 + packed swiglu", "fused h",
                         "fused h + gate_up",  "cublas W13 gemm alone",          "wgmma W13 gemm alone"};
  state.SetLabel(std::string(names[mode]) + " bf16@" + dev.ToString());
}
BENCHMARK(BM_MlpUpSwiGlu)
    ->ArgsProduct({{16384}, {8192, 5632}, {2048}, {0, 1, 2, 3, 4, 5, 6}})
    ->ArgNames({"M", "F", "K", "mode"})
    ->UseManualTime();

void BM_MlpDownSwiGluBackward(benchmark::State& state) {
  const int64_t m = state.range(0), f = state.range(1), k = state.range(2), mode = state.range(3);
  if (!CudaAvailable()) {
    state.SkipWithError("needs a CUDA GPU (the fused kernel is sm_90 only)");
    return;
  }
  unsetenv("SG_SWIGLU_KERNEL");
  const Device dev = Device::Cuda(0);
  Stream stream = Stream::Create(dev).value();
  auto& rng = testing::Rng();
  const DType t = DType::kBF16;
  Tensor dy = testing::RandomTensor({m, k}, t, dev, rng), w2 = testing::RandomTensor({k, f}, t, dev, rng);
  Tensor gate = testing::RandomTensor({m, f}, t, dev, rng), up = testing::RandomTensor({m, f}, t, dev, rng);
  Tensor w2t = Tensor::Empty({f, k}, t, dev).value(), dh = Tensor::Empty({m, f}, t, dev).value();
  Tensor dgate = Tensor::Empty({m, f}, t, dev).value(), dup = Tensor::Empty({m, f}, t, dev).value();
  if (absl::Status st = TransposeMatrix(w2, w2t, stream); !st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  // dy, W2, gate and up read once, dgate and dup written once.
  const int64_t bytes = (m * k + k * f + 4 * m * f) * SizeOf(t);
  auto call = [&]() -> absl::Status {
    GemmArgs g;
    g.a = dy;
    g.b = w2;
    g.d = dh;
    switch (mode) {
      case 0:
        SG_RETURN_IF_ERROR(Gemm(g, stream));
        return SwiGluBackward(dh, gate, up, dgate, dup, stream);
      case 1:
        SG_RETURN_IF_ERROR(WgmmaGemm(dy, w2t, std::nullopt, dh, stream, WgmmaGemmVariant::kTmaStore));
        return SwiGluBackward(dh, gate, up, dgate, dup, stream);
      case 2:
        return WgmmaGemmSwiGluBackward(dy, w2t, gate, up, dgate, dup, stream);
      case 3:
        SG_RETURN_IF_ERROR(TransposeMatrix(w2, w2t, stream));
        return WgmmaGemmSwiGluBackward(dy, w2t, gate, up, dgate, dup, stream);
      case 4:
        return TransposeMatrix(w2, w2t, stream);
      default:
        return Gemm(g, stream);
    }
  };
  testing::TimeCalls(state, stream, kCalls, bytes, call);
  const auto median = state.counters.find("median_TBps");
  if (median != state.counters.end() && median->second.value > 0) {
    const double seconds = double(bytes) / (median->second.value * 1e12);
    state.counters["median_us"] = seconds * 1e6;
    state.counters["TFLOP/s"] = 2.0 * double(m) * double(f) * double(k) / seconds / 1e12;
  }
  state.counters["saved_MB"] = mode == 2 || mode == 3 ? 2.0 * double(m * f * SizeOf(t)) / 1e6 : 0.0;
  const char* names[] = {"cublas dx + swiglu bwd", "wgmma W2^T + swiglu bwd", "fused",
                         "transpose + fused",      "transpose alone",         "cublas dx alone"};
  state.SetLabel(std::string(names[mode]) + " bf16@" + dev.ToString());
}
BENCHMARK(BM_MlpDownSwiGluBackward)
    ->ArgsProduct({{16384}, {8192}, {2048}, {0, 1, 2, 3, 4, 5}})
    ->ArgNames({"M", "F", "K", "mode"})
    ->UseManualTime();

}  // namespace
}  // namespace sg::kernels
