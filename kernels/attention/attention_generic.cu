// CUDA attention for the cases the flash kernels do not cover: f32, bf16 or f16 data with any
// head_dim up to kGenericMaxDim (the flash families take bf16 / f16 at head_dim 64 or 128 only).
// Small models (a test's two layers of width 32 have head_dim 8) and f32 graphs then train on the
// GPU instead of failing to lower. Plain kernels, one warp per output row, f32 arithmetic:
//   forward:  a warp per (b, i, h) query row, keys 32 at a time (each score q_i.k_j a warp-wide
//             sum over the head, kept by lane j), an online softmax, then out_i += p_j v_j with p_j
//             broadcast by shuffle; every row load is coalesced across the lanes;
//   delta:    a warp per row, dout_i . out_i;
//   dq:       a warp per query row, dq_i = scale sum_j P_ij (dout_i.v_j - delta_i) k_j;
//   dk, dv:   a warp per (b, j, kv head) key row, summing over the group's query heads and rows:
//             dv_j = sum P_ij dout_i, dk_j = scale sum dS_ij q_i.
// Every output element is written by one lane in a fixed order: the results are deterministic (no
// atomics), unlike the flash backward's dq. Full-precision expf, so f32 graphs match the CPU
// reference closely. No tiling and no tensor cores: every warp reads its head's whole K and V, so
// this is a fallback for coverage, not for speed. Measured on the H200 (2026-12-02 02:15,
// attention_benchmark's generic_* beside v5 in one call; B 8, S 2048, 32 heads over 8, causal,
// bf16): forward 64.3 / 67.7 ms at head_dim 64 / 128 against v5's 0.41 / 0.62, backward 226 /
// 250 ms against 1.21 / 2.04: 100-160x slower. The first form (each lane one key's whole dot
// product, uncoalesced) took 163 / 300 ms and 616 / 1154 ms; the scores as warp-wide sums of
// coalesced row loads, as now, were 2.5-4.6x faster.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::internal {
namespace {

constexpr int kWarps = 4;  // rows per CTA
constexpr int kPer = kGenericMaxDim / 32;

using cuda_vec::FromF;
using cuda_vec::ToF;

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The problem in the kernels' terms (32-bit where the checks allow it).
struct Dims {
  int64_t batch, seq_q, seq_k, heads, kv_heads;
  int d;
  float scale;
  int64_t q_offset, k_offset;
  bool causal;
  // Keys [0, KeyEnd(i)) are unmasked for query row i (a causal mask is a prefix of the keys).
  __device__ int64_t KeyEnd(int64_t i) const {
    if (!causal) return seq_k;
    const int64_t e = q_offset + i - k_offset + 1;
    return e < 0 ? 0 : (e > seq_k ? seq_k : e);
  }
  // Query rows [QueryBegin(j), seq_q) see key row j.
  __device__ int64_t QueryBegin(int64_t j) const {
    if (!causal) return 0;
    const int64_t b = k_offset + j - q_offset;
    return b < 0 ? 0 : b;
  }
};

Dims MakeDims(const AttentionParams& p) {
  return Dims{p.batch, p.seq_q, p.seq_k, p.heads, p.kv_heads, int(p.head_dim), float(p.scale),
              p.q_offset, p.k_offset, p.causal};
}

// Row `src` (d elements) as the lane's elements lane + 32 t, in f32 (0 past d).
template <typename T>
__device__ __forceinline__ void LoadLanes(const T* __restrict__ src, int d, int lane, float (&x)[kPer]) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int e = lane + 32 * t;
    x[t] = e < d ? ToF(src[e]) : 0.f;
  }
}

// The dot products of a (held as LoadLanes holds it) with rows jj < here of `rows` (row jj at
// rows + jj * stride), each summed across the warp: lane jj returns row jj's (0 past here). The
// loads of one row are coalesced across the lanes.
template <typename T>
__device__ __forceinline__ float DotRows(const float (&a)[kPer], const T* __restrict__ rows, int64_t stride, int here,
                                         int d, int lane) {
  float mine = 0.f;
  for (int jj = 0; jj < here; ++jj) {
    const T* row = rows + jj * stride;
    float part = 0.f;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int e = lane + 32 * t;
      if (e < d) part += a[t] * ToF(row[e]);
    }
    part = WarpSum(part);
    if (lane == jj) mine = part;
  }
  return mine;
}

// acc (lane's elements lane + 32 t) += sum over jj < here of w from lane jj (a shuffle) times row jj
// of `rows` (row jj at rows + jj * stride): the weighted rows of one block of 32.
template <typename T>
__device__ __forceinline__ void AddWeightedRows(float (&acc)[kPer], float w, const T* __restrict__ rows,
                                                int64_t stride, int here, int d, int lane) {
  for (int jj = 0; jj < here; ++jj) {
    const float wb = __shfl_sync(0xffffffffu, w, jj);
    const T* row = rows + jj * stride;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int e = lane + 32 * t;
      if (e < d) acc[t] += wb * ToF(row[e]);
    }
  }
}

