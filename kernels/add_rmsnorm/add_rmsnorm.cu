// CUDA fused residual add + RMSNorm, on the RMSNorm kernels' plan (kernels/rmsnorm/rmsnorm.cu).
// Fast path (dim a multiple of 16 bytes, at most 16 vectors per lane): one warp per row, 16-byte
// accesses with vector v on lane v % 32 so every warp-wide access is coalesced. The forward keeps the
// row of h in registers between the sum of squares and the output, so x and delta are read once and
// h and y written once. The backward accumulates the weight gradient's per-column partial sums in
// registers over a grid-stride loop, combines the block's warps in shared memory in a fixed order,
// and a second kernel sums the per-block partials in block order: deterministic, no atomics. Other
// shapes take a block-per-row path.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/add_rmsnorm/add_rmsnorm_internal.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"

namespace sg::kernels::add_rmsnorm_internal {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16 bytes of T as floats, and back.
template <typename T> struct Vec;
template <> struct Vec<float> {
  static constexpr int kN = 4;
  __device__ static void Load(const float* p, float (&out)[kN]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
  }
  __device__ static void Store(float* p, const float (&in)[kN]) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  }
  // Rounds to the storage type in place (a no-op for f32).
  __device__ static void Round(float (&)[kN]) {}
};
template <> struct Vec<__nv_bfloat16> {
  static constexpr int kN = 8;
  __device__ static void Load(const __nv_bfloat16* p, float (&out)[kN]) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __device__ static void Store(__nv_bfloat16* p, const float (&in)[kN]) {
    uint4 v;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = v;
  }
  __device__ static void Round(float (&v)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
  }
};

template <typename T> __device__ __forceinline__ float Get(const T* p, int64_t i);
template <> __device__ __forceinline__ float Get(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float Get(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
template <typename T> __device__ __forceinline__ T Make(float v);
template <> __device__ __forceinline__ float Make(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 Make(float v) { return __float2bfloat16_rn(v); }

// --- fast path -----------------------------------------------------------------------------------
// x may equal h (in place), so neither carries __restrict__; likewise dh_in and dh.

template <typename T, int kVecs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    ForwardWarpKernel(const T* x, const T* __restrict__ delta, const T* __restrict__ w, T* h, T* __restrict__ y,
                      float* __restrict__ rstd, int64_t rows, int dim, float eps) {
  constexpr int N = Vec<T>::kN;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int nvec = dim / N;
  const int64_t base = row * dim;
  float v[kVecs][N];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = lane + 32 * j;
    if (vi < nvec) {
      float dv[N];
      Vec<T>::Load(x + base + vi * N, v[j]);
      Vec<T>::Load(delta + base + vi * N, dv);
#pragma unroll
      for (int k = 0; k < N; ++k) v[j][k] += dv[k];
      Vec<T>::Round(v[j]);  // the norm sees the stored residual
      Vec<T>::Store(h + base + vi * N, v[j]);
#pragma unroll
      for (int k = 0; k < N; ++k) ss += v[j][k] * v[j][k];
    }
  }
  ss = WarpSum(ss);
  const float rs = rsqrtf(ss / float(dim) + eps);
  if (lane == 0) rstd[row] = rs;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = lane + 32 * j;
    if (vi < nvec) {
      float wv[N];
      Vec<T>::Load(w + vi * N, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) v[j][k] = v[j][k] * rs * wv[k];
      Vec<T>::Store(y + base + vi * N, v[j]);
    }
  }
}

template <typename T, int kVecs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    BackwardWarpKernel(const T* __restrict__ dy, const T* dh_in, const T* __restrict__ h, const T* __restrict__ w,
                       const float* __restrict__ rstd, T* dh, float* __restrict__ dw_partial, int64_t rows, int dim) {
  constexpr int N = Vec<T>::kN;
  extern __shared__ float smem_dw[];  // [dim]
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int nvec = dim / N;
  float acc[kVecs][N];
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
#pragma unroll
    for (int k = 0; k < N; ++k) acc[j][k] = 0.f;

  const int64_t total_warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp; row < rows; row += total_warps) {
    const int64_t base = row * dim;
    const float rs = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int vi = lane + 32 * j;
      if (vi < nvec) {
        float hv[N], dv[N], wv[N];
        Vec<T>::Load(h + base + vi * N, hv);
        Vec<T>::Load(dy + base + vi * N, dv);
        Vec<T>::Load(w + vi * N, wv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          dot += wv[k] * dv[k] * hv[k];
          acc[j][k] += dv[k] * hv[k] * rs;
        }
      }
    }
    const float mean = WarpSum(dot) / float(dim);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int vi = lane + 32 * j;
      if (vi < nvec) {
        float hv[N], dv[N], wv[N], gv[N];
        Vec<T>::Load(h + base + vi * N, hv);  // second read of the row: from L1/L2
        Vec<T>::Load(dy + base + vi * N, dv);
        Vec<T>::Load(w + vi * N, wv);
        Vec<T>::Load(dh_in + base + vi * N, gv);
#pragma unroll
        for (int k = 0; k < N; ++k) gv[k] += rs * (wv[k] * dv[k] - hv[k] * rs * rs * mean);
        Vec<T>::Store(dh + base + vi * N, gv);
      }
    }
  }
  // Combine the block's warps in a fixed order, then write this block's partial row.
  for (int i = threadIdx.x; i < dim; i += blockDim.x) smem_dw[i] = 0.f;
  __syncthreads();
  for (int turn = 0; turn < kWarpsPerBlock; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int vi = lane + 32 * j;
        if (vi < nvec) {
#pragma unroll
          for (int k = 0; k < N; ++k) smem_dw[vi * N + k] += acc[j][k];
        }
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dw_partial[int64_t(blockIdx.x) * dim + i] = smem_dw[i];
}

