// CUDA flash attention: the kernels every family shares (delta, v2's dq conversion, merge) and the
// entry points that pick the family. v2 lives in attention_fwd_v2.cu and attention_bwd_v2.cu, v3's
// forward in attention_fwd_v2.cu (v2's kernel with two switches) and its backward in
// attention_bwd_v3.cu; v4 is v3's backward with the Hopper forward variants of
// attention_fwd_v4.h ("ws", the default, in attention_fwd_v4_ws.cu; "wgmma" in
// attention_fwd_v4_wgmma.cu); v5 (the default family) is v4's forward with the wgmma backward of
// attention_bwd_v5.cu.
//
// Data are bf16 for every family. f16 (IEEE half) runs on families v4 and v5 only, with either v4
// forward (the delta and merge kernels take both); the older families are Unimplemented for f16,
// naming the family.
//
// Where the default family (v5) cannot run a case, the older kernels do (bf16 only): scale <= 0 or
// more than 65535 query tiles -> v3's forward (itself v2's kernel past those limits); seq_k beyond
// 65535 key blocks of 128 -> v2's backward. The first kernels (v1, 0.66-0.72x SDPA on the H200) and
// the diagnostic v3a were deleted on 2026-11-30: v2 and v3 cover every case v1 did.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_fwd_v4.cuh"
#include "kernels/attention/attention_internal.h"
#include "kernels/attention/attention_tiling.h"
#include "kernels/core/status.h"

namespace sg::kernels::internal {
namespace {

using namespace attention_device;  // NOLINT: this file is the helpers' main user

// --- Backward ----------------------------------------------------------------------------------------

// The two-element vector of T (bf16 or f16) and its conversion to floats.
template <typename T>
using Pair = std::conditional_t<kIsF16<T>, __half2, __nv_bfloat162>;
__device__ __forceinline__ float2 PairToFloat2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 PairToFloat2(__half2 v) { return __half22float2(v); }

// delta[b, h, i] = dout_i . out_i: one warp per (b, i, h) row; T is bf16 or f16.
template <typename T, int kD>
__global__ void AttentionDeltaKernel(int64_t rows, int seq, int heads, const T* __restrict__ out,
                                     const T* __restrict__ dout, float* __restrict__ delta) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  constexpr int kPer = kD / 32;
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < kPer; e += 2) {
    const Pair<T> o = *reinterpret_cast<const Pair<T>*>(out + row * kD + lane * kPer + e);
    const Pair<T> d = *reinterpret_cast<const Pair<T>*>(dout + row * kD + lane * kPer + e);
    const float2 of = PairToFloat2(o), df = PairToFloat2(d);
    acc += of.x * df.x + of.y * df.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t b = row / (int64_t(seq) * heads), i = (row / heads) % seq, h = row % heads;
    delta[(b * heads + h) * seq + i] = acc;
  }
}

// dq = scale * dq_accum, 4 elements per thread.
__global__ void ConvertDqKernel(int64_t n4, float scale, const float4* __restrict__ acc,
                                __nv_bfloat162* __restrict__ dq) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 a = acc[i];
  dq[2 * i] = __floats2bfloat162_rn(a.x * scale, a.y * scale);
  dq[2 * i + 1] = __floats2bfloat162_rn(a.z * scale, a.w * scale);
}

// --- Merge --------------------------------------------------------------------------------------------

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF(f16 x) { return __half2float(x); }
template <typename T> __device__ T FromF(float x);
template <> __device__ __forceinline__ float FromF<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 FromF<bf16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ f16 FromF<f16>(float x) { return __float2half_rn(x); }

// One warp per (b, s, h) row. Every lane reads the statistics before any lane writes, so out/lse
// may alias the a or b side.
template <typename T>
__global__ void AttentionMergeKernel(int64_t rows, int seq, int heads, int dim, const T* out_a,
                                     const float* lse_a, const T* out_b, const float* lse_b, T* out,
                                     float* lse) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t b = row / (int64_t(seq) * heads), s = (row / heads) % seq, h = row % heads;
  const int64_t st = (b * heads + h) * seq + s;
  const float la = lse_a[st], lb = lse_b[st], m = fmaxf(la, lb);
  float l = -INFINITY, wa = 0.f, wb = 0.f;
  if (m != -INFINITY) {
    l = m + logf(expf(la - m) + expf(lb - m));
    wa = expf(la - l);
    wb = expf(lb - l);
  }
  __syncwarp();
  for (int d = lane; d < dim; d += 32) {
    out[row * dim + d] = FromF<T>(wa * ToF(out_a[row * dim + d]) + wb * ToF(out_b[row * dim + d]));
  }
  if (lane == 0) lse[st] = l;
}

