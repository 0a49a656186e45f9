// Flash attention throughput on CUDA: B=8, S=2048, H=32, KV=8 (GQA 4), D=64/128, causal and not.
// TFLOP/s counts the useful flops: forward 4*B*S^2*H*D (halved when causal), backward 2.5x that.
// Compare with kernels/attention/sdpa_peer.py (PyTorch SDPA, flash backend) on the same machine.
// `variant` picks the kernel family (SG_ATTENTION_KERNEL, set here per benchmark): 2 = v2, 3 = v3,
// 5 = v5 (the Hopper wgmma backward; backward only, its forward is v4's), 9 = the generic kernels
// (attention_generic.cu; BM_AttentionCuda/generic_* run them beside v5 at the same shapes, to show
// what a head the flash kernels do not take costs).
// BM_AttentionCuda/forward_v4 runs the v4 forward variants (SG_ATTN_FWD_VARIANT, the label names
// it; attention_fwd_v4.h lists them; variant = 100 + its index in kFwdV4Variants: wgmma 100, ws 101).
// BM_AttentionCudaDefault runs the default kernels (both variables unset) on bf16 and on f16 data
// (the label names it): f16 should match bf16. Its forward_batch and backward_batch time them as
// the peer is timed: 30 calls back to back between two events (sdpa_peer.py's ITERS), so the clocks
// are those of sustained work; the per-call benchmarks synchronize after each call, and the idle
// gaps may let the clocks rise.
//
//   bazel run -c opt //kernels/attention:attention_benchmark
//   attention_benchmark --benchmark_filter='forward'   # v2, v3 and both v4 forward variants
//   attention_benchmark --benchmark_filter='backward'  # v2, v3, v5 and the default (v5)
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_fwd_v4.h"
#include "kernels/core/device.h"
#include "kernels/core/status.h"
#include "kernels/core/tensor.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

constexpr int64_t kBatch = 8, kSeq = 2048, kHeads = 32, kKvHeads = 8;

double ForwardFlops(int64_t dim, bool causal) {
  return 4.0 * kBatch * kSeq * kSeq * kHeads * dim / (causal ? 2.0 : 1.0);
}

