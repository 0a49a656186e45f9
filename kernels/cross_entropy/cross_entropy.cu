// CUDA fused cross-entropy, three launches on one stream, no host synchronization:
//   1. CountKernel: valid = number of targets != ignore_index (one block);
//   2. a row kernel, one block of kThreads per token row:
//      RegisterRowKernel (the row fits kMaxPacksPerThread 16-byte packs per thread and is 16-byte
//        aligned: vocab <= 32768 bf16 or 16384 f32): the row is loaded once (half into registers,
//        half into shared memory by cp.async), reduced to (max, sum-exp) per thread and across the
//        block, and dlogits are written from there: one HBM read and one write per logit;
//      ChunkedRowKernel (longer or unaligned rows, e.g. Llama-3's vocab 128256): an online
//        max/sum-exp sweep over the row, then a second sweep (mostly L2 hits) writing dlogits;
//        SG_CE_KERNEL=chunked (read per call) forces it for every row, for comparison;
//      both write the row's loss to a scratch f32 [rows];
//   3. FinishKernel: loss = sum of row losses in a fixed order (f64) / valid: deterministic.
// The target logit is read before the block's first barrier, so dlogits may overwrite logits.
//
// Why (H200, bf16 16384 x 32000 forward+backward, batch timing: CUDA events around back-to-back
// calls, 2026-11-30): the register kernel with these count/finish kernels 3.52 TB/s; the chunked kernel
// 2.79; torch.compile 1.50 in the same call. Measured and deleted: the first register kernel (an
// exp and a compare per logit per pass, per-pack merges: ALU-bound at 2.36), and persistent CTAs
// streaming whole rows through a shared-memory ring of cp.async row buffers (1024 threads x 3
// buffers 2.23, x 2 buffers 2.06, 512 threads x 3 buffers 2.65; forward only 1.28).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/cross_entropy/cross_entropy_internal.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::cross_entropy_internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// 8 packs of 16 bytes per thread keeps RegisterRowKernel within 64 registers, so two 512-thread
// blocks share an SM and one block's loads overlap the other's reduction and stores. Capacity:
// 512 * 8 * 8 = 32768 bf16 logits (Llama-2's 32000) or 16384 f32 per row.
constexpr int kMaxPacksPerThread = 8;
constexpr float kLog2e = 1.4426950408889634f;

