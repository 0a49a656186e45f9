// CUDA embedding. Forward: a grid-stride copy of 16-byte packs (row = token id, looked up per pack
// from L1). Backward, deterministic without float atomics:
//   1. keys[i] = tokens[i] (out-of-range ids -> vocab, sorted past every real row), values[i] = i;
//   2. CUB's stable LSD radix sort of (key, value) pairs on the bits the vocabulary needs, so equal
//      ids keep ascending token order;
//   3. row starts: offsets[v] = first sorted index with key >= v (from key changes, no atomics);
//   4. the f32 row sums, each vocabulary row's run of dout rows added in sorted order, written once
//      (zeros for unused rows): every dtable element written exactly once. Two kernels for this
//      step, SG_EMBEDDING_BWD selecting one per call until the GPU run picks the winner:
//      "rows" (default, RowSumRowsKernel): a CTA takes kSumRows vocabulary rows at a time, its
//        threads on the row's packs of 8 columns; the rows' run bounds are loaded once per row
//        (broadcast) and the kSumRows runs are independent chains in flight together; 32-bit
//        column math. "packs" (RowSumKernel, the first version: 1.52 TB/s for the whole backward
//        on H200 at 16384 tokens, vocab 32000, dim 2048): one thread per (row, pack), grid-stride,
//        with a 64-bit division per pack and the run bounds loaded by every thread.
// Bytes: dout read once, dtable written once, plus O(tokens + vocab) indices.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_internal.h"

namespace sg::kernels::embedding_internal {
namespace {

using cuda_vec::Pack8;

constexpr int kThreads = 256;

template <typename I>
__device__ __forceinline__ int64_t IdAt(const void* tokens, int64_t i) {
  return int64_t(static_cast<const I*>(tokens)[i]);
}

// kW columns per thread: 8 with 16-byte accesses, or 1.
template <typename T, typename I, int kW>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const void* tokens, const T* __restrict__ table, T* __restrict__ out, int64_t n, int64_t vocab,
                  int64_t dim) {
  const int64_t ppr = dim / kW;
  const int64_t total = n * ppr;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t t = i / ppr, c = (i - t * ppr) * kW;
    const int64_t id = IdAt<I>(tokens, t);
    const bool ok = id >= 0 && id < vocab;
    if constexpr (kW == 8) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ok) v = *reinterpret_cast<const uint4*>(table + id * dim + c);
      *reinterpret_cast<uint4*>(out + t * dim + c) = v;
      if constexpr (sizeof(T) == 4) {  // f32: 8 columns are two 16-byte packs
        uint4 w = make_uint4(0, 0, 0, 0);
        if (ok) w = *reinterpret_cast<const uint4*>(table + id * dim + c + 4);
        *reinterpret_cast<uint4*>(out + t * dim + c + 4) = w;
      }
    } else {
      out[t * dim + c] = ok ? table[id * dim + c] : cuda_vec::FromF<T>(0.f);
    }
  }
}

template <typename I>
__global__ void KeysKernel(const void* tokens, int32_t* keys, int32_t* values, int64_t n, int64_t vocab) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t id = IdAt<I>(tokens, i);
  keys[i] = int32_t(id >= 0 && id < vocab ? id : vocab);
  values[i] = int32_t(i);
}

// offsets[v] for v in (key[i-1], key[i]] is i; offsets[vocab] ends the last real row.
__global__ void RowStartsKernel(const int32_t* sorted_keys, int32_t* offsets, int64_t n, int64_t vocab) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i > n) return;
  const int64_t prev = i == 0 ? -1 : sorted_keys[i - 1];
  const int64_t cur = i == n ? vocab : min(int64_t(sorted_keys[i]), vocab);
  for (int64_t v = prev + 1; v <= cur; ++v) offsets[v] = int32_t(i);
}

