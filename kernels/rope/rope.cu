// CUDA RoPE. One thread per (token, group of kGroup heads, chunk of kW pair indices): it computes
// cos/sin for its kW frequencies once (powf/sincosf in f32, matching the CPU reference) and reuses
// them for every head of its group, q heads first and then k heads. The group's 2 * kGroup loads
// (16 bytes each for bf16 with kW = 8) are all issued before the first store, so enough bytes are in
// flight even when the output aliases the input (the compiler may not reorder across the alias).
// head_dim % 16 != 0 or unaligned tensors take kW = 1 with scalar accesses.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/rope/rope_internal.h"

namespace sg::kernels::rope_internal {
namespace {

using cuda_vec::Pack8;

constexpr int kThreads = 256;
constexpr int kGroup = 4;

template <typename T, int kW>
__device__ __forceinline__ void Load(const T* p, float (&v)[8]) {
  if constexpr (kW == 8) {
    Pack8<T>::Load(p, v);
  } else {
    v[0] = cuda_vec::ToF(*p);
  }
}
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

template <typename T, int kW>
__global__ void __launch_bounds__(kThreads) RopeKernel(Problem p, Buffers buf) {
  const int64_t half = p.head_dim / 2;
  const int64_t chunks = half / kW;
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t groups = (heads + kGroup - 1) / kGroup;
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.batch * p.seq * groups * chunks) return;
  const int64_t c = idx % chunks;
  const int64_t g = (idx / chunks) % groups;
  const int64_t token = idx / (chunks * groups);
  const int64_t i0 = c * kW;

  int64_t pos = PositionOf(p, token);
  float cs[8], sn[8];
  if (p.cos != nullptr) {
    pos = pos < p.table_rows ? pos : p.table_rows - 1;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      cs[k] = p.cos[pos * half + i0 + k];
      sn[k] = p.sin[pos * half + i0 + k] * p.sign;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const float inv = 1.f / powf(p.theta, float(2 * (i0 + k)) / float(p.head_dim));
      sincosf(float(pos) * inv, &sn[k], &cs[k]);
      sn[k] *= p.sign;
    }
  }

  // Base pointers of the group's heads (nullptr past the last head).
  const T* src[kGroup];
  T* dst[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const int64_t h = g * kGroup + j;
    if (h < p.q_heads) {
      src[j] = static_cast<const T*>(buf.q) + (token * p.q_heads + h) * p.head_dim + i0;
      dst[j] = static_cast<T*>(buf.q_out) + (token * p.q_heads + h) * p.head_dim + i0;
    } else if (h < heads) {
      src[j] = static_cast<const T*>(buf.k) + (token * p.k_heads + h - p.q_heads) * p.head_dim + i0;
      dst[j] = static_cast<T*>(buf.k_out) + (token * p.k_heads + h - p.q_heads) * p.head_dim + i0;
    } else {
      src[j] = nullptr;
      dst[j] = nullptr;
    }
  }
  float x1[kGroup][8], x2[kGroup][8];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    if (src[j] != nullptr) {
      Load<T, kW>(src[j], x1[j]);
      Load<T, kW>(src[j] + half, x2[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    if (dst[j] == nullptr) continue;
    float y1[8], y2[8];
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      y1[k] = x1[j][k] * cs[k] - x2[j][k] * sn[k];
      y2[k] = x2[j][k] * cs[k] + x1[j][k] * sn[k];
    }
    Store<T, kW>(dst[j], y1);
    Store<T, kW>(dst[j] + half, y2);
  }
}

__global__ void TableKernel(float theta, int64_t rows, int64_t half, float* cos, float* sin) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * half) return;
  const int64_t r = idx / half, i = idx % half;
  const float inv = 1.f / powf(theta, float(2 * i) / float(2 * half));
  sincosf(float(r) * inv, &sin[idx], &cos[idx]);
}

template <typename T>
absl::Status Apply(const Problem& p, const Buffers& b, cudaStream_t s) {
  const int64_t half = p.head_dim / 2;
  const bool vec = half % 8 == 0 && cuda_vec::Aligned16(b.q) && cuda_vec::Aligned16(b.q_out) &&
                   (p.k_heads == 0 || (cuda_vec::Aligned16(b.k) && cuda_vec::Aligned16(b.k_out)));
  const int64_t groups = (p.q_heads + p.k_heads + kGroup - 1) / kGroup;
  const int64_t threads = p.batch * p.seq * groups * (vec ? half / 8 : half);
  const unsigned blocks = unsigned((threads + kThreads - 1) / kThreads);
  if (vec) {
    RopeKernel<T, 8><<<blocks, kThreads, 0, s>>>(p, b);
  } else {
    RopeKernel<T, 1><<<blocks, kThreads, 0, s>>>(p, b);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RopeKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyCuda(const Problem& p, const Buffers& b, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Apply<__nv_bfloat16>(p, b, s);
  return Apply<float>(p, b, s);
}

absl::Status TableCuda(float theta, int64_t rows, int64_t half, float* cos, float* sin, void* stream) {
  const unsigned blocks = unsigned((rows * half + kThreads - 1) / kThreads);
  TableKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(theta, rows, half, cos, sin);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(TableKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::rope_internal