// Times `fn` with CUDA events (manual time), `calls` calls back to back per timed iteration;
// errors end the benchmark with the status text.
template <typename Fn>
void TimeOnDevice(benchmark::State& state, const Stream& stream, double flops, Fn fn, int calls = 1) {
  auto start = Event::Create(stream.device(), /*timing=*/true);
  auto stop = Event::Create(stream.device(), /*timing=*/true);
  if (!start.ok() || !stop.ok()) return state.SkipWithError("event creation failed");
  for (int i = 0; i < 3; ++i) {  // warm-up (smem attributes, caches, clocks)
    if (absl::Status s = fn(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  for (auto _ : state) {
    (void)start->Record(stream);
    absl::Status s;
    for (int c = 0; c < calls && s.ok(); ++c) s = fn();
    (void)stop->Record(stream);
    if (s.ok()) s = stop->Synchronize();
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
    state.SetIterationTime(double(stop->ElapsedMsSince(*start).value()) / 1e3 / calls);
  }
  state.counters["TFLOP/s"] = benchmark::Counter(flops * double(state.iterations()) / 1e12,
                                                 benchmark::Counter::kIsRate);
  state.counters["calls"] = calls;
}

struct Buffers {
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
};

absl::StatusOr<Buffers> MakeBuffers(int64_t dim, DType dtype, const Stream& stream) {
  const Device d = stream.device();
  const Shape qs = {kBatch, kSeq, kHeads, dim}, ks = {kBatch, kSeq, kKvHeads, dim};
  Buffers b;
  // Random inputs, not zeros: tensor cores draw less power on zeros, so the clocks (and the
  // TFLOP/s) of an all-zero problem run higher than in a training step.
  std::mt19937_64& rng = testing::Rng();
  for (auto [t, s] : {std::pair{&b.q, qs}, {&b.k, ks}, {&b.v, ks}, {&b.dout, qs}}) *t = testing::RandomTensor(s, dtype, d, rng);
  for (auto [t, s] : {std::pair{&b.out, qs}, {&b.dq, qs}, {&b.dk, ks}, {&b.dv, ks}}) {
    SG_ASSIGN_OR_RETURN(*t, Tensor::Empty(s, dtype, d));
  }
  SG_ASSIGN_OR_RETURN(b.lse, Tensor::Empty({kBatch, kHeads, kSeq}, DType::kF32, d));
  // The backward reads the forward's out and lse, as in a step.
  SG_RETURN_IF_ERROR(AttentionForward(b.q, b.k, b.v, {}, b.out, b.lse, stream));
  return b;
}

// Times the forward or backward of the kernels the environment picks, on `dtype` data, at D =
// range(0), causal = range(1); `calls` back to back per timed iteration.
void TimeAttention(benchmark::State& state, bool backward, DType dtype, int calls = 1) {
  const int64_t dim = state.range(0);
  const bool causal = state.range(1) != 0;
  if (!CudaAvailable()) return state.SkipWithError(CudaUnavailableReason().c_str());
  auto stream = Stream::Create(Device::Cuda(0));
  if (!stream.ok()) return state.SkipWithError(stream.status().ToString().c_str());
  auto bufs = MakeBuffers(dim, dtype, *stream);
  if (!bufs.ok()) return state.SkipWithError(bufs.status().ToString().c_str());
  Buffers& b = *bufs;
  AttentionOptions opt;
  opt.causal = causal;
  const double fwd = ForwardFlops(dim, causal);
  if (!backward) {
    TimeOnDevice(
        state, *stream, fwd, [&] { return AttentionForward(b.q, b.k, b.v, opt, b.out, b.lse, *stream); }, calls);
  } else {
    TimeOnDevice(
        state, *stream, 2.5 * fwd,
        [&] { return AttentionBackward(b.q, b.k, b.v, b.out, b.dout, b.lse, opt, b.dq, b.dk, b.dv, *stream); },
        calls);
  }
}

// variant: 2, 3, 5 as in the file comment; 100 + i is family v4 with forward variant kFwdV4Variants[i].
void BM_AttentionCuda(benchmark::State& state, bool backward) {
  const int64_t variant = state.range(2);
  if (variant >= 100) {
    const char* fwd = internal::kFwdV4Variants[variant - 100].name;
    setenv("SG_ATTENTION_KERNEL", "v4", 1);
    setenv("SG_ATTN_FWD_VARIANT", fwd, 1);
    state.SetLabel(fwd);
  } else {
    const char* name = variant == 2 ? "v2" : variant == 3 ? "v3" : variant == 9 ? "generic" : "v5";
    setenv("SG_ATTENTION_KERNEL", name, 1);
    unsetenv("SG_ATTN_FWD_VARIANT");
    state.SetLabel(name);
  }
  TimeAttention(state, backward, DType::kBF16);
}

void Shapes(benchmark::internal::Benchmark* b, const std::vector<int64_t>& variants) {
  b->ArgNames({"D", "causal", "variant"});
  for (int64_t dim : {64, 128}) {
    for (int64_t causal : {1, 0}) {
      for (int64_t variant : variants) b->Args({dim, causal, variant});
    }
  }
  b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
}
void ForwardShapes(benchmark::internal::Benchmark* b) { Shapes(b, {2, 3}); }
void ForwardV4Shapes(benchmark::internal::Benchmark* b) {
  std::vector<int64_t> variants;
  for (size_t i = 0; i < std::size(internal::kFwdV4Variants); ++i) variants.push_back(100 + int64_t(i));
  Shapes(b, variants);
}
void BackwardShapes(benchmark::internal::Benchmark* b) { Shapes(b, {2, 3, 5}); }
void GenericShapes(benchmark::internal::Benchmark* b) { Shapes(b, {5, 9}); }

BENCHMARK_CAPTURE(BM_AttentionCuda, forward, false)->Apply(ForwardShapes);
BENCHMARK_CAPTURE(BM_AttentionCuda, forward_v4, false)->Apply(ForwardV4Shapes);
BENCHMARK_CAPTURE(BM_AttentionCuda, backward, true)->Apply(BackwardShapes);
BENCHMARK_CAPTURE(BM_AttentionCuda, generic_forward, false)->Apply(GenericShapes);
BENCHMARK_CAPTURE(BM_AttentionCuda, generic_backward, true)->Apply(GenericShapes);

// The default kernels; dtype = range(2): 0 bf16, 1 f16; `calls` back to back per timed iteration.
void BM_AttentionCudaDefault(benchmark::State& state, bool backward, int calls) {
  unsetenv("SG_ATTENTION_KERNEL");
  unsetenv("SG_ATTN_FWD_VARIANT");
  const DType dtype = state.range(2) == 1 ? DType::kF16 : DType::kBF16;
  state.SetLabel(std::string(DTypeName(dtype)) + (calls > 1 ? " batch" : " per-call"));
  TimeAttention(state, backward, dtype, calls);
}
constexpr int kPeerIters = 30;  // sdpa_peer.py's ITERS
void DtypeShapes(benchmark::internal::Benchmark* b) {
  Shapes(b, {0, 1});
  b->ArgNames({"D", "causal", "f16"});
}
BENCHMARK_CAPTURE(BM_AttentionCudaDefault, forward, false, 1)->Apply(DtypeShapes);
BENCHMARK_CAPTURE(BM_AttentionCudaDefault, backward, true, 1)->Apply(DtypeShapes);
// A batch iteration reports one call's time (the batch's over kPeerIters), so the minimum time is
// scaled down with it: at 1 s, each ran ~40 s of calls (2026-12-04, gpu_call127.sh).
void BatchShapes(benchmark::internal::Benchmark* b) {
  DtypeShapes(b);
  b->MinTime(1.0 / kPeerIters);
}
BENCHMARK_CAPTURE(BM_AttentionCudaDefault, forward_batch, false, kPeerIters)->Apply(BatchShapes);
BENCHMARK_CAPTURE(BM_AttentionCudaDefault, backward_batch, true, kPeerIters)->Apply(BatchShapes);

}  // namespace
}  // namespace sg::kernels