template <typename T, int kW>
__global__ void __launch_bounds__(kThreads)
    RowSumKernel(const T* __restrict__ dout, const int32_t* __restrict__ order, const int32_t* __restrict__ offsets,
                 float* __restrict__ dtable, int64_t vocab, int64_t dim) {
  const int64_t ppr = dim / kW;
  const int64_t total = vocab * ppr;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t v = i / ppr, c = (i - v * ppr) * kW;
    float acc[8] = {};
    const int32_t end = offsets[v + 1];
    for (int32_t j = offsets[v]; j < end; ++j) {
      const T* src = dout + int64_t(order[j]) * dim + c;
      if constexpr (kW == 8) {
        float x[8];
        Pack8<T>::Load(src, x);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += x[k];
      } else {
        acc[0] += cuda_vec::ToF(*src);
      }
    }
    if constexpr (kW == 8) {
      Pack8<float>::Store(dtable + v * dim + c, acc);
    } else {
      dtable[v * dim + c] = acc[0];
    }
  }
}

constexpr int kSumRows = 4;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RowSumRowsKernel(const T* __restrict__ dout, const int32_t* __restrict__ order,
                     const int32_t* __restrict__ offsets, float* __restrict__ dtable, int64_t vocab, int packs) {
  const int64_t v0 = int64_t(blockIdx.x) * kSumRows;
  const int64_t dim = int64_t(packs) * 8;
  int32_t begin[kSumRows], end[kSumRows];
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) {
    const bool ok = v0 + r < vocab;
    begin[r] = ok ? offsets[v0 + r] : 0;
    end[r] = ok ? offsets[v0 + r + 1] : 0;
  }
  // Most runs hold 0 or 1 dout rows (16k tokens over a 32k vocabulary): the first row of every run
  // is loaded for all kSumRows rows together, the rest (repeated tokens) after, in sorted order.
  int32_t first[kSumRows];
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) first[r] = begin[r] < end[r] ? order[begin[r]] : -1;
  for (int c = threadIdx.x; c < packs; c += kThreads) {
    float acc[kSumRows][8];
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      if (first[r] >= 0) Pack8<T>::Load(dout + int64_t(first[r]) * dim + c * 8, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      // 0 + x, the CPU reference's first addition (it turns -0 into +0).
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[r][k] = first[r] >= 0 ? 0.f + acc[r][k] : 0.f;
      for (int32_t j = begin[r] + 1; j < end[r]; ++j) {
        float y[8];
        Pack8<T>::Load(dout + int64_t(order[j]) * dim + c * 8, y);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[r][k] += y[k];
      }
    }
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      if (v0 + r < vocab) Pack8<float>::Store(dtable + (v0 + r) * dim + c * 8, acc[r]);
    }
  }
}

// SG_EMBEDDING_BWD=packs selects the first row-sum kernel; anything else (or unset) the rows kernel.
bool UsePacksKernel() {
  const char* v = std::getenv("SG_EMBEDDING_BWD");
  return v != nullptr && std::strcmp(v, "packs") == 0;
}

int EndBit(int64_t vocab) {  // bits for keys in [0, vocab]
  int bits = 1;
  while ((int64_t(1) << bits) <= vocab) ++bits;
  return bits;
}

template <typename T, typename I>
absl::Status Forward(const Problem& p, const void* tokens, const void* table, void* out, cudaStream_t s) {
  const bool vec = p.dim % 8 == 0 && cuda_vec::Aligned16(table) && cuda_vec::Aligned16(out);
  const int64_t work = p.tokens * (vec ? p.dim / 8 : p.dim);
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  const T* tt = static_cast<const T*>(table);
  T* ot = static_cast<T*>(out);
  auto launch = [&](auto kernel) {
    kernel<<<cuda_vec::ResidentGrid(kernel, kThreads, blocks), kThreads, 0, s>>>(tokens, tt, ot, p.tokens, p.vocab,
                                                                                 p.dim);
  };
  if (vec) {
    launch(ForwardKernel<T, I, 8>);
  } else {
    launch(ForwardKernel<T, I, 1>);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ForwardKernel);
  return absl::OkStatus();
}

