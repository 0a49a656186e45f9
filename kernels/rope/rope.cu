// CUDA RoPE. Two kernels:
//
// RopeFlatKernel (the default): no loop, 128-thread blocks over consecutive 8-pair chunks, one
// chunk a thread (the shape of torch.compile's memory-bound kernels, as SwiGLU's flat kernel), so
// the last wave is short; every thread issues its two 16-byte loads first, then the block computes
// the cos/sin of the (at most a few) tokens it touches into shared memory while they are in
// flight, then rotates and stores; 32-bit indices with multiply-shift division. It needs the
// 16-byte layout (head_dim % 16 == 0, 16-byte aligned tensors), fewer than 2^31 chunks, and its
// block's cos/sin within 48 KiB of shared memory (always up to head_dim 6144); otherwise the
// token-run kernel runs.
//
// RopeTokensKernel (the fallback; SG_ROPE_KERNEL=tokens forces it, for comparison): a CTA takes a
// run of whole tokens (about kThreads * kItems pair chunks of q and k heads). First its threads
// compute the run's cos/sin once per (token, frequency) into shared memory, then each thread
// rotates kItems chunks: all 2 * kItems loads issued before the first store (so the output may
// alias the input), consecutive threads on consecutive chunks of one head and then the next head.
// It also takes head_dim % 16 != 0 and unaligned tensors, with scalar accesses (kW = 1).
//
// Why flat (H200, q+k bf16 [8, 2048, 32+8, 64], batch timing: CUDA events around back-to-back
// calls, 2026-11-30): forward / backward 3.52 / 3.50 TB/s, against 3.36 / 3.35 for the token-run kernel
// and 3.16 for torch.compile in the same call. A token-run CTA holds 960 chunks (123 KB of traffic)
// at 77 registers, 3 CTAs an SM, ~7 waves whose last is a long partial one, and issues no load
// until its cos/sin are done; a flat block moves 16 KB, 12 an SM (40 registers), ~13 short waves.
// Measured and deleted: one thread per (token, group of 4 heads, chunk) computing its own cos/sin
// (1.91); the flat kernel with registers capped at 32 for 16 blocks an SM (2.34: it spills in the
// cos/sin code; 2.33 with a table); two chunks a thread (3.31 / 3.31). With a precomputed cos/sin
// table the token-run kernel gave 3.29 (3.36 computing the angles).
//
// cos/sin are computed with powf/sincosf in f32, matching the CPU reference, or read from the table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/rope/rope_internal.h"