// 16 bytes of T <-> kE floats.
template <typename T> struct Raw16;
template <> struct Raw16<float> {
  static constexpr int kE = 4;
  __device__ static void Unpack(const uint4& r, float (&f)[kE]) {
    f[0] = __uint_as_float(r.x); f[1] = __uint_as_float(r.y); f[2] = __uint_as_float(r.z); f[3] = __uint_as_float(r.w);
  }
  __device__ static uint4 Pack(const float (&f)[kE]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
};
template <> struct Raw16<__nv_bfloat16> {
  static constexpr int kE = 8;
  __device__ static void Unpack(const uint4& r, float (&f)[kE]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __bfloat1622float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
  __device__ static uint4 Pack(const float (&f)[kE]) {
    uint4 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    return r;
  }
};
template <> struct Raw16<__half> {
  static constexpr int kE = 8;
  __device__ static void Unpack(const uint4& r, float (&f)[kE]) {
    const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __half22float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
  __device__ static uint4 Pack(const float (&f)[kE]) {
    uint4 r;
    __half2* h = reinterpret_cast<__half2*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
    return r;
  }
};

// (m, s) <- the pair for the union: max, and sum of exp relative to that max.
__device__ __forceinline__ void Merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * exp2f((m - mx) * kLog2e) + s2 * exp2f((m2 - mx) * kLog2e);
  m = mx;
}

// Combines every thread's (m, s); all threads return the block's pair. Ends with a barrier, so
// shared memory written before the call is visible after it.
__device__ void BlockMerge(float& m, float& s, float* sm_m, float* sm_s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    Merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();
  m = -INFINITY;
  s = 0.f;
  for (int w = 0; w < kWarps; ++w) Merge(m, s, sm_m[w], sm_s[w]);
}

struct RowInfo {
  int64_t target;
  bool ignored, bad;
};

template <typename I>
__device__ __forceinline__ RowInfo InfoFor(const I* targets, int64_t row, int64_t vocab, int64_t ignore) {
  const int64_t t = int64_t(targets[row]);
  const bool ignored = t == ignore;
  return RowInfo{t, ignored, !ignored && (t < 0 || t >= vocab)};
}

// The chunked kernel's row epilogue: the row's loss (thread 0) and the gradient scale.
__device__ __forceinline__ float FinishRow(const RowInfo& info, float lse, float target_logit, float* row_loss,
                                           int64_t row, const int32_t* valid, float grad_scale,
                                           const float* grad_scale_from) {
  if (threadIdx.x == 0) row_loss[row] = info.ignored ? 0.f : info.bad ? NAN : lse - target_logit;
  const int32_t count = *valid;
  if (grad_scale_from != nullptr) grad_scale *= *grad_scale_from;
  return info.ignored || count == 0 ? 0.f : grad_scale / float(count);
}

// ex2.approx with denormal results flushed to zero: one MUFU op (exp2f adds range fix-ups for
// denormals, about three ALU ops per logit). Probabilities below 2^-126 become 0, far under bf16's
// and f32's resolution of a softmax gradient.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The row held on chip, with as little ALU work per logit as the reduction allows (a first version
// with per-pack (max, sum) merges, exp2f and a one-hot compare per logit was ALU-bound next to its
// HBM traffic: ~18 ALU ops per logit, 2.36 TB/s against this kernel's 3.52): the thread's max
// first, then one exp per logit against it, flush-to-zero exp2, and the one-hot correction applied
// only in the pack that holds the target. The raw packs are unpacked again in each pass (cheap) so
// the floats never all live at once.
template <typename T, typename I, int kK>
__global__ void __launch_bounds__(kThreads, 2)
    RegisterRowKernel(const T* logits, const I* __restrict__ targets, T* dlogits, float* __restrict__ row_loss,
                      const int32_t* __restrict__ valid, int64_t vocab, int64_t ignore, float grad_scale,
                      const float* __restrict__ grad_scale_from) {
  using R = Raw16<T>;
  constexpr int kE = R::kE;
  // With 8 packs a thread, 4 go to shared memory (cp.async, no registers while in flight) and 4 stay
  // in registers: all 8 in registers needs 80 registers, and the 64 that two CTAs per SM allow
  // spilled. 32 KiB per CTA.
  constexpr int kInSmem = kK == 8 ? 4 : 0;
  constexpr int kInRegs = kK - kInSmem;
  __shared__ uint4 sm_row[kInSmem > 0 ? kInSmem : 1][kThreads];
  __shared__ float sm_m[kWarps], sm_s[kWarps], sm_target;
  // Thread 0 alone reads the target (its row info reaches the others through shared memory after
  // BlockMerge's barrier): fewer registers live while the row's loads are in flight (zero spills).
  __shared__ int sm_target_index, sm_ignored;
  const int64_t row = blockIdx.x;
  const int packs = int(vocab / kE);
  const T* x = logits + row * vocab;
  uint4 raw[kInRegs];
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int p = int(threadIdx.x) + j * kThreads;
    if (p < packs) {
      if (j < kInRegs) {
        raw[j < kInRegs ? j : 0] = reinterpret_cast<const uint4*>(x)[p];
      } else {
        const unsigned dst = unsigned(__cvta_generic_to_shared(&sm_row[j - kInRegs][threadIdx.x]));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(reinterpret_cast<const uint4*>(x) + p)
                     : "memory");
      }
    }
  }
  if constexpr (kInSmem > 0) {
    // Each thread reads back only its own slots: waiting for its own copies is enough.
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  }
  // Pack j of this thread (j a compile-time index after unrolling).
  auto pack = [&](int j) -> uint4 { return j < kInRegs ? raw[j < kInRegs ? j : 0] : sm_row[j - kInRegs][threadIdx.x]; };
  if (threadIdx.x == 0) {
    const RowInfo info = InfoFor(targets, row, vocab, ignore);
    const bool has_target = !info.ignored && !info.bad;
    const float target_logit = has_target ? cuda_vec::ToF(x[info.target]) : 0.f;
    sm_target = target_logit;
    sm_target_index = has_target ? int(info.target) : -1;
    sm_ignored = info.ignored;
  }
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    if (int(threadIdx.x) + j * kThreads < packs) {
      float f[kE];
      R::Unpack(pack(j), f);
#pragma unroll
      for (int k = 0; k < kE; ++k) m = fmaxf(m, f[k]);
    }
  }
  float s = 0.f;
  if (m != -INFINITY) {
    const float m_scaled = m * kLog2e;
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (int(threadIdx.x) + j * kThreads < packs) {
        float f[kE];
        R::Unpack(pack(j), f);
#pragma unroll
        for (int k = 0; k < kE; ++k) s += Exp2Ftz(fmaf(f[k], kLog2e, -m_scaled));
      }
    }
  }
  BlockMerge(m, s, sm_m, sm_s);  // ends with a barrier: sm_target* are visible
  const float lse = m + logf(s);
  const int target = sm_target_index;
  const bool ignored = sm_ignored != 0;
  if (threadIdx.x == 0) row_loss[row] = ignored ? 0.f : target < 0 ? NAN : lse - sm_target;  // < 0: bad target
  const int32_t count = *valid;
  if (grad_scale_from != nullptr) grad_scale *= *grad_scale_from;
  const float scale = ignored || count == 0 ? 0.f : grad_scale / float(count);
  if (dlogits == nullptr) return;
  const float lse_scaled = lse * kLog2e;
  const int target_pack = target < 0 ? -1 : target / kE;
  uint4* out = reinterpret_cast<uint4*>(dlogits + row * vocab);
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int p = int(threadIdx.x) + j * kThreads;
    if (p < packs) {
      float f[kE];
      R::Unpack(pack(j), f);
#pragma unroll
      for (int k = 0; k < kE; ++k) f[k] = Exp2Ftz(fmaf(f[k], kLog2e, -lse_scaled));
      if (p == target_pack) {
#pragma unroll
        for (int k = 0; k < kE; ++k) f[k] -= p * kE + k == target ? 1.f : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kE; ++k) f[k] *= scale;
      out[p] = R::Pack(f);
    }
  }
}

