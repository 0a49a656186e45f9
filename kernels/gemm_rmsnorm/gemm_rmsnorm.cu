// CUDA steps of GEMM + RMSNorm around the cuBLASLt GEMMs: the weight fold, the per-row rstd, the
// norm backward (dx and xhat in one pass per row) and the weight-gradient epilogue (dW = G diag(g)
// and dw_norm = column sums of W * G, two-stage and in a fixed order: deterministic, no atomics).
// Row kernels: one warp per row with 16-byte accesses when a row is a whole number of 16-byte
// vectors (every row is then 16-byte aligned, as tensors start 256-byte aligned), else scalar.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/gemm_rmsnorm/gemm_rmsnorm_internal.h"

namespace sg::kernels::gemm_rmsnorm_internal {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kColumnChunkRows = 64;  // rows per partial sum in the weight-gradient reduction

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T> __device__ __forceinline__ float Get(const T* p, int64_t i);
template <> __device__ __forceinline__ float Get(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float Get(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
template <typename T> __device__ __forceinline__ T Make(float v);
template <> __device__ __forceinline__ float Make(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 Make(float v) { return __float2bfloat16_rn(v); }

// 16 bytes of T as floats, and back.
template <typename T> struct Vec {
  static constexpr int kN = 16 / sizeof(T);
  __device__ static void Load(const T* p, float (&out)[kN]) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = Get(e, i);
  }
  __device__ static void Store(T* p, const float (&in)[kN]) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = Make<T>(in[i]);
    *reinterpret_cast<uint4*>(p) = u;
  }
};

template <typename T>
__global__ void FoldWeightKernel(const T* __restrict__ w, const T* __restrict__ g, T* __restrict__ wf, int64_t n,
                                 int64_t k) {
  const int64_t total = n * k;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    wf[i] = Make<T>(Get(w, i) * Get(g, i % k));
  }
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    RstdKernel(const T* __restrict__ x, float* __restrict__ rstd, int64_t rows, int dim, float eps) {
  constexpr int N = Vec<T>::kN;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * dim;
  float ss = 0.f;
  if (kVector) {
#pragma unroll 4
    for (int v = lane; v < dim / N; v += 32) {
      float e[N];
      Vec<T>::Load(xr + v * N, e);
#pragma unroll
      for (int j = 0; j < N; ++j) ss += e[j] * e[j];
    }
  } else {
    for (int i = lane; i < dim; i += 32) ss += Get(xr, i) * Get(xr, i);
  }
  ss = WarpSum(ss);
  if (lane == 0) rstd[row] = rsqrtf(ss / float(dim) + eps);
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    NormBackwardKernel(const T* __restrict__ dz, const T* __restrict__ x, const float* __restrict__ rstd,
                       T* __restrict__ dx, T* __restrict__ xhat, int64_t rows, int dim) {
  constexpr int N = Vec<T>::kN;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t base = row * dim;
  const float rs = rstd[row];
  float dot = 0.f;
  if (kVector) {
#pragma unroll 4
    for (int v = lane; v < dim / N; v += 32) {
      float a[N], b[N];
      Vec<T>::Load(dz + base + v * N, a);
      Vec<T>::Load(x + base + v * N, b);
#pragma unroll
      for (int j = 0; j < N; ++j) dot += a[j] * b[j];
    }
  } else {
    for (int i = lane; i < dim; i += 32) dot += Get(dz, base + i) * Get(x, base + i);
  }
  const float c = rs * rs * WarpSum(dot) / float(dim);
  if (kVector) {
#pragma unroll 4
    for (int v = lane; v < dim / N; v += 32) {  // second read of the row: from L1/L2
      float a[N], b[N], o[N];
      Vec<T>::Load(dz + base + v * N, a);
      Vec<T>::Load(x + base + v * N, b);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        o[j] = rs * (a[j] - b[j] * c);
        b[j] *= rs;
      }
      Vec<T>::Store(dx + base + v * N, o);
      Vec<T>::Store(xhat + base + v * N, b);
    }
  } else {
    for (int i = lane; i < dim; i += 32) {
      const float xi = Get(x, base + i);
      dx[base + i] = Make<T>(rs * (Get(dz, base + i) - xi * c));
      xhat[base + i] = Make<T>(rs * xi);
    }
  }
}

// Block (column tile, row chunk): partial[chunk][j] = sum over the chunk's rows of w * G, and G *= g.
template <typename T>
__global__ void WeightGradPartialKernel(const T* __restrict__ w, const T* __restrict__ g, float* __restrict__ G,
                                        float* __restrict__ partial, int64_t n, int64_t k) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const int64_t r0 = int64_t(blockIdx.y) * kColumnChunkRows;
  const int64_t r1 = min(n, r0 + kColumnChunkRows);
  const float gj = Get(g, j);
  float s = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float gv = G[r * k + j];
    s += Get(w, r * k + j) * gv;
    G[r * k + j] = gv * gj;
  }
  partial[int64_t(blockIdx.y) * k + j] = s;
}