namespace sg::kernels::rope_internal {
namespace {

using cuda_vec::Pack8;

constexpr int kThreads = 256;

template <typename T, int kW>
__device__ __forceinline__ void Store(T* p, const float (&v)[8]) {
  if constexpr (kW == 8) {
    Pack8<T>::Store(p, v);
  } else {
    *p = cuda_vec::FromF<T>(v[0]);
  }
}

__device__ __forceinline__ int64_t PositionOf(const Problem& p, int64_t token) {
  const int64_t b = token / p.seq, s = token - b * p.seq;
  if (p.positions == nullptr) return p.offset + s;
  const int64_t i = p.positions_per_batch ? token : s;
  return p.positions_i64 ? static_cast<const int64_t*>(p.positions)[i] : static_cast<const int32_t*>(p.positions)[i];
}

// cos/sin of position `pos` at frequency i, as every kernel here computes them: from the table
// (row clamped to the last), or powf/sincosf in f32 as the CPU reference. sin is multiplied by sign.
__device__ __forceinline__ void CosSin(const Problem& p, int64_t pos, int i, float& c, float& s) {
  const int64_t half = p.head_dim / 2;
  if (p.cos != nullptr) {
    pos = pos < p.table_rows ? pos : p.table_rows - 1;
    c = p.cos[pos * half + i];
    s = p.sin[pos * half + i] * p.sign;
  } else {
    const float inv = 1.f / powf(p.theta, float(2 * i) / float(p.head_dim));
    sincosf(float(pos) * inv, &s, &c);
    s *= p.sign;
  }
}

constexpr int kItems = 4;  // chunks per thread in RopeTokensKernel, loads issued together

template <typename T, int kW>
__global__ void __launch_bounds__(kThreads) RopeTokensKernel(Problem p, Buffers buf, int tokens_per_cta) {
  extern __shared__ float angles[];  // cos [tokens_per_cta][half], then sin [tokens_per_cta][half]
  const int half = int(p.head_dim / 2);
  const int chunks = half / kW;
  const int qh = int(p.q_heads), heads = int(p.q_heads + p.k_heads);
  const int64_t tok0 = int64_t(blockIdx.x) * tokens_per_cta;
  const int64_t left = p.batch * p.seq - tok0;
  const int ntok = left < tokens_per_cta ? int(left) : tokens_per_cta;
  float* cs = angles;
  float* sn = angles + tokens_per_cta * half;
  for (int j = threadIdx.x; j < ntok * half; j += kThreads) {
    const int t = j / half, i = j - t * half;
    CosSin(p, PositionOf(p, tok0 + t), i, cs[j], sn[j]);
  }
  __syncthreads();
  const int items = ntok * heads * chunks;
  // 8-pair chunks stay raw (bf16: 4 registers instead of 8) until the angles are applied.
  using Held = std::conditional_t<kW == 8, cuda_vec::Raw8<T>, T>;
  for (int first = 0; first < items; first += kThreads * kItems) {
    int64_t off[kItems];  // element offset of the chunk in q (is_q) or k; -1: no item
    bool is_q[kItems];
    int angle[kItems];
    Held a1[kItems], a2[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int item = first + u * kThreads + int(threadIdx.x);
      off[u] = -1;
      if (item < items) {
        const int c = item % chunks, th = item / chunks;
        const int h = th % heads, t = th / heads;
        const int64_t token = tok0 + t;
        is_q[u] = h < qh;
        off[u] = (is_q[u] ? token * qh + h : token * (heads - qh) + (h - qh)) * p.head_dim + c * kW;
        angle[u] = t * half + c * kW;
        const T* src = static_cast<const T*>(is_q[u] ? buf.q : buf.k) + off[u];
        if constexpr (kW == 8) {
          a1[u] = cuda_vec::LoadRawOnce(src);
          a2[u] = cuda_vec::LoadRawOnce(src + half);
        } else {
          a1[u] = src[0];
          a2[u] = src[half];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      if (off[u] < 0) continue;
      float x1[8], x2[8], y1[8], y2[8];
      if constexpr (kW == 8) {
        cuda_vec::Unpack(a1[u], x1);
        cuda_vec::Unpack(a2[u], x2);
      } else {
        x1[0] = cuda_vec::ToF(a1[u]);
        x2[0] = cuda_vec::ToF(a2[u]);
      }
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const float c = cs[angle[u] + k], sv = sn[angle[u] + k];
        y1[k] = x1[k] * c - x2[k] * sv;
        y2[k] = x2[k] * c + x1[k] * sv;
      }
      T* dst = static_cast<T*>(is_q[u] ? buf.q_out : buf.k_out) + off[u];
      Store<T, kW>(dst, y1);
      Store<T, kW>(dst + half, y2);
    }
  }
}

// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 with a multiply-high, an add and a shift (a runtime
// 32-bit division is ~20 instructions): s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1,
// n / d = (umulhi(n, m) + n) >> s.
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t(1) << s) < d) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t Div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};

// The flat kernel's launch constants. An item is one 8-pair chunk of one head of one token; items
// run token-major (token, then q heads and k heads, then chunk), as the tensors are laid out.
struct FlatShape {
  uint32_t items = 0;      // tokens * per_token.d
  uint32_t half = 0;       // pairs per head
  uint32_t chunks = 0;     // 8-pair chunks per head
  uint32_t qh = 0, kh = 0;
  uint32_t max_tokens = 0;  // rows of the block's cos/sin tables
  FastDiv per_token;        // items per token
  FastDiv per_head;         // chunks per head
  FastDiv per_row;          // half: table entry -> (token, frequency)
  FastDiv seq;
};

