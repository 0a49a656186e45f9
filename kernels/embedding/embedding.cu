// CUDA embedding. Forward, SG_EMBEDDING_FWD selecting the kernel per call until a GPU run picks:
//   default (ForwardKernel): a grid-stride copy of 16-byte packs, a 64-bit division per pack and
//     the token id loaded per pack (2.94 TB/s on H200 at 16384 tokens of a 32000 x 2048 bf16 table,
//     2026-11-29);
//   "flat", "flat2", "flat4" (ForwardFlatKernel): no loop; CTA (x, y) copies 16-byte unit
//     y * kFlatThreads + threadIdx.x of 1, 2 or 4 token rows, each row's id loaded once per thread
//     from one address (a broadcast), 32-bit column math, as the SwiGLU flat kernel (3.9 TB/s);
//     a "_pdl" suffix ("flat_pdl", "flat2_pdl", ...) launches it as a programmatic dependent of the
//     previous kernel. Rows of bytes not a multiple of 16, or unaligned pointers: the default.
// Backward, deterministic without float atomics, SG_EMBEDDING_BWD selecting per call:
//   default and "rows", "packs": the sorted index preparation below, then a row sum;
//   "atomic", "atomic_nopdl": counts, a scan and an atomic scatter instead of the sort
//     (embedding_atomic.cu), chained by programmatic dependent launch unless "_nopdl".
// The sorted index preparation:
//   1. keys[i] = tokens[i] (out-of-range ids -> vocab, sorted past every real row), values[i] = i;
//   2. CUB's stable LSD radix sort of (key, value) pairs on the bits the vocabulary needs, so equal
//      ids keep ascending token order;
//   3. row starts: offsets[v] = first sorted index with key >= v (from key changes, no atomics);
//   4. the f32 row sums, each vocabulary row's run of dout rows added in sorted order, written once
//      (zeros for unused rows): every dtable element written exactly once. Two kernels:
//      "rows" (default, RowSumRowsKernel): a CTA takes kSumRows vocabulary rows at a time, its
//        threads on the row's packs of 8 columns (SumRuns, embedding_cuda.cuh). "packs"
//        (RowSumKernel, the first version: 1.52 TB/s for the whole backward on H200 at 16384
//        tokens, vocab 32000, dim 2048): one thread per (row, pack), grid-stride.
//   H200, 16384 tokens, vocab 32000, dim 2048 bf16, batch timing: 2.06 TB/s = 160 us, of which ~44
//   us are steps 1-3 (about seven launches on 16384 keys) and 116 us the row sums.
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
#include "kernels/embedding/embedding_cuda.cuh"
#include "kernels/embedding/embedding_internal.h"