// grid (ceil(seq_q / kWarps), heads, batch), kWarps warps: warp w takes query row
// blockIdx.x * kWarps + w of head blockIdx.y.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    GenericForwardKernel(Dims p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ out, float* __restrict__ lse) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5;
  const int64_t i = int64_t(blockIdx.x) * kWarps + w, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int64_t hk = h / (p.heads / p.kv_heads), stride = p.kv_heads * p.d;
  float qi[kPer];
  LoadLanes(q + ((b * p.seq_q + i) * p.heads + h) * p.d, p.d, lane, qi);
  const int64_t kend = p.KeyEnd(i);
  float m = -INFINITY, l = 0.f, acc[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] = 0.f;
  for (int64_t j0 = 0; j0 < kend; j0 += 32) {
    const int here = int(kend - j0 < 32 ? kend - j0 : 32);
    const int64_t first = ((b * p.seq_k + j0) * p.kv_heads + hk) * p.d;
    const bool valid = lane < here;
    const float dot = DotRows(qi, k + first, stride, here, p.d, lane);  // by every lane (shuffles)
    const float s = valid ? p.scale * dot : -INFINITY;
    const float m_new = fmaxf(m, WarpMax(s));  // finite: lane 0's key is valid
    const float pj = valid ? expf(s - m_new) : 0.f;
    const float corr = expf(m - m_new);        // 0 on the first block (m = -inf)
    l = l * corr + WarpSum(pj);
#pragma unroll
    for (int t = 0; t < kPer; ++t) acc[t] *= corr;
    AddWeightedRows(acc, pj, v + first, stride, here, p.d, lane);
    m = m_new;
  }
  T* oi = out + ((b * p.seq_q + i) * p.heads + h) * p.d;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int e = lane + 32 * t;
    if (e < p.d) oi[e] = FromF<T>(acc[t] * inv);
  }
  if (lane == 0) lse[(b * p.heads + h) * p.seq_q + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

// delta[b, h, i] = dout_i . out_i; grid and warps as the forward's.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    GenericDeltaKernel(Dims p, const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5;
  const int64_t i = int64_t(blockIdx.x) * kWarps + w, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int64_t row = ((b * p.seq_q + i) * p.heads + h) * p.d;
  float s = 0.f;
  for (int e = lane; e < p.d; e += 32) s += ToF(out[row + e]) * ToF(dout[row + e]);
  s = WarpSum(s);
  if (lane == 0) delta[(b * p.heads + h) * p.seq_q + i] = s;
}

// dq_i over the query row's unmasked keys; grid and warps as the forward's.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    GenericDqKernel(Dims p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                    T* __restrict__ dq) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5;
  const int64_t i = int64_t(blockIdx.x) * kWarps + w, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int64_t hk = h / (p.heads / p.kv_heads), row = ((b * p.seq_q + i) * p.heads + h) * p.d;
  const int64_t stride = p.kv_heads * p.d;
  float qi[kPer], doi[kPer];
  LoadLanes(q + row, p.d, lane, qi);
  LoadLanes(dout + row, p.d, lane, doi);
  const float lse_i = lse[(b * p.heads + h) * p.seq_q + i], delta_i = delta[(b * p.heads + h) * p.seq_q + i];
  const int64_t kend = isfinite(lse_i) ? p.KeyEnd(i) : 0;  // lse -inf: every key masked
  float acc[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] = 0.f;
  for (int64_t j0 = 0; j0 < kend; j0 += 32) {
    const int here = int(kend - j0 < 32 ? kend - j0 : 32);
    const int64_t first = ((b * p.seq_k + j0) * p.kv_heads + hk) * p.d;
    const float qk = DotRows(qi, k + first, stride, here, p.d, lane);
    const float dov = DotRows(doi, v + first, stride, here, p.d, lane);
    const float dsj = lane < here ? expf(p.scale * qk - lse_i) * (dov - delta_i) : 0.f;
    AddWeightedRows(acc, dsj, k + first, stride, here, p.d, lane);
  }
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int e = lane + 32 * t;
    if (e < p.d) dq[row + e] = FromF<T>(p.scale * acc[t]);
  }
}

// dk_j and dv_j over the query heads of kv head blockIdx.y's group and the rows that see key j;
// grid (ceil(seq_k / kWarps), kv_heads, batch), warp w takes key row blockIdx.x * kWarps + w.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    GenericDkDvKernel(Dims p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                      T* __restrict__ dk, T* __restrict__ dv) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5;
  const int64_t j = int64_t(blockIdx.x) * kWarps + w, hk = blockIdx.y, b = blockIdx.z;
  if (j >= p.seq_k) return;
  const int64_t kv = ((b * p.seq_k + j) * p.kv_heads + hk) * p.d, group = p.heads / p.kv_heads;
  const int64_t stride = p.heads * p.d;
  float kj[kPer], vj[kPer], dk_acc[kPer], dv_acc[kPer];
  LoadLanes(k + kv, p.d, lane, kj);
  LoadLanes(v + kv, p.d, lane, vj);