// --- Launch helpers -----------------------------------------------------------------------------------

template <typename T>
void LaunchDelta(const AttentionParams& p, int64_t blocks, int threads, const void* out,
                 const void* dout, float* delta, cudaStream_t s) {
  const int64_t rows = p.batch * p.seq_q * p.heads;
  const auto* o = static_cast<const T*>(out);
  const auto* d = static_cast<const T*>(dout);
  if (p.head_dim == 64) {
    AttentionDeltaKernel<T, 64><<<unsigned(blocks), threads, 0, s>>>(rows, int(p.seq_q), int(p.heads), o, d, delta);
  } else {
    AttentionDeltaKernel<T, 128><<<unsigned(blocks), threads, 0, s>>>(rows, int(p.seq_q), int(p.heads), o, d, delta);
  }
}

// f16 runs on v4 (the wgmma forward, v3's backward) and on the default family v5 (the wgmma forward
// and backward); the others are bf16.
absl::Status CheckF16Family(const AttentionParams& p, AttentionKernel variant, absl::string_view what) {
  if (p.dtype != DType::kF16 || variant == AttentionKernel::kV4 || variant == AttentionKernel::kV5) {
    return absl::OkStatus();
  }
  const char* names[] = {"v2", "v3", "v4", "v5"};
  return absl::UnimplementedError(absl::StrCat(
      "CUDA attention ", what, ": f16 runs on the kernel families v4 and v5 only; SG_ATTENTION_KERNEL=",
      names[int(variant)], " is bf16-only"));
}

}  // namespace