// kVec: the row in 16-byte packs; otherwise one element per step.
template <typename T, typename I, bool kVec>
__global__ void __launch_bounds__(kThreads)
    ChunkedRowKernel(const T* logits, const I* __restrict__ targets, T* dlogits, float* __restrict__ row_loss,
                     const int32_t* __restrict__ valid, int64_t vocab, int64_t ignore, float grad_scale,
                      const float* __restrict__ grad_scale_from) {
  using R = Raw16<T>;
  constexpr int kE = kVec ? R::kE : 1;
  __shared__ float sm_m[kWarps], sm_s[kWarps], sm_target;
  const int64_t row = blockIdx.x;
  const int64_t steps = vocab / kE;
  const T* x = logits + row * vocab;
  const RowInfo info = InfoFor(targets, row, vocab, ignore);
  if (threadIdx.x == 0) sm_target = info.ignored || info.bad ? 0.f : cuda_vec::ToF(x[info.target]);
  auto load = [&](int64_t i, float (&f)[R::kE]) {
    if constexpr (kVec) {
      R::Unpack(reinterpret_cast<const uint4*>(x)[i], f);
    } else {
      f[0] = cuda_vec::ToF(x[i]);
    }
  };
  float m = -INFINITY, s = 0.f;
  for (int64_t i = threadIdx.x; i < steps; i += kThreads) {
    float f[R::kE];
    load(i, f);
    float cm = f[0];
#pragma unroll
    for (int k = 1; k < kE; ++k) cm = fmaxf(cm, f[k]);
    float cs = 0.f;
#pragma unroll
    for (int k = 0; k < kE; ++k) cs += exp2f((f[k] - cm) * kLog2e);
    Merge(m, s, cm, cs);
  }
  BlockMerge(m, s, sm_m, sm_s);
  const float lse = m + logf(s);
  const float scale = FinishRow(info, lse, sm_target, row_loss, row, valid, grad_scale, grad_scale_from);
  if (dlogits == nullptr) return;
  T* out = dlogits + row * vocab;
  for (int64_t i = threadIdx.x; i < steps; i += kThreads) {
    float f[R::kE];
    load(i, f);
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const float onehot = i * kE + k == info.target ? 1.f : 0.f;
      f[k] = (exp2f((f[k] - lse) * kLog2e) - onehot) * scale;
    }
    if constexpr (kVec) {
      reinterpret_cast<uint4*>(out)[i] = R::Pack(f);
    } else {
      out[i] = cuda_vec::FromF<T>(f[0]);
    }
  }
}

// One block: each thread counts its strided targets (independent loads; a barrier per 1024 targets
// serialized ~16 L2/HBM round trips at 16384 rows), then one block reduction.
template <typename I>
__global__ void __launch_bounds__(1024) CountKernel(const I* targets, int64_t rows, int64_t ignore, int32_t* valid) {
  __shared__ int sm_count[32];
  int c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += 1024) c += int64_t(targets[r]) != ignore;
  c = __reduce_add_sync(0xffffffffu, c);
  if (threadIdx.x % 32 == 0) sm_count[threadIdx.x / 32] = c;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < 32; ++w) total += sm_count[w];
  if (threadIdx.x == 0) *valid = total;
}

