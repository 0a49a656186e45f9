// CUDA elementwise helpers. Each thread moves packs of 8 elements with 16-byte accesses (two for
// f32), kUnroll packs loaded before the first is used so enough bytes are in flight to saturate HBM,
// over a grid-stride loop sized from the SM count. Unaligned views take the same kernel with scalar
// accesses; the last n % 8 elements are done by one thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/elementwise/elementwise_internal.h"

namespace sg::kernels::elementwise_internal {
namespace {

using cuda_vec::Pack8;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <typename T, bool kVec>
__device__ __forceinline__ void Load(const T* p, float (&v)[8]) {
  if constexpr (kVec) {
    Pack8<T>::Load(p, v);
  } else {
    cuda_vec::LoadScalars(p, 8, v);
  }
}
template <typename T, bool kVec>
__device__ __forceinline__ void Store(T* p, const float (&v)[8]) {
  if constexpr (kVec) {
    Pack8<T>::Store(p, v);
  } else {
    cuda_vec::StoreScalars(p, 8, v);
  }
}

// out[i] = f(a[i], b[i]) with kInputs of a, b read (0: fill, 1: unary, 2: binary).
template <typename TIn, typename TOut, int kInputs, bool kVec, typename F>
__global__ void __launch_bounds__(kThreads) MapKernel(const TIn* a, const TIn* b, TOut* out, int64_t n, F f) {
  const int64_t packs = n / 8;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < packs; i += kUnroll * stride) {
    float va[kUnroll][8], vb[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if constexpr (kInputs >= 1) Load<TIn, kVec>(a + (i + u * stride) * 8, va[u]);
      if constexpr (kInputs >= 2) Load<TIn, kVec>(b + (i + u * stride) * 8, vb[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < 8; ++k) va[u][k] = f(va[u][k], vb[u][k]);
      Store<TOut, kVec>(out + (i + u * stride) * 8, va[u]);
    }
  }
  for (; i < packs; i += stride) {
    float va[8], vb[8];
    if constexpr (kInputs >= 1) Load<TIn, kVec>(a + i * 8, va);
    if constexpr (kInputs >= 2) Load<TIn, kVec>(b + i * 8, vb);
#pragma unroll
    for (int k = 0; k < 8; ++k) va[k] = f(va[k], vb[k]);
    Store<TOut, kVec>(out + i * 8, va);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && packs * 8 < n) {
    const int rem = int(n - packs * 8);
    float va[8], vb[8];
    if constexpr (kInputs >= 1) cuda_vec::LoadScalars(a + packs * 8, rem, va);
    if constexpr (kInputs >= 2) cuda_vec::LoadScalars(b + packs * 8, rem, vb);
#pragma unroll
    for (int k = 0; k < 8; ++k) va[k] = f(va[k], vb[k]);
    cuda_vec::StoreScalars(out + packs * 8, rem, va);
  }
}

struct AxpbyOp {
  float alpha, beta;
  __device__ float operator()(float a, float b) const { return alpha * a + beta * b; }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float a, float) const { return alpha * a; }
};
struct IdentityOp {
  __device__ float operator()(float a, float) const { return a; }
};
struct ConstOp {
  float value;
  __device__ float operator()(float, float) const { return value; }
};

template <typename TIn, typename TOut, int kInputs, typename F>
absl::Status LaunchMap(const void* a, const void* b, void* out, int64_t n, F f, cudaStream_t s) {
  const TIn* at = static_cast<const TIn*>(a);
  const TIn* bt = static_cast<const TIn*>(b);
  TOut* ot = static_cast<TOut*>(out);
  const int64_t blocks = (n / 8 + kThreads - 1) / kThreads;
  const bool vec = cuda_vec::Aligned16(out) && (kInputs < 1 || cuda_vec::Aligned16(a)) &&
                   (kInputs < 2 || cuda_vec::Aligned16(b));
  auto launch = [&](auto kernel) {
    kernel<<<cuda_vec::ResidentGrid(kernel, kThreads, blocks), kThreads, 0, s>>>(at, bt, ot, n, f);
  };
  if (vec) {
    launch(MapKernel<TIn, TOut, kInputs, true, F>);
  } else {
    launch(MapKernel<TIn, TOut, kInputs, false, F>);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(MapKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status AxpbyTyped(const Axpby& p, const void* a, const void* b, void* out, cudaStream_t s) {
  if (b == nullptr) return LaunchMap<T, T, 1>(a, nullptr, out, p.n, ScaleOp{p.alpha}, s);
  return LaunchMap<T, T, 2>(a, b, out, p.n, AxpbyOp{p.alpha, p.beta}, s);
}

template <typename From>
absl::Status CastFrom(int64_t n, DType to, const void* src, void* out, cudaStream_t s) {
  switch (to) {
    case DType::kBF16: return LaunchMap<From, __nv_bfloat16, 1>(src, nullptr, out, n, IdentityOp{}, s);
    case DType::kF16: return LaunchMap<From, __half, 1>(src, nullptr, out, n, IdentityOp{}, s);
    default: return LaunchMap<From, float, 1>(src, nullptr, out, n, IdentityOp{}, s);
  }
}

// --- column sums --------------------------------------------------------------------------------

constexpr int kSumRowsPerSplit = 64;

// partial[split][c] = sum of x[r][c] over the split's rows, in row order. Each thread owns 8
// consecutive columns (kVec) or one column.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    ColumnPartialKernel(const T* __restrict__ x, float* __restrict__ partial, int64_t rows, int64_t cols) {
  constexpr int kCols = kVec ? 8 : 1;
  const int64_t c = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  if (c >= cols) return;
  const int64_t r0 = int64_t(blockIdx.y) * kSumRowsPerSplit;
  const int64_t r1 = min(rows, r0 + kSumRowsPerSplit);
  float acc[8] = {};
  for (int64_t r = r0; r < r1; ++r) {
    if constexpr (kVec) {
      float v[8];
      Pack8<T>::Load(x + r * cols + c, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += v[k];
    } else {
      acc[0] += cuda_vec::ToF(x[r * cols + c]);
    }
  }
#pragma unroll
  for (int k = 0; k < kCols; ++k) partial[int64_t(blockIdx.y) * cols + c + k] = acc[k];
}

__global__ void SumSplitsKernel(const float* __restrict__ partial, float* __restrict__ out, int splits, int64_t cols) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int i = 0; i < splits; ++i) s += partial[int64_t(i) * cols + c];
  out[c] = s;
}

template <typename T>
absl::Status SumRowsTyped(int64_t rows, int64_t cols, const void* x, float* out, int device, cudaStream_t s) {
  const int splits = int((rows + kSumRowsPerSplit - 1) / kSumRowsPerSplit);
  SG_CHECK_ARG(splits < 65536, "SumRows: at most ", int64_t(65535) * kSumRowsPerSplit, " rows, found ", rows);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(int64_t(splits) * cols * int64_t(sizeof(float))));
  float* partial = static_cast<float*>(scratch);
  const T* xt = static_cast<const T*>(x);
  const bool vec = cols % 8 == 0 && cuda_vec::Aligned16(x);
  const int64_t per_thread = vec ? 8 : 1;
  const dim3 grid(unsigned((cols / per_thread + kThreads - 1) / kThreads), unsigned(splits));
  if (vec) {
    ColumnPartialKernel<T, true><<<grid, kThreads, 0, s>>>(xt, partial, rows, cols);
  } else {
    ColumnPartialKernel<T, false><<<grid, kThreads, 0, s>>>(xt, partial, rows, cols);
  }
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    SumSplitsKernel<<<unsigned((cols + kThreads - 1) / kThreads), kThreads, 0, s>>>(partial, out, splits, cols);
    err = cudaGetLastError();
  }
  alloc->Free(scratch);  // reused only by later work on the same stream
  SG_CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

}  // namespace