// dw[c] = sum over blocks of partial[b][c], in block order.
__global__ void SumPartialsKernel(const float* __restrict__ partial, float* __restrict__ dw, int blocks, int dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += partial[int64_t(b) * dim + c];
  dw[c] = s;
}

// --- general path: any dim ----------------------------------------------------------------------

__device__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += scratch[i];
  __syncthreads();
  return total;
}

// Writes h first, then reads it back (each thread its own elements) for the output.
template <typename T>
__global__ void ForwardRowKernel(const T* x, const T* delta, const T* w, T* h, T* y, float* rstd, int dim, float eps) {
  __shared__ float scratch[32];
  const int64_t base = int64_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const T hv = Make<T>(Get(x, base + i) + Get(delta, base + i));
    h[base + i] = hv;
    const float f = Get(&hv, 0);
    ss += f * f;
  }
  const float rs = rsqrtf(BlockSum(ss, scratch) / float(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) y[base + i] = Make<T>(Get(h, base + i) * rs * Get(w, i));
}

template <typename T>
__global__ void BackwardRowKernel(const T* dy, const T* dh_in, const T* h, const T* w, const float* rstd, T* dh,
                                  int dim) {
  __shared__ float scratch[32];
  const int64_t base = int64_t(blockIdx.x) * dim;
  const float rs = rstd[blockIdx.x];
  float dot = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dot += Get(w, i) * Get(dy, base + i) * Get(h, base + i);
  const float mean = BlockSum(dot, scratch) / float(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = Get(dh_in, base + i) + rs * (Get(w, i) * Get(dy, base + i) - Get(h, base + i) * rs * rs * mean);
    dh[base + i] = Make<T>(g);
  }
}

template <typename T>
__global__ void WeightGradColumnKernel(const T* dy, const T* h, const float* rstd, float* dw, int64_t rows, int dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.f;
  for (int64_t r = 0; r < rows; ++r) s += Get(dy, r * dim + c) * Get(h, r * dim + c) * rstd[r];
  dw[c] = s;
}

// --- launchers ------------------------------------------------------------------------------------

constexpr int kMaxVecsPerLane = 16;  // 16 * 32 lanes * 16 B: dim 4096 bf16 / 2048 f32

// Vectors per lane for the fast path, or 0 when the general path must be used.
template <typename T>
int FastVecs(int64_t dim) {
  constexpr int N = Vec<T>::kN;
  if (dim % N != 0) return 0;
  const int64_t per_lane = (dim / N + 31) / 32;
  for (int v : {1, 2, 4, 8, kMaxVecsPerLane}) {
    if (per_lane <= v) return v;
  }
  return 0;
}