constexpr int kFlatThreads = 128;

// One 8-pair chunk (item) a thread; 40 registers, 12 blocks an SM (capped at 32 registers for 16
// blocks it spilled and ran at 2.34 TB/s instead of 3.52).
template <typename T>
__global__ void __launch_bounds__(kFlatThreads) RopeFlatKernel(Problem p, Buffers buf, FlatShape f) {
  extern __shared__ float4 flat_table[];  // cos [max_tokens][half], then sin
  float* cs = reinterpret_cast<float*>(flat_table);
  float* sn = cs + f.max_tokens * f.half;
  const uint32_t first = blockIdx.x * kFlatThreads;
  const uint32_t last = min(first + kFlatThreads, f.items) - 1;
  const uint32_t tok0 = f.per_token.Div(first);
  const uint32_t ntok = f.per_token.Div(last) - tok0 + 1;
  // 1. The thread's loads, before anything else.
  const uint32_t item = first + threadIdx.x;
  cuda_vec::Raw8<T> a1, a2;
  int64_t off = -1;  // element offset of the chunk in q (is_q) or k; -1: no item
  bool is_q;
  uint32_t angle;
  if (item < f.items) {
    const uint32_t t = f.per_token.Div(item), r = item - t * f.per_token.d;
    const uint32_t h = f.per_head.Div(r), c = r - h * f.chunks;
    is_q = h < f.qh;
    const uint32_t row = is_q ? t * f.qh + h : t * f.kh + (h - f.qh);
    off = int64_t(row) * (2 * f.half) + c * 8;
    angle = (t - tok0) * f.half + c * 8;
    const T* src = static_cast<const T*>(is_q ? buf.q : buf.k) + off;
    a1 = cuda_vec::LoadRawOnce(src);
    a2 = cuda_vec::LoadRawOnce(src + f.half);
  }
  // 2. The block's cos/sin while the loads are in flight.
  for (uint32_t j = threadIdx.x; j < ntok * f.half; j += kFlatThreads) {
    const uint32_t tt = f.per_row.Div(j), i = j - tt * f.half;
    const uint32_t token = tok0 + tt;
    const uint32_t b = f.seq.Div(token), s = token - b * f.seq.d;
    int64_t pos = p.offset + s;
    if (p.positions != nullptr) {
      const uint32_t pi = p.positions_per_batch ? token : s;
      pos = p.positions_i64 ? static_cast<const int64_t*>(p.positions)[pi] : static_cast<const int32_t*>(p.positions)[pi];
    }
    CosSin(p, pos, int(i), cs[j], sn[j]);
  }
  __syncthreads();
  // 3. Rotate and store.
  if (off < 0) return;
  float x1[8], x2[8], c[8], sv[8];
  cuda_vec::Unpack(a1, x1);
  cuda_vec::Unpack(a2, x2);
  const float4* c4 = reinterpret_cast<const float4*>(cs + angle);
  const float4* s4 = reinterpret_cast<const float4*>(sn + angle);
  *reinterpret_cast<float4*>(&c[0]) = c4[0];
  *reinterpret_cast<float4*>(&c[4]) = c4[1];
  *reinterpret_cast<float4*>(&sv[0]) = s4[0];
  *reinterpret_cast<float4*>(&sv[4]) = s4[1];
  float y1[8], y2[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    y1[k] = x1[k] * c[k] - x2[k] * sv[k];
    y2[k] = x2[k] * c[k] + x1[k] * sv[k];
  }
  T* dst = static_cast<T*>(is_q ? buf.q_out : buf.k_out) + off;
  Pack8<T>::Store(dst, y1);
  Pack8<T>::Store(dst + f.half, y2);
}

__global__ void TableKernel(float theta, int64_t rows, int64_t half, float* cos, float* sin) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * half) return;
  const int64_t r = idx / half, i = idx % half;
  const float inv = 1.f / powf(theta, float(2 * i) / float(2 * half));
  sincosf(float(r) * inv, &sin[idx], &cos[idx]);
}