absl::Status AttentionForwardCuda(const AttentionParams& p, const void* q, const void* k,
                                  const void* v, void* out, float* lse, void* stream) {
  if (p.batch * p.seq_q * p.heads == 0) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(Problem pr, MakeProblem(p));
  SG_ASSIGN_OR_RETURN(AttentionKernel variant, AttentionKernelFromEnv());
  SG_RETURN_IF_ERROR(CheckF16Family(p, variant, "forward"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // v4's kernels (v5's forward too) take the row max on raw scores (scale > 0) and put 128-row
  // query tiles in the grid's y (at most 65535); v3 covers the rest (bf16 only).
  const bool v4_forward = variant == AttentionKernel::kV4 || variant == AttentionKernel::kV5;
  if (v4_forward && pr.scale_log2 > 0.f && p.seq_q <= int64_t(65535) * 128) {
    SG_ASSIGN_OR_RETURN(FwdV4Variant fwd, FwdV4VariantFromEnv());
    return LaunchForwardV4Wgmma(fwd, p.dtype, pr, int(p.head_dim), int(p.batch), q, k, v, out, lse, s);
  }
  if (p.dtype == DType::kF16) {
    return absl::UnimplementedError(absl::StrCat(
        "CUDA attention forward: f16 needs the v4 wgmma forward, which takes scale > 0 and seq_q <= ",
        int64_t(65535) * 128, "; found scale ", p.scale, ", seq_q ", p.seq_q));
  }
  if (variant == AttentionKernel::kV2) {
    return LaunchForwardV2(pr, int(p.head_dim), int(p.batch), q, k, v, out, lse, s);
  }
  return LaunchForwardV3(pr, int(p.head_dim), int(p.batch), q, k, v, out, lse, s);
}

absl::Status AttentionBackwardDeltaCuda(const AttentionParams& p, const void* out,
                                        const void* dout, float* delta, void* stream) {
  const int64_t rows = p.batch * p.seq_q * p.heads;
  if (rows == 0) return absl::OkStatus();
  SG_CHECK_ARG(p.seq_q < (int64_t(1) << 30) && p.heads <= 65535, "CUDA attention delta: sizes out of range");
  constexpr int kThreads = 256;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  SG_CHECK_ARG(blocks < (int64_t(1) << 31), "CUDA attention delta: too many rows (", rows, ")");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kF16) {
    LaunchDelta<f16>(p, blocks, kThreads, out, dout, delta, s);
  } else {
    LaunchDelta<bf16>(p, blocks, kThreads, out, dout, delta, s);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionDeltaKernel);
  return absl::OkStatus();
}

absl::Status AttentionBlockBackwardCuda(const AttentionParams& p, const void* q, const void* k,
                                        const void* v, const void* dout, const float* lse,
                                        const float* delta, float* dq_accum, void* dq, void* dk,
                                        void* dv, void* stream) {
  SG_ASSIGN_OR_RETURN(Problem pr, MakeProblem(p));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t nq = p.batch * p.seq_q * p.heads * p.head_dim;
  const int64_t nk = p.batch * p.seq_k * p.kv_heads * p.head_dim;
  if (nq == 0) {  // no queries: no gradient reaches k or v
    if (nk > 0) {
      SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dk, 0, size_t(nk) * 2, s));
      SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dv, 0, size_t(nk) * 2, s));
    }
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(AttentionKernel variant, AttentionKernelFromEnv());
  SG_RETURN_IF_ERROR(CheckF16Family(p, variant, "backward"));
  // v4's backward is v3's; v5's shares v3's grid limit, workspace layout and dq conversion.
  const bool v3 = variant != AttentionKernel::kV2;
  if (v3 && (p.seq_k + kBwdV3BlockN - 1) / kBwdV3BlockN > 65535) {
    if (p.dtype == DType::kF16) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA attention backward: f16 runs on the v3 and v5 backward, which take seq_k <= ",
          int64_t(65535) * kBwdV3BlockN, ", found ", p.seq_k));
    }
    variant = AttentionKernel::kV2;  // v3's grid holds at most 65535 key blocks (seq_k <= 8M)
  } else if (v3) {  // its own workspace layout and dq conversion
    SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_accum, 0, size_t(DqWorkspaceElems(p)) * sizeof(float), s));
    // seq_k = 0 (nk = 0): no key blocks; the conversion alone writes dq = 0.
    if (variant == AttentionKernel::kV5) {
      return LaunchBackwardV5(p.dtype, pr, int(p.head_dim), int(p.batch), q, k, v, dout, lse, delta,
                              dq_accum, dq, dk, dv, s);
    }
    return LaunchBackwardV3(p.dtype, pr, int(p.head_dim), int(p.batch), q, k, v, dout, lse, delta,
                            dq_accum, dq, dk, dv, s);
  }
  SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_accum, 0, size_t(nq) * sizeof(float), s));
  if (nk > 0) {  // v2, chosen or as the fallback above
    SG_RETURN_IF_ERROR(LaunchBackwardV2(pr, int(p.head_dim), int(p.batch), q, k, v, dout, lse,
                                        delta, dq_accum, dk, dv, s));
  }
  constexpr int kThreads = 256;
  const int64_t n4 = nq / 4;  // head_dim is a multiple of 4
  ConvertDqKernel<<<unsigned((n4 + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      n4, float(p.scale), reinterpret_cast<const float4*>(dq_accum), static_cast<__nv_bfloat162*>(dq));
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ConvertDqKernel);
  return absl::OkStatus();
}

absl::Status AttentionMergeCuda(DType dtype, int64_t batch, int64_t seq, int64_t heads,
                                int64_t head_dim, const void* out_a, const float* lse_a,
                                const void* out_b, const float* lse_b, void* out, float* lse,
                                void* stream) {
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  SG_CHECK_ARG(blocks < (int64_t(1) << 31) && seq < (int64_t(1) << 31) && heads < (int64_t(1) << 31),
               "CUDA attention merge: sizes out of range");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kF32) {
    AttentionMergeKernel<float><<<unsigned(blocks), kThreads, 0, s>>>(
        rows, int(seq), int(heads), int(head_dim), static_cast<const float*>(out_a), lse_a,
        static_cast<const float*>(out_b), lse_b, static_cast<float*>(out), lse);
  } else if (dtype == DType::kF16) {
    AttentionMergeKernel<f16><<<unsigned(blocks), kThreads, 0, s>>>(
        rows, int(seq), int(heads), int(head_dim), static_cast<const f16*>(out_a), lse_a,
        static_cast<const f16*>(out_b), lse_b, static_cast<f16*>(out), lse);
  } else {
    AttentionMergeKernel<bf16><<<unsigned(blocks), kThreads, 0, s>>>(
        rows, int(seq), int(heads), int(head_dim), static_cast<const bf16*>(out_a), lse_a,
        static_cast<const bf16*>(out_b), lse_b, static_cast<bf16*>(out), lse);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionMergeKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::internal