__global__ void SumPartialsKernel(const float* __restrict__ partial, float* __restrict__ out, int chunks, int64_t k) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partial[int64_t(c) * k + j];
  out[j] = s;
}

template <typename T>
bool Vectorizable(int64_t dim) { return dim % Vec<T>::kN == 0; }

unsigned RowBlocks(int64_t rows) { return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename T>
absl::Status Rstd(int64_t rows, int64_t dim, const void* x, float eps, float* rstd, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  if (Vectorizable<T>(dim)) {
    RstdKernel<T, true><<<RowBlocks(rows), kWarpsPerBlock * 32, 0, s>>>(xt, rstd, rows, int(dim), eps);
  } else {
    RstdKernel<T, false><<<RowBlocks(rows), kWarpsPerBlock * 32, 0, s>>>(xt, rstd, rows, int(dim), eps);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RstdKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status NormBackward(int64_t rows, int64_t dim, const void* dz, const void* x, const float* rstd, void* dx,
                          void* xhat, cudaStream_t s) {
  const T* dzt = static_cast<const T*>(dz);
  const T* xt = static_cast<const T*>(x);
  T* dxt = static_cast<T*>(dx);
  T* xht = static_cast<T*>(xhat);
  if (Vectorizable<T>(dim)) {
    NormBackwardKernel<T, true><<<RowBlocks(rows), kWarpsPerBlock * 32, 0, s>>>(dzt, xt, rstd, dxt, xht, rows, int(dim));
  } else {
    NormBackwardKernel<T, false><<<RowBlocks(rows), kWarpsPerBlock * 32, 0, s>>>(dzt, xt, rstd, dxt, xht, rows,
                                                                                 int(dim));
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(NormBackwardKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status WeightGrad(int64_t n, int64_t k, const void* w, const void* g, float* G, float* dg, int device,
                        cudaStream_t s) {
  const int chunks = int((n + kColumnChunkRows - 1) / kColumnChunkRows);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(int64_t(chunks) * k * int64_t(sizeof(float))));
  float* partial = static_cast<float*>(scratch);
  const dim3 grid(unsigned((k + 255) / 256), unsigned(chunks));
  WeightGradPartialKernel<T><<<grid, 256, 0, s>>>(static_cast<const T*>(w), static_cast<const T*>(g), G, partial, n, k);
  cudaError_t err = cudaGetLastError();
  const char* failed = "WeightGradPartialKernel";
  if (err == cudaSuccess) {
    SumPartialsKernel<<<unsigned((k + 255) / 256), 256, 0, s>>>(partial, dg, chunks, k);
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

absl::Status FoldWeightCuda(int64_t n, int64_t k, DType t, const void* w, const void* g, void* w_folded,
                            void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = unsigned(std::min<int64_t>((n * k + 255) / 256, 4096));
  if (t == DType::kBF16) {
    using T = __nv_bfloat16;
    FoldWeightKernel<T><<<blocks, 256, 0, s>>>(static_cast<const T*>(w), static_cast<const T*>(g),
                                               static_cast<T*>(w_folded), n, k);
  } else {
    FoldWeightKernel<float><<<blocks, 256, 0, s>>>(static_cast<const float*>(w), static_cast<const float*>(g),
                                                   static_cast<float*>(w_folded), n, k);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(FoldWeightKernel);
  return absl::OkStatus();
}

absl::Status RstdCuda(int64_t rows, int64_t dim, DType t, const void* x, float eps, float* rstd, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (t == DType::kBF16) return Rstd<__nv_bfloat16>(rows, dim, x, eps, rstd, s);
  return Rstd<float>(rows, dim, x, eps, rstd, s);
}

absl::Status NormBackwardCuda(int64_t rows, int64_t dim, DType t, const void* dz, const void* x, const float* rstd,
                              void* dx, void* xhat, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (t == DType::kBF16) return NormBackward<__nv_bfloat16>(rows, dim, dz, x, rstd, dx, xhat, s);
  return NormBackward<float>(rows, dim, dz, x, rstd, dx, xhat, s);
}

absl::Status WeightGradCuda(int64_t n, int64_t k, DType t, const void* w, const void* g, float* G, float* dg,
                            int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (t == DType::kBF16) return WeightGrad<__nv_bfloat16>(n, k, w, g, G, dg, device, s);
  return WeightGrad<float>(n, k, w, g, G, dg, device, s);
}

}  // namespace sg::kernels::gemm_rmsnorm_internal