// SG_ROPE_KERNEL=tokens (read per call) forces the token-run kernel, for comparison; anything else
// (or unset) takes the flat kernel where it applies.
bool ForceTokens() {
  const char* v = std::getenv("SG_ROPE_KERNEL");
  return v != nullptr && std::strcmp(v, "tokens") == 0;
}

// Launches RopeFlatKernel; false (nothing launched) where it does not apply: chunks or tokens past
// 2^31, or the block's cos/sin over the default 48 KiB of shared memory (a head_dim over 6144).
template <typename T>
bool LaunchFlat(const Problem& p, const Buffers& b, cudaStream_t s) {
  constexpr int64_t kSpan = kFlatThreads;
  const int64_t half = p.head_dim / 2, chunks = half / 8, heads = p.q_heads + p.k_heads;
  const int64_t tokens = p.batch * p.seq, per_token = heads * chunks;
  const int64_t items = tokens * per_token;
  if (items >= (int64_t(1) << 31) - kSpan) return false;
  FlatShape f;
  f.items = uint32_t(items);
  f.half = uint32_t(half);
  f.chunks = uint32_t(chunks);
  f.qh = uint32_t(p.q_heads);
  f.kh = uint32_t(p.k_heads);
  f.max_tokens = uint32_t(std::min<int64_t>(tokens, (kSpan - 1) / per_token + 2));
  const size_t smem = size_t(2) * f.max_tokens * f.half * sizeof(float);
  if (smem > 48 * 1024) return false;
  f.per_token = FastDiv(uint32_t(per_token));
  f.per_head = FastDiv(uint32_t(chunks));
  f.per_row = FastDiv(uint32_t(half));
  f.seq = FastDiv(uint32_t(p.seq));
  const unsigned blocks = unsigned((items + kSpan - 1) / kSpan);
  RopeFlatKernel<T><<<blocks, kFlatThreads, smem, s>>>(p, b, f);
  return true;
}

template <typename T>
absl::Status Apply(const Problem& p, const Buffers& b, cudaStream_t s) {
  const int64_t half = p.head_dim / 2;
  const bool vec = half % 8 == 0 && cuda_vec::Aligned16(b.q) && cuda_vec::Aligned16(b.q_out) &&
                   (p.k_heads == 0 || (cuda_vec::Aligned16(b.k) && cuda_vec::Aligned16(b.k_out)));
  if (vec && !ForceTokens() && LaunchFlat<T>(p, b, s)) {
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RopeFlatKernel);
    return absl::OkStatus();
  }
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t chunks = vec ? half / 8 : half;
  const int64_t tokens = p.batch * p.seq;
  // About kThreads * kItems chunks per CTA, and at most 16 KiB of cos/sin.
  int64_t per_cta = std::max<int64_t>(1, kThreads * kItems / (heads * chunks));
  per_cta = std::min<int64_t>(per_cta, std::max<int64_t>(1, 2048 / half));
  const unsigned blocks = unsigned((tokens + per_cta - 1) / per_cta);
  const size_t smem = size_t(2 * per_cta * half) * sizeof(float);
  if (smem > 48 * 1024) {  // one token of a head_dim > 12288 model
    const int attr = int(smem);
    if (vec) {
      SG_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(RopeTokensKernel<T, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, attr));
    } else {
      SG_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(RopeTokensKernel<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, attr));
    }
  }
  if (vec) {
    RopeTokensKernel<T, 8><<<blocks, kThreads, smem, s>>>(p, b, int(per_cta));
  } else {
    RopeTokensKernel<T, 1><<<blocks, kThreads, smem, s>>>(p, b, int(per_cta));
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RopeTokensKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyCuda(const Problem& p, const Buffers& b, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Apply<__nv_bfloat16>(p, b, s);
  if (p.dtype == DType::kF16) return Apply<__half>(p, b, s);
  return Apply<float>(p, b, s);
}

absl::Status TableCuda(float theta, int64_t rows, int64_t half, float* cos, float* sin, void* stream) {
  const unsigned blocks = unsigned((rows * half + kThreads - 1) / kThreads);
  TableKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(theta, rows, half, cos, sin);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(TableKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::rope_internal