template <typename T>
absl::Status Forward(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y,
                     float* rstd, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  const T* dt = static_cast<const T*>(delta);
  const T* wt = static_cast<const T*>(w);
  T* ht = static_cast<T*>(h);
  T* yt = static_cast<T*>(y);
  const int dim = int(p.dim);
  const unsigned blocks = unsigned((p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  switch (FastVecs<T>(p.dim)) {
#define SG_CASE(V)                                                                                       \
  case V:                                                                                                \
    ForwardWarpKernel<T, V><<<blocks, kWarpsPerBlock * 32, 0, s>>>(xt, dt, wt, ht, yt, rstd, p.rows, dim, \
                                                                    p.eps);                              \
    break;
    SG_CASE(1) SG_CASE(2) SG_CASE(4) SG_CASE(8) SG_CASE(16)
#undef SG_CASE
    default:
      ForwardRowKernel<T><<<unsigned(p.rows), 256, 0, s>>>(xt, dt, wt, ht, yt, rstd, dim, p.eps);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AddRmsNormForward);
  return absl::OkStatus();
}

template <typename T>
absl::Status Backward(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                      const float* rstd, void* dh, float* dw, int device, cudaStream_t s) {
  const T* dyt = static_cast<const T*>(dy);
  const T* git = static_cast<const T*>(dh_in);
  const T* ht = static_cast<const T*>(h);
  const T* wt = static_cast<const T*>(w);
  T* dht = static_cast<T*>(dh);
  const int dim = int(p.dim);
  const int vecs = FastVecs<T>(p.dim);
  if (vecs == 0) {
    BackwardRowKernel<T><<<unsigned(p.rows), 256, 0, s>>>(dyt, git, ht, wt, rstd, dht, dim);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(AddRmsNormBackward);
    WeightGradColumnKernel<T><<<unsigned((dim + 255) / 256), 256, 0, s>>>(dyt, ht, rstd, dw, p.rows, dim);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(AddRmsNormBackward);
    return absl::OkStatus();
  }
  int sms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t want = (p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(want, 2 * sms)));
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(int64_t(blocks) * dim * int64_t(sizeof(float))));
  float* partial = static_cast<float*>(scratch);
  const size_t smem = size_t(dim) * sizeof(float);
  cudaError_t err = cudaSuccess;
  switch (vecs) {
#define SG_CASE(V)                                                                                              \
  case V:                                                                                                       \
    if (smem > 48 * 1024) {                                                                                     \
      err = cudaFuncSetAttribute(BackwardWarpKernel<T, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); \
    }                                                                                                           \
    if (err == cudaSuccess) {                                                                                   \
      BackwardWarpKernel<T, V><<<blocks, kWarpsPerBlock * 32, smem, s>>>(dyt, git, ht, wt, rstd, dht, partial,  \
                                                                          p.rows, dim);                         \
    }                                                                                                           \
    break;
    SG_CASE(1) SG_CASE(2) SG_CASE(4) SG_CASE(8) SG_CASE(16)
#undef SG_CASE
  }
  const char* failed = "cudaFuncSetAttribute";
  if (err == cudaSuccess) {
    err = cudaGetLastError();
    failed = "BackwardWarpKernel";
  }
  if (err == cudaSuccess) {
    SumPartialsKernel<<<unsigned((dim + 255) / 256), 256, 0, s>>>(partial, dw, blocks, dim);
    err = cudaGetLastError();
    failed = "SumPartialsKernel";
  }
  alloc->Free(scratch);  // reused only by later work on the same stream
  if (err != cudaSuccess) {
    return LibraryError(absl::StatusCode::kInternal, "CUDA", err, cudaGetErrorString(err), failed, __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ForwardCuda(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y,
                         float* rstd, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Forward<__nv_bfloat16>(p, x, delta, w, h, y, rstd, s);
  return Forward<float>(p, x, delta, w, h, y, rstd, s);
}

absl::Status BackwardCuda(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                          const float* rstd, void* dh, float* dw, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Backward<__nv_bfloat16>(p, dy, dh_in, h, w, rstd, dh, dw, device, s);
  return Backward<float>(p, dy, dh_in, h, w, rstd, dh, dw, device, s);
}

}  // namespace sg::kernels::add_rmsnorm_internal