#pragma unroll
  for (int t = 0; t < kPer; ++t) dk_acc[t] = dv_acc[t] = 0.f;
  const int64_t ibegin = p.QueryBegin(j);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = ibegin; i0 < p.seq_q; i0 += 32) {
      const int here = int(p.seq_q - i0 < 32 ? p.seq_q - i0 : 32);
      const int64_t first = ((b * p.seq_q + i0) * p.heads + h) * p.d;
      const float qk = DotRows(kj, q + first, stride, here, p.d, lane);
      const float dov = DotRows(vj, dout + first, stride, here, p.d, lane);
      float pij = 0.f, dsij = 0.f;
      if (lane < here) {
        const int64_t stat = (b * p.heads + h) * p.seq_q + i0 + lane;
        const float lse_i = lse[stat];
        if (isfinite(lse_i)) {
          pij = expf(p.scale * qk - lse_i);
          dsij = pij * (dov - delta[stat]);
        }
      }
      AddWeightedRows(dv_acc, pij, dout + first, stride, here, p.d, lane);
      AddWeightedRows(dk_acc, dsij, q + first, stride, here, p.d, lane);
    }
  }
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int e = lane + 32 * t;
    if (e < p.d) {
      dk[kv + e] = FromF<T>(p.scale * dk_acc[t]);
      dv[kv + e] = FromF<T>(dv_acc[t]);
    }
  }
}

absl::Status CheckGrid(const AttentionParams& p, int64_t rows, int64_t heads) {
  SG_CHECK_ARG(p.head_dim >= 1 && p.head_dim <= kGenericMaxDim, "CUDA attention (generic): head_dim in [1, ",
               kGenericMaxDim, "], found ", p.head_dim);
  SG_CHECK_ARG((rows + kWarps - 1) / kWarps < (int64_t(1) << 31) && heads <= 65535 && p.batch <= 65535,
               "CUDA attention (generic): grid out of range (rows ", rows, ", heads ", heads, ", batch ",
               p.batch, ")");
  return absl::OkStatus();
}

dim3 Grid(int64_t rows, int64_t heads, int64_t batch) {
  return dim3(unsigned((rows + kWarps - 1) / kWarps), unsigned(heads), unsigned(batch));
}

// Calls f(T{}) with the CUDA element type of p.dtype.
template <typename F>
void WithCudaType(DType t, F&& f) {
  if (t == DType::kF32) {
    f(float{});
  } else if (t == DType::kF16) {
    f(__half{});
  } else {
    f(__nv_bfloat16{});
  }
}

}  // namespace

absl::Status AttentionForwardGenericCuda(const AttentionParams& p, const void* q, const void* k, const void* v,
                                         void* out, float* lse, void* stream) {
  if (p.batch * p.seq_q * p.heads == 0) return absl::OkStatus();
  SG_RETURN_IF_ERROR(CheckGrid(p, p.seq_q, p.heads));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Dims d = MakeDims(p);
  WithCudaType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    GenericForwardKernel<T><<<Grid(p.seq_q, p.heads, p.batch), kWarps * 32, 0, s>>>(
        d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), lse);
  });
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(GenericForwardKernel);
  return absl::OkStatus();
}

absl::Status AttentionBackwardDeltaGenericCuda(const AttentionParams& p, const void* out, const void* dout,
                                               float* delta, void* stream) {
  if (p.batch * p.seq_q * p.heads == 0) return absl::OkStatus();
  SG_RETURN_IF_ERROR(CheckGrid(p, p.seq_q, p.heads));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Dims d = MakeDims(p);
  WithCudaType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    GenericDeltaKernel<T><<<Grid(p.seq_q, p.heads, p.batch), kWarps * 32, 0, s>>>(
        d, static_cast<const T*>(out), static_cast<const T*>(dout), delta);
  });
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(GenericDeltaKernel);
  return absl::OkStatus();
}

absl::Status AttentionBlockBackwardGenericCuda(const AttentionParams& p, const void* q, const void* k,
                                               const void* v, const void* dout, const float* lse,
                                               const float* delta, void* dq, void* dk, void* dv, void* stream) {
  SG_RETURN_IF_ERROR(CheckGrid(p, std::max(p.seq_q, p.seq_k), std::max(p.heads, p.kv_heads)));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Dims d = MakeDims(p);
  WithCudaType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *qt = static_cast<const T*>(q), *kt = static_cast<const T*>(k), *vt = static_cast<const T*>(v),
            *dt = static_cast<const T*>(dout);
    if (p.batch * p.seq_q * p.heads > 0) {
      GenericDqKernel<T><<<Grid(p.seq_q, p.heads, p.batch), kWarps * 32, 0, s>>>(d, qt, kt, vt, dt, lse, delta,
                                                                                 static_cast<T*>(dq));
    }
    if (p.batch * p.seq_k * p.kv_heads > 0) {
      // With no query rows the sums are empty: dk = dv = 0, written by the same kernel.
      GenericDkDvKernel<T><<<Grid(p.seq_k, p.kv_heads, p.batch), kWarps * 32, 0, s>>>(
          d, qt, kt, vt, dt, lse, delta, static_cast<T*>(dk), static_cast<T*>(dv));
    }
  });
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(GenericDkDvKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::internal