// loss = sum of row losses (f64, each thread a fixed strided subset, then fixed shuffle and warp
// trees: deterministic) / valid.
__global__ void __launch_bounds__(1024)
    FinishKernel(const float* row_loss, int64_t rows, const int32_t* valid, float* loss) {
  __shared__ double partial[32];
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += 1024) s += double(row_loss[r]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < 32; ++w) total += partial[w];
    *loss = *valid > 0 ? float(total / double(*valid)) : 0.f;
  }
}

// SG_CE_KERNEL=chunked (read per call): the chunked kernel for every row, for comparison.
bool ForceChunked() {
  const char* v = std::getenv("SG_CE_KERNEL");
  return v != nullptr && std::strcmp(v, "chunked") == 0;
}

template <typename T, typename I>
absl::Status LaunchRows(const Problem& p, const void* logits, const void* targets, float* row_loss,
                        const int32_t* valid, void* dlogits, cudaStream_t s) {
  const T* x = static_cast<const T*>(logits);
  const I* t = static_cast<const I*>(targets);
  T* g = static_cast<T*>(dlogits);
  constexpr int kE = Raw16<T>::kE;
  const bool aligned = p.vocab % kE == 0 && cuda_vec::Aligned16(logits) && cuda_vec::Aligned16(dlogits);
  const int64_t per_thread = (p.vocab / kE + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(p.rows);
#define SG_ARGS x, t, g, row_loss, valid, p.vocab, p.ignore_index, p.grad_scale, p.grad_scale_from
  if (aligned && per_thread <= kMaxPacksPerThread && !ForceChunked()) {
    if (per_thread <= 1) RegisterRowKernel<T, I, 1><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else if (per_thread <= 2) RegisterRowKernel<T, I, 2><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else if (per_thread <= 4) RegisterRowKernel<T, I, 4><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else RegisterRowKernel<T, I, 8><<<grid, kThreads, 0, s>>>(SG_ARGS);
  } else if (aligned) {
    ChunkedRowKernel<T, I, true><<<grid, kThreads, 0, s>>>(SG_ARGS);
  } else {
    ChunkedRowKernel<T, I, false><<<grid, kThreads, 0, s>>>(SG_ARGS);
  }
#undef SG_ARGS
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status CountCuda(const Problem& p, const void* targets, int32_t* valid, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.targets_i64) {
    CountKernel<int64_t><<<1, 1024, 0, s>>>(static_cast<const int64_t*>(targets), p.rows, p.ignore_index, valid);
  } else {
    CountKernel<int32_t><<<1, 1024, 0, s>>>(static_cast<const int32_t*>(targets), p.rows, p.ignore_index, valid);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(CountKernel);
  return absl::OkStatus();
}

absl::Status RowsCuda(const Problem& p, const void* logits, const void* targets, const int32_t* valid,
                      float* row_loss, void* dlogits, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) {
    if (p.targets_i64) return LaunchRows<__nv_bfloat16, int64_t>(p, logits, targets, row_loss, valid, dlogits, s);
    return LaunchRows<__nv_bfloat16, int32_t>(p, logits, targets, row_loss, valid, dlogits, s);
  }
  if (p.dtype == DType::kF16) {
    if (p.targets_i64) return LaunchRows<__half, int64_t>(p, logits, targets, row_loss, valid, dlogits, s);
    return LaunchRows<__half, int32_t>(p, logits, targets, row_loss, valid, dlogits, s);
  }
  if (p.targets_i64) return LaunchRows<float, int64_t>(p, logits, targets, row_loss, valid, dlogits, s);
  return LaunchRows<float, int32_t>(p, logits, targets, row_loss, valid, dlogits, s);
}

absl::Status FinishCuda(int64_t rows, const float* row_loss, const int32_t* valid, float* loss, void* stream) {
  FinishKernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(row_loss, rows, valid, loss);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(FinishKernel);
  return absl::OkStatus();
}

absl::Status RunCuda(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid,
                     void* dlogits, int device, void* stream) {
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(p.rows * int64_t(sizeof(float))));
  float* row_loss = static_cast<float*>(scratch);
  absl::Status st = CountCuda(p, targets, valid, stream);
  if (st.ok()) st.Update(RowsCuda(p, logits, targets, valid, row_loss, dlogits, stream));
  if (st.ok()) st.Update(FinishCuda(p.rows, row_loss, valid, loss, stream));
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

}  // namespace sg::kernels::cross_entropy_internal
