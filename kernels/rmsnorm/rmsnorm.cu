// CUDA RMSNorm. Fast path (dim a multiple of 16 bytes, at most 16 vectors per lane): one warp per row,
// 16-byte loads and stores, the row's vectors spread over the lanes (vector v on lane v % 32) so each
// warp-wide access is coalesced. The backward keeps the weight gradient's per-column partial sums in
// registers across a grid-stride loop over rows, combines warps in shared memory in a fixed order,
// and a second kernel sums the per-block partials: deterministic, no atomics. Other shapes take a
// simple block-per-row path.
//
// Measured bandwidth on H200 against PyTorch: benchmarks/README.md.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/rmsnorm/rmsnorm_internal.h"

namespace sg::kernels::rmsnorm_internal {
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
};

// Converts 16 raw bytes (already loaded) to floats.
template <typename T>
__device__ __forceinline__ void Unpack(const uint4& raw, float (&out)[Vec<T>::kN]) {
  Vec<T>::Load(reinterpret_cast<const T*>(&raw), out);
}

template <typename T> __device__ __forceinline__ float Get(const T* p, int64_t i);
template <> __device__ __forceinline__ float Get(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float Get(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
template <typename T> __device__ __forceinline__ T Make(float v);
template <> __device__ __forceinline__ float Make(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 Make(float v) { return __float2bfloat16_rn(v); }

// --- fast path -----------------------------------------------------------------------------------

template <typename T, int kVecs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    ForwardWarpKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                      float* __restrict__ rstd, int64_t rows, int dim, float eps) {
  constexpr int N = Vec<T>::kN;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int nvec = dim / N;
  const T* xr = x + row * dim;
  // The row stays in registers as raw 16-byte vectors (half the registers of floats for bf16).
  uint4 raw[kVecs];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = lane + 32 * j;
    if (vi < nvec) raw[j] = __ldcs(reinterpret_cast<const uint4*>(xr + vi * N));
  }
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = lane + 32 * j;
    if (vi < nvec) {
      float v[N];
      Unpack<T>(raw[j], v);
#pragma unroll
      for (int k = 0; k < N; ++k) ss += v[k] * v[k];
    }
  }
  ss = WarpSum(ss);
  const float rs = rsqrtf(ss / float(dim) + eps);
  if (lane == 0) rstd[row] = rs;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = lane + 32 * j;
    if (vi < nvec) {
      float v[N], wv[N];
      Unpack<T>(raw[j], v);
      Vec<T>::Load(w + vi * N, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = v[k] * rs * wv[k];
      Vec<T>::Store(y + row * dim + vi * N, v);
    }
  }
}

template <typename T, int kVecs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    BackwardWarpKernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                       const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ dw_partial,
                       int64_t rows, int dim) {
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
    const T* xr = x + row * dim;
    const T* dyr = dy + row * dim;
    // Up to 8 vectors per lane, the row's x and dy are read once and kept as raw 16-byte vectors
    // for both passes; wider rows would spill, so they re-read the row (from L1/L2) instead.
    constexpr bool kKeepRow = kVecs <= 8;
    constexpr int kKept = kKeepRow ? kVecs : 1;
    uint4 xraw[kKept] = {}, dyraw[kKept] = {};
    auto load_x = [&](int j, int vi) -> uint4 {
      if constexpr (kKeepRow) return xraw[j];
      return *reinterpret_cast<const uint4*>(xr + vi * N);
    };
    auto load_dy = [&](int j, int vi) -> uint4 {
      if constexpr (kKeepRow) return dyraw[j];
      return *reinterpret_cast<const uint4*>(dyr + vi * N);
    };
    if constexpr (kKeepRow) {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int vi = lane + 32 * j;
        if (vi < nvec) {
          xraw[j] = __ldcs(reinterpret_cast<const uint4*>(xr + vi * N));
          dyraw[j] = __ldcs(reinterpret_cast<const uint4*>(dyr + vi * N));
        }
      }
    }
    const float rs = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int vi = lane + 32 * j;
      if (vi < nvec) {
        float xv[N], dv[N], wv[N];
        Unpack<T>(load_x(j, vi), xv);
        Unpack<T>(load_dy(j, vi), dv);
        Vec<T>::Load(w + vi * N, wv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          dot += wv[k] * dv[k] * xv[k];
          acc[j][k] += dv[k] * xv[k] * rs;
        }
      }
    }
    const float mean = WarpSum(dot) / float(dim);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int vi = lane + 32 * j;
      if (vi < nvec) {
        float xv[N], dv[N], wv[N], out[N];
        Unpack<T>(load_x(j, vi), xv);
        Unpack<T>(load_dy(j, vi), dv);
        Vec<T>::Load(w + vi * N, wv);
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = rs * (wv[k] * dv[k] - xv[k] * rs * rs * mean);
        Vec<T>::Store(dx + row * dim + vi * N, out);
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

template <typename T>
__global__ void ForwardRowKernel(const T* x, const T* w, T* y, float* rstd, int dim, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = Get(x, row * dim + i);
    ss += v * v;
  }
  const float rs = rsqrtf(BlockSum(ss, scratch) / float(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    y[row * dim + i] = Make<T>(Get(x, row * dim + i) * rs * Get(w, i));
  }
}

template <typename T>
__global__ void BackwardRowKernel(const T* dy, const T* x, const T* w, const float* rstd, T* dx, int dim) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float rs = rstd[row];
  float dot = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    dot += Get(w, i) * Get(dy, row * dim + i) * Get(x, row * dim + i);
  }
  const float mean = BlockSum(dot, scratch) / float(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = rs * (Get(w, i) * Get(dy, row * dim + i) - Get(x, row * dim + i) * rs * rs * mean);
    dx[row * dim + i] = Make<T>(g);
  }
}

