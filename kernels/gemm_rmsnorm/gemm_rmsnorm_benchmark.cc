// Fused RMSNorm + GEMM against RMSNorm followed by GEMM at the Llama-1B shapes (16384 tokens, hidden
// 2048; N = 3072 for the fused q/kv projection after the attention norm, 8192 for one MLP projection,
// 16384 for gate and up fused), bf16, forward and backward.
//
// mode 0: unfused (RmsNormForward writes y, then MatmulForward reads it; backward: dY = dout W,
//         dW = dout^T y, RmsNormBackward);
// mode 1: fused, the row scale in cuBLASLt's epilogue (per-row alpha vector);
// mode 2: fused, the row scale as a separate pass over the output (the fallback path);
// mode 3: fused, our Hopper GEMM with the row scale in its epilogue (kernels/wgmma_gemm; forward
//         only: the backward's GEMMs are mode 1's); modes 4 and 5: the same with its tma_store and
//         cluster variants (WgmmaGemmVariant).
// BM_Gemm: the plain GEMM y = x w^T of the same shapes, impl 0: cuBLASLt (MatmulForward), 1: the
// wgmma kernel, 2: cuBLASLt with the row scale in its epilogue, 3: the wgmma kernel with the scale,
// 4 and 5: 3 in the tma_store and cluster variants, 6: the wgmma kernel (tma_store) without a scale,
// so the wgmma kernel's efficiency against cuBLAS is visible apart from the norm. BM_Gemm also runs
// impl 0 and 6 at every forward GEMM shape of the Llama-1B step (q, k/v, o, w1/w3, w2, output).
// BM_LlamaBlockForward: the block's residual add -> RMSNorm -> Linear. mode 0, unfused:
// AddRmsNormForward writes h, y and rstd, cuBLASLt reads y. modes 1-3, fused: AddRmsNormStatsForward
// writes h and rstd only, our GEMM reads h with the folded weight and rstd as its row scale (variant
// registers, tma_store, cluster). saved_MiB: y's write, which the fused form does not do (its GEMM
// reads h where the unfused one reads y: the same bytes), and the add computes rstd anyway, so the
// fused form has no extra pass: it wins once our GEMM is within y's write time (~20 us at 16384 x
// 2048 bf16) of cuBLAS.
// Counters: TFLOP/s of the GEMM work (2*M*N*K forward, twice that backward); saved_MiB, the forward
// bytes the fused form does not move (the [M,K] normalized activation written once: the GEMM then
// reads x instead of y, and both forms read x once for the norm); held_MiB, the activation the unfused
// form keeps from forward to backward and the fused form does not.
// Run on the GPU machine: bazel-bin/kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark
#include <benchmark/benchmark.h>

#include <stdlib.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/core/status.h"
#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_rmsnorm/gemm_rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/wgmma_gemm/wgmma_gemm.h"

namespace sg::kernels {
namespace {

constexpr float kEps = 1e-5f;
constexpr const char* kVariantNames[] = {"registers", "tma_store", "cluster"};

// SG_WGMMA_GEMM_VARIANT=name while in scope (null: left as it is), so the fused forwards, which
// reach WgmmaGemm through GemmRmsNormForward, run the variant under test.
class ScopedVariant {
 public:
  explicit ScopedVariant(const char* name) : set_(name != nullptr) {
    if (set_) setenv("SG_WGMMA_GEMM_VARIANT", name, 1);
  }
  ~ScopedVariant() {
    if (set_) unsetenv("SG_WGMMA_GEMM_VARIANT");
  }
  ScopedVariant(const ScopedVariant&) = delete;
  ScopedVariant& operator=(const ScopedVariant&) = delete;

 private:
  bool set_;
};

// Runs `step` once to warm up, then times it per iteration (CUDA events on a GPU); returns the
// total seconds, 0 after reporting an error.
double TimeSteps(benchmark::State& state, const Device& dev, const Stream& stream,
                 const std::function<absl::Status()>& step) {
  absl::Status st = step();  // warm-up: heuristics, workspaces
  if (!st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return 0;
  }
  (void)stream.Synchronize();
  Event start = Event::Create(dev, true).value(), stop = Event::Create(dev, true).value();
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)start.Record(stream);
    st = step();
    (void)stop.Record(stream);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      return 0;
    }
    double s;
    if (dev.is_cuda()) {
      (void)stop.Synchronize();
      s = stop.ElapsedMsSince(start).value() / 1e3;
    } else {
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    seconds += s;
    state.SetIterationTime(s);
  }
  return seconds;
}

// The GPU when there is one; the CPU runs the small shapes only (SkipTooLarge).
Device BenchDevice() { return CudaAvailable() ? Device::Cuda(0) : Device::Cpu(); }
void SkipTooLarge(benchmark::State& state) { state.SkipWithError("CPU run: shape too large (run on a GPU)"); }