absl::Status AxpbyCuda(const Axpby& p, const void* a, const void* b, void* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kBF16: return AxpbyTyped<__nv_bfloat16>(p, a, b, out, s);
    case DType::kF16: return AxpbyTyped<__half>(p, a, b, out, s);
    default: return AxpbyTyped<float>(p, a, b, out, s);
  }
}

absl::Status CastCuda(int64_t n, DType from, DType to, const void* src, void* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (from) {
    case DType::kBF16: return CastFrom<__nv_bfloat16>(n, to, src, out, s);
    case DType::kF16: return CastFrom<__half>(n, to, src, out, s);
    default: return CastFrom<float>(n, to, src, out, s);
  }
}

absl::Status FillCuda(int64_t n, DType dtype, float value, void* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kBF16: return LaunchMap<__nv_bfloat16, __nv_bfloat16, 0>(nullptr, nullptr, out, n, ConstOp{value}, s);
    case DType::kF16: return LaunchMap<__half, __half, 0>(nullptr, nullptr, out, n, ConstOp{value}, s);
    default: return LaunchMap<float, float, 0>(nullptr, nullptr, out, n, ConstOp{value}, s);
  }
}

absl::Status SumRowsCuda(int64_t rows, int64_t cols, DType dtype, const void* x, float* out, int device,
                         void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kBF16: return SumRowsTyped<__nv_bfloat16>(rows, cols, x, out, device, s);
    case DType::kF16: return SumRowsTyped<__half>(rows, cols, x, out, device, s);
    default: return SumRowsTyped<float>(rows, cols, x, out, device, s);
  }
}

}  // namespace sg::kernels::elementwise_internal