// Launches steps 1-4 with the scratch buffers carved from one allocation.
template <typename T, typename I>
absl::Status Backward(const Problem& p, const void* dout, const void* tokens, float* dtable, char* scratch,
                      size_t sort_bytes, cudaStream_t s) {
  const int64_t n = p.tokens;
  int32_t* keys = reinterpret_cast<int32_t*>(scratch);
  int32_t* keys_sorted = keys + n;
  int32_t* values = keys_sorted + n;
  int32_t* order = values + n;
  int32_t* offsets = order + n;
  void* sort_temp = offsets + p.vocab + 1;
  if (n > 0) {
    KeysKernel<I><<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(tokens, keys, values, n, p.vocab);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(KeysKernel);
    SG_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys, keys_sorted, values, order,
                                                            int(n), 0, EndBit(p.vocab), s));
  }
  RowStartsKernel<<<unsigned((n + 1 + kThreads - 1) / kThreads), kThreads, 0, s>>>(keys_sorted, offsets, n, p.vocab);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowStartsKernel);
  const bool vec = p.dim % 8 == 0 && cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  if (vec && !UsePacksKernel()) {
    const unsigned blocks = unsigned((p.vocab + kSumRows - 1) / kSumRows);
    RowSumRowsKernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(dout), order, offsets, dtable, p.vocab,
                                                    int(p.dim / 8));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumRowsKernel);
    return absl::OkStatus();
  }
  const int64_t work = p.vocab * (vec ? p.dim / 8 : p.dim);
  const unsigned grid = cuda_vec::GridFor((work + kThreads - 1) / kThreads);
  const T* dt = static_cast<const T*>(dout);
  if (vec) {
    RowSumKernel<T, 8><<<grid, kThreads, 0, s>>>(dt, order, offsets, dtable, p.vocab, p.dim);
  } else {
    RowSumKernel<T, 1><<<grid, kThreads, 0, s>>>(dt, order, offsets, dtable, p.vocab, p.dim);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status BackwardAlloc(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                           cudaStream_t s) {
  size_t sort_bytes = 0;
  const int64_t n = p.tokens;
  if (n > 0) {
    SG_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<int32_t*>(nullptr),
                                                            static_cast<int32_t*>(nullptr),
                                                            static_cast<int32_t*>(nullptr),
                                                            static_cast<int32_t*>(nullptr), int(n), 0,
                                                            EndBit(p.vocab), s));
  }
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  const int64_t index_bytes = (4 * n + p.vocab + 1) * int64_t(sizeof(int32_t));
  const int64_t aligned_index_bytes = (index_bytes + 255) / 256 * 256;
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(aligned_index_bytes + int64_t(sort_bytes)));
  // The sort's temporary storage starts at a 256-byte boundary after the index arrays.
  absl::Status st = p.tokens_i64 ? Backward<T, int64_t>(p, dout, tokens, dtable, static_cast<char*>(scratch),
                                                        sort_bytes, s)
                                 : Backward<T, int32_t>(p, dout, tokens, dtable, static_cast<char*>(scratch),
                                                        sort_bytes, s);
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

}  // namespace

absl::Status ForwardCuda(const Problem& p, const void* tokens, const void* table, void* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) {
    return p.tokens_i64 ? Forward<__nv_bfloat16, int64_t>(p, tokens, table, out, s)
                        : Forward<__nv_bfloat16, int32_t>(p, tokens, table, out, s);
  }
  if (p.dtype == DType::kF16) {
    return p.tokens_i64 ? Forward<__half, int64_t>(p, tokens, table, out, s) : Forward<__half, int32_t>(p, tokens, table, out, s);
  }
  return p.tokens_i64 ? Forward<float, int64_t>(p, tokens, table, out, s) : Forward<float, int32_t>(p, tokens, table, out, s);
}

absl::Status BackwardCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                          void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return BackwardAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s);
  if (p.dtype == DType::kF16) return BackwardAlloc<__half>(p, dout, tokens, dtable, device, s);
  return BackwardAlloc<float>(p, dout, tokens, dtable, device, s);
}

}  // namespace sg::kernels::embedding_internal