// TFLOP/s from the FLOPs of one iteration and TimeSteps' total seconds.
void SetTflops(benchmark::State& state, double flops_per_iteration, double seconds) {
  if (seconds > 0) state.counters["TFLOP/s"] = flops_per_iteration * double(state.iterations()) / seconds / 1e12;
}

void Run(benchmark::State& state, bool backward) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2), mode = state.range(3);
  const Device dev = BenchDevice();
  if (dev.is_cpu() && m * n * k > (int64_t(1) << 28)) return SkipTooLarge(state);
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  auto& rng = testing::Rng();
  const DType t = DType::kBF16;
  Tensor x = testing::RandomTensor({m, k}, t, dev, rng), w = testing::RandomTensor({n, k}, t, dev, rng);
  Tensor g = testing::RandomTensor({k}, t, dev, rng), dout = testing::RandomTensor({m, n}, t, dev, rng);
  Tensor wf = Tensor::Empty({n, k}, t, dev).value(), y = Tensor::Empty({m, k}, t, dev).value();
  Tensor out = Tensor::Empty({m, n}, t, dev).value(), rstd = Tensor::Empty({m}, DType::kF32, dev).value();
  Tensor dx = Tensor::Empty({m, k}, t, dev).value(), dy = Tensor::Empty({m, k}, t, dev).value();
  Tensor dw = Tensor::Empty({n, k}, DType::kF32, dev).value(), dg = Tensor::Empty({k}, DType::kF32, dev).value();
  GemmRmsNormOptions opts;
  opts.gemm = mode == 1   ? GemmRmsNormGemm::kCublasEpilogue
              : mode == 2 ? GemmRmsNormGemm::kRowScalePass
                          : GemmRmsNormGemm::kWgmma;

  auto step = [&]() -> absl::Status {
    if (mode == 0) {
      if (!backward) {
        SG_RETURN_IF_ERROR(RmsNormForward(x, g, kEps, y, rstd, stream));
        return MatmulForward(y, w, std::nullopt, out, stream);
      }
      GemmArgs gy;  // dY = dout @ W, bf16 like the unfused layer's
      gy.a = dout;
      gy.b = w;
      gy.d = dy;
      SG_RETURN_IF_ERROR(Gemm(gy, stream));
      SG_RETURN_IF_ERROR(MatmulBackward(dout, y, w, std::nullopt, dw, false, stream));
      return RmsNormBackward(dy, x, g, rstd, dx, dg, stream);
    }
    if (!backward) return GemmRmsNormForward(x, wf, kEps, out, rstd, stream, opts);
    return GemmRmsNormBackward(dout, x, w, g, wf, rstd, dx, dw, dg, stream);
  };
  absl::Status st = GemmRmsNormFoldWeight(w, g, wf, stream);
  if (st.ok()) st = RmsNormForward(x, g, kEps, y, rstd, stream);  // y and rstd for the backward
  if (!st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  const ScopedVariant variant(mode >= 3 ? kVariantNames[mode - 3] : nullptr);
  const double seconds = TimeSteps(state, dev, stream, step);
  const double flops = (backward ? 4.0 : 2.0) * double(m) * double(n) * double(k);
  SetTflops(state, flops, seconds);
  const double mib = double(m * k * SizeOf(t)) / (1 << 20);
  state.counters["saved_MiB"] = mode == 0 || backward ? 0.0 : mib;
  state.counters["held_MiB"] = mode == 0 ? mib : 0.0;
  const char* names[] = {"unfused rmsnorm+gemm",           "fused, epilogue row scale",
                         "fused, row-scale pass",          "fused, wgmma epilogue row scale",
                         "fused, wgmma tma_store variant", "fused, wgmma cluster variant"};
  state.SetLabel(std::string(backward ? "bwd " : "fwd ") + names[mode] + " bf16@" + dev.ToString());
}

void BM_GemmRmsNormForward(benchmark::State& st) { Run(st, false); }
void BM_GemmRmsNormBackward(benchmark::State& st) { Run(st, true); }