namespace sg::kernels::embedding_internal {
namespace {

using cuda_vec::Pack8;

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

// The flat forward: CTA (x, y) copies 16-byte unit u = y * kFlatThreads + threadIdx.x of token
// rows x * kRows .. x * kRows + kRows - 1; every thread of the CTA loads a row's id from the same
// address (one broadcast transaction per warp), then all kRows loads are in flight before the
// stores. Out-of-range ids write zeros. Any dtype: units are raw bytes.
constexpr int kFlatThreads = 128;

template <typename I, int kRows>
__global__ void __launch_bounds__(kFlatThreads)
    ForwardFlatKernel(const I* __restrict__ tokens, const uint4* __restrict__ table, uint4* __restrict__ out,
                      int64_t n, int64_t vocab, uint32_t units) {
  WaitForPrimary();
  const uint32_t u = blockIdx.y * kFlatThreads + threadIdx.x;
  if (u >= units) return;
  const int64_t t0 = int64_t(blockIdx.x) * kRows;
  int64_t id[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) id[r] = t0 + r < n ? int64_t(tokens[t0 + r]) : -1;
  uint4 v[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    v[r] = make_uint4(0, 0, 0, 0);
    if (id[r] >= 0 && id[r] < vocab) v[r] = table[uint64_t(id[r]) * units + u];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (t0 + r < n) out[uint64_t(t0 + r) * units + u] = v[r];
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RowSumRowsKernel(const T* __restrict__ dout, const int32_t* __restrict__ order,
                     const int32_t* __restrict__ offsets, float* __restrict__ dtable, int64_t vocab, int packs) {
  const int64_t v0 = int64_t(blockIdx.x) * kSumRows;
  int32_t begin[kSumRows], end[kSumRows];
  LoadRuns(offsets, v0, vocab, begin, end);
  SumRuns<T>(dout, order, begin, end, dtable, v0, vocab, packs);
}

// The kernels selected per call by SG_EMBEDDING_FWD / SG_EMBEDDING_BWD (embedding.h's defaults
// when unset or unknown); read at every call so benchmarks and tests can switch between calls.
struct ForwardVariant {
  int flat_rows = 2;  // 0: the grid-stride kernel; 1, 2, 4: ForwardFlatKernel with that many rows
  bool pdl = true;
};
// Unset: flat2 with programmatic dependent launch (the fastest on the H200, 2026-11-30: 3.99 TB/s
// vs 3.76 for the grid-stride kernel at 16384 of 32000 x 2048 bf16). "grid" selects the grid-stride
// kernel, "flat", "flat2", "flat4" (optionally "_pdl") the flat kernel with 1, 2 or 4 rows a CTA.
ForwardVariant ForwardVariantFromEnv() {
  ForwardVariant f;
  const char* v = std::getenv("SG_EMBEDDING_FWD");
  if (v == nullptr) return f;
  if (std::strcmp(v, "grid") == 0) return {0, false};
  if (std::strncmp(v, "flat", 4) != 0) return f;
  v += 4;
  f.flat_rows = 1;
  if (*v == '2' || *v == '4') f.flat_rows = *v++ - '0';
  f.pdl = std::strcmp(v, "_pdl") == 0;
  return f;
}

// Unset: "atomic" (2.97 TB/s vs 2.26 for "rows", the sorted-runs path, on the H200 2026-11-30).
enum class BackwardVariant { kRows, kPacks, kAtomic, kAtomicNoPdl };
BackwardVariant BackwardVariantFromEnv() {
  const char* v = std::getenv("SG_EMBEDDING_BWD");
  if (v == nullptr) return BackwardVariant::kAtomic;
  if (std::strcmp(v, "rows") == 0) return BackwardVariant::kRows;
  if (std::strcmp(v, "packs") == 0) return BackwardVariant::kPacks;
  if (std::strcmp(v, "atomic_nopdl") == 0) return BackwardVariant::kAtomicNoPdl;
  return BackwardVariant::kAtomic;
}

int EndBit(int64_t vocab) {  // bits for keys in [0, vocab]
  int bits = 1;
  while ((int64_t(1) << bits) <= vocab) ++bits;
  return bits;
}

template <typename I>
absl::Status ForwardFlat(const Problem& p, const I* tokens, const void* table, void* out, int rows, bool pdl,
                         cudaStream_t s) {
  const uint32_t units = uint32_t(p.dim * SizeOf(p.dtype) / 16);
  const dim3 grid(unsigned((p.tokens + rows - 1) / rows), (units + kFlatThreads - 1) / kFlatThreads);
  const uint4* tt = static_cast<const uint4*>(table);
  uint4* ot = static_cast<uint4*>(out);
  cudaError_t err = cudaSuccess;
  if (rows == 4) {
    err = LaunchMaybePdl(ForwardFlatKernel<I, 4>, grid, kFlatThreads, s, pdl, tokens, tt, ot, p.tokens, p.vocab, units);
  } else if (rows == 2) {
    err = LaunchMaybePdl(ForwardFlatKernel<I, 2>, grid, kFlatThreads, s, pdl, tokens, tt, ot, p.tokens, p.vocab, units);
  } else {
    err = LaunchMaybePdl(ForwardFlatKernel<I, 1>, grid, kFlatThreads, s, pdl, tokens, tt, ot, p.tokens, p.vocab, units);
  }
  SG_CUDA_RETURN_IF_ERROR(err /* launch of ForwardFlatKernel */);
  return absl::OkStatus();
}

template <typename T, typename I>
absl::Status Forward(const Problem& p, const void* tokens, const void* table, void* out, cudaStream_t s) {
  const ForwardVariant variant = ForwardVariantFromEnv();
  const int64_t row_bytes = p.dim * int64_t(sizeof(T));
  // The flat kernel's grid: token rows on x (< 2^31 CTAs), a row's units on y (< 65536 CTAs).
  if (variant.flat_rows > 0 && row_bytes % 16 == 0 && cuda_vec::Aligned16(table) && cuda_vec::Aligned16(out) &&
      row_bytes / 16 <= int64_t(65535) * kFlatThreads && p.tokens / variant.flat_rows < (int64_t(1) << 31) - 1) {
    return ForwardFlat<I>(p, static_cast<const I*>(tokens), table, out, variant.flat_rows, variant.pdl, s);
  }
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
  if (vec && BackwardVariantFromEnv() != BackwardVariant::kPacks) {
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
  const BackwardVariant variant = BackwardVariantFromEnv();
  if (variant == BackwardVariant::kAtomic || variant == BackwardVariant::kAtomicNoPdl) {
    return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, variant == BackwardVariant::kAtomic);
  }
  if (p.dtype == DType::kBF16) return BackwardAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s);
  if (p.dtype == DType::kF16) return BackwardAlloc<__half>(p, dout, tokens, dtable, device, s);
  return BackwardAlloc<float>(p, dout, tokens, dtable, device, s);
}

}  // namespace sg::kernels::embedding_internal