template <typename T>
__global__ void WeightGradColumnKernel(const T* dy, const T* x, const float* rstd, float* dw, int64_t rows, int dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.f;
  for (int64_t r = 0; r < rows; ++r) s += Get(dy, r * dim + c) * Get(x, r * dim + c) * rstd[r];
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
  for (int v : {1, 2, 4, 8, 16, kMaxVecsPerLane}) {
    if (per_lane <= v) return v;
  }
  return 0;
}

template <typename T>
absl::Status Forward(const Problem& p, const void* x, const void* w, void* y, float* rstd, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  T* yt = static_cast<T*>(y);
  const int dim = int(p.dim);
  const unsigned blocks = unsigned((p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  switch (FastVecs<T>(p.dim)) {
#define SG_CASE(V) \
  case V: ForwardWarpKernel<T, V><<<blocks, kWarpsPerBlock * 32, 0, s>>>(xt, wt, yt, rstd, p.rows, dim, p.eps); break;
    SG_CASE(1) SG_CASE(2) SG_CASE(4) SG_CASE(8) SG_CASE(16)
#undef SG_CASE
    default:
      ForwardRowKernel<T><<<unsigned(p.rows), 256, 0, s>>>(xt, wt, yt, rstd, dim, p.eps);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RmsNormForward);
  return absl::OkStatus();
}

template <typename T>
absl::Status Backward(const Problem& p, const void* dy, const void* x, const void* w, const float* rstd,
                      void* dx, float* dw, int device, cudaStream_t s) {
  const T* dyt = static_cast<const T*>(dy);
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  T* dxt = static_cast<T*>(dx);
  const int dim = int(p.dim);
  const int vecs = FastVecs<T>(p.dim);
  if (vecs == 0) {
    BackwardRowKernel<T><<<unsigned(p.rows), 256, 0, s>>>(dyt, xt, wt, rstd, dxt, dim);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RmsNormBackward);
    WeightGradColumnKernel<T><<<unsigned((dim + 255) / 256), 256, 0, s>>>(dyt, xt, rstd, dw, p.rows, dim);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RmsNormBackward);
    return absl::OkStatus();
  }
  int sms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // As many blocks as fit on the device at once (more warps, more bytes in flight), each looping
  // over rows; more would only lengthen the per-block partial sums without adding parallelism.
  int per_sm = 1;
  switch (vecs) {
#define SG_CASE(V)                                                                                 \
  case V:                                                                                          \
    SG_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(                         \
        &per_sm, BackwardWarpKernel<T, V>, kWarpsPerBlock * 32, size_t(dim) * sizeof(float)));     \
    break;
    SG_CASE(1) SG_CASE(2) SG_CASE(4) SG_CASE(8) SG_CASE(16)
#undef SG_CASE
  }
  const int64_t want = (p.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(std::max(per_sm, 1)) * sms)));
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(int64_t(blocks) * dim * int64_t(sizeof(float))));
  float* partial = static_cast<float*>(scratch);
  const size_t smem = size_t(dim) * sizeof(float);
  switch (vecs) {
#define SG_CASE(V)                                                                                    \
  case V:                                                                                             \
    if (smem > 48 * 1024) {                                                                           \
      (void)cudaFuncSetAttribute(BackwardWarpKernel<T, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); \
    }                                                                                                 \
    BackwardWarpKernel<T, V><<<blocks, kWarpsPerBlock * 32, smem, s>>>(dyt, xt, wt, rstd, dxt, partial, p.rows, dim); \
    break;
    SG_CASE(1) SG_CASE(2) SG_CASE(4) SG_CASE(8) SG_CASE(16)
#undef SG_CASE
  }
  cudaError_t err = cudaGetLastError();
  const char* failed = "BackwardWarpKernel";
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

absl::Status ForwardCuda(const Problem& p, const void* x, const void* w, void* y, float* rstd, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Forward<__nv_bfloat16>(p, x, w, y, rstd, s);
  return Forward<float>(p, x, w, y, rstd, s);
}

absl::Status BackwardCuda(const Problem& p, const void* dy, const void* x, const void* w, const float* rstd,
                          void* dx, float* dw, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Backward<__nv_bfloat16>(p, dy, x, w, rstd, dx, dw, device, s);
  return Backward<float>(p, dy, x, w, rstd, dx, dw, device, s);
}

}  // namespace sg::kernels::rmsnorm_internal