// The plain GEMM y[M,N] = x[M,K] w[N,K]^T (impl: see the file comment).
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2), impl = state.range(3);
  const Device dev = BenchDevice();
  if (dev.is_cpu() && m * n * k > (int64_t(1) << 28)) return SkipTooLarge(state);
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  auto& rng = testing::Rng();
  const DType t = DType::kBF16;
  Tensor x = testing::RandomTensor({m, k}, t, dev, rng), w = testing::RandomTensor({n, k}, t, dev, rng);
  Tensor scale = testing::RandomTensor({m}, DType::kF32, dev, rng), y = Tensor::Empty({m, n}, t, dev).value();
  auto step = [&]() -> absl::Status {
    if (impl == 0) return MatmulForward(x, w, std::nullopt, y, stream);
    if (impl == 1) return WgmmaGemm(x, w, std::nullopt, y, stream, WgmmaGemmVariant::kRegisterStores);
    if (impl == 3) return WgmmaGemm(x, w, scale.view(), y, stream, WgmmaGemmVariant::kRegisterStores);
    if (impl == 4) return WgmmaGemm(x, w, scale.view(), y, stream, WgmmaGemmVariant::kTmaStore);
    if (impl == 5) return WgmmaGemm(x, w, scale.view(), y, stream, WgmmaGemmVariant::kClusterMulticast);
    if (impl == 6) return WgmmaGemm(x, w, std::nullopt, y, stream, WgmmaGemmVariant::kTmaStore);
    GemmArgs g;
    g.a = x;
    g.b = w;
    g.trans_b = true;
    g.d = y;
    g.row_scale = scale;
    return Gemm(g, stream);
  };
  const double seconds = TimeSteps(state, dev, stream, step);
  SetTflops(state, 2.0 * double(m) * double(n) * double(k), seconds);
  const char* names[] = {"cublas",
                         "wgmma",
                         "cublas row-scale epilogue",
                         "wgmma row-scale epilogue",
                         "wgmma tma_store row-scale epilogue",
                         "wgmma cluster row-scale epilogue",
                         "wgmma tma_store"};
  state.SetLabel(std::string(names[impl]) + " bf16@" + dev.ToString());
}

void Shapes(benchmark::internal::Benchmark* b, int modes) {
  for (int64_t n : {3072, 8192, 16384}) {
    for (int64_t mode = 0; mode < modes; ++mode) b->Args({16384, n, 2048, mode});
  }
  for (int64_t mode = 0; mode < modes; ++mode) b->Args({256, 384, 256, mode});  // small enough for the CPU
  b->ArgNames({"M", "N", "K", "mode"});
}

void GemmShapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {3072, 8192, 16384}) {
    for (int64_t impl : {0, 1, 2, 3, 4, 5, 6}) b->Args({16384, n, 2048, impl});
  }
  for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {512, 2048}, {2048, 8192}, {32000, 2048}}) {
    for (int64_t impl : {0, 6}) b->Args({16384, n, k, impl});
  }
  b->ArgNames({"M", "N", "K", "impl"});
}

// The residual add -> RMSNorm -> Linear of a Llama block (mode: see the file comment).
void BM_LlamaBlockForward(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2), mode = state.range(3);
  const Device dev = BenchDevice();
  if (dev.is_cpu() && m * n * k > (int64_t(1) << 28)) return SkipTooLarge(state);
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  auto& rng = testing::Rng();
  const DType t = DType::kBF16;
  Tensor x = testing::RandomTensor({m, k}, t, dev, rng), delta = testing::RandomTensor({m, k}, t, dev, rng);
  Tensor g = testing::RandomTensor({k}, t, dev, rng), w = testing::RandomTensor({n, k}, t, dev, rng);
  Tensor wf = Tensor::Empty({n, k}, t, dev).value(), h = Tensor::Empty({m, k}, t, dev).value();
  Tensor y = Tensor::Empty({m, k}, t, dev).value(), rstd = Tensor::Empty({m}, DType::kF32, dev).value();
  Tensor out = Tensor::Empty({m, n}, t, dev).value();
  GemmRmsNormOptions opts;
  opts.rstd_given = true;
  opts.gemm = GemmRmsNormGemm::kWgmma;
  auto step = [&]() -> absl::Status {
    if (mode == 0) {
      SG_RETURN_IF_ERROR(AddRmsNormForward(x, delta, g, kEps, h, y, rstd, stream));
      return MatmulForward(y, w, std::nullopt, out, stream);
    }
    SG_RETURN_IF_ERROR(AddRmsNormStatsForward(x, delta, kEps, h, rstd, stream));
    return GemmRmsNormForward(h, wf, kEps, out, rstd, stream, opts);
  };
  const absl::Status st = GemmRmsNormFoldWeight(w, g, wf, stream);  // once per optimizer step: not timed
  if (!st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  const ScopedVariant variant(mode >= 1 ? kVariantNames[mode - 1] : nullptr);
  const double seconds = TimeSteps(state, dev, stream, step);
  SetTflops(state, 2.0 * double(m) * double(n) * double(k), seconds);
  state.counters["saved_MiB"] = mode == 0 ? 0.0 : double(m * k * SizeOf(t)) / (1 << 20);
  const char* names[] = {"unfused add_rmsnorm(h,y,rstd)+cublas(y)", "fused add(h,rstd)+wgmma(h) registers",
                         "fused add(h,rstd)+wgmma(h) tma_store", "fused add(h,rstd)+wgmma(h) cluster"};
  state.SetLabel(std::string(names[mode]) + " bf16@" + dev.ToString());
}

BENCHMARK(BM_GemmRmsNormForward)
    ->Apply([](benchmark::internal::Benchmark* b) { Shapes(b, 6); })
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmRmsNormBackward)
    ->Apply([](benchmark::internal::Benchmark* b) { Shapes(b, 3); })
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gemm)->Apply(GemmShapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LlamaBlockForward)
    ->Apply([](benchmark::internal::Benchmark* b) { Shapes(b, 4); })
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace sg::kernels
