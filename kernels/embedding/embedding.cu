// CUDA embedding.
// Forward (ForwardFlatKernel): no loop; CTA (x, y) copies unit y * kFlatThreads + threadIdx.x of
//   token rows 2x and 2x + 1, each row's id loaded once per thread from one address (a broadcast),
//   32-bit column math, launched as a programmatic dependent of the previous kernel. A unit is 16
//   bytes, or 8, 4, 2 when the row's bytes or the pointers allow no more. On the H200 (2026-11-30,
//   16384 tokens of a 32000 x 2048 bf16 table, batch timing) this won: 3.99 TB/s, against 3.71 for
//   one row a CTA, 3.86 for four, 3.76 for the grid-stride kernel it replaced (deleted with them).
// Backward, deterministic without float atomics, SG_EMBEDDING_BWD selecting per call:
//   "atomic2s" (the default): the index preparation of "atomic" below and the sums of the rows
//     with tokens (a compacted list of them, four to a CTA) on the caller's stream at a high
//     priority, chained by programmatic dependent launch, while a side stream zeroes the rows
//     without tokens from the count on (evict-first stores where tokens * 4 >= vocab, 1.5-2%
//     faster than plain ones in the same process at 16384 of 32000), then joins
//     (embedding_atomic.cu); on tables of 64 MiB or more the side stream starts each call with an
//     "early fill" of the first rows (~2.5% at 16384 of 32000). Rows without the 16-byte layout
//     fall back to "atomic";
//   "atomic", "atomic_nopdl": counts, a scan and an
//     atomic scatter of the token positions, each run sorted in place before its row sum
//     (embedding_atomic.cu), chained by programmatic dependent launch unless "_nopdl";
//   "rows": the sorted index preparation below, then a row sum.
// Why atomic2s: on the H200 (2026-11-30 17:40, one call, Batch, decimal TB/s at vocab 32000 /
// 128256) atomic2s 3.39-3.41 / 4.11 (3.43-3.44 at 32000 since its sums run 4 CTAs per SM, 19:58), atomic 3.00-3.01 / 2.38, scan3 2.86 / 3.37, a plain zero fill
// of the table 4.39 / 4.48; 5% of the tokens on one id: atomic2s 1.56 / 3.19, atomic 1.25 / 2.11,
// scan3 1.01 / 3.34; dim 8 (the index preparation alone) atomic2s 30 us against atomic's 36 at
// 32000. Until then the default depended on the vocabulary (atomic up to 65536, scan3 above):
// (same call, 12:31) atomic 2.97 / 2.39 (2.81 at 32000 without PDL), scan3 2.81 / 3.38;
// 5% of the tokens on one id: atomic 1.16 / -, scan3 ~1.0 / 3.32. Removed as beaten: "scan2" (one
// kernel, per-thread dout loads: 2.76 / 2.91, hot 1.48 / 2.70), scan3 itself (one kernel, each CTA
// reading all ids and listing those of its 64 vocabulary rows, the dout rows pulled into a
// shared-memory ring by bulk copies; removed 2026-12-02: atomic2s beat it at every shape but a hot
// id at 128256, 3.19 against 3.34) and scan3's store variants (zero
// rows by streaming stores 2.87 / -, rows with tokens bulk-stored 2.72 / 3.39, 128 rows a CTA
// 2.94 / 3.47 but hot 3.06 at 128256). Earlier (11:02 the same day) atomic 3.00 / 2.40, scan2
// with 128 or 32 rows a CTA 2.74 / 2.80, 2.61 / 2.84; 5% of the tokens on one id: atomic 1.20 /
// 2.07. Earlier the same day (batch timing, 16384 tokens, dim 2048, bf16 dout -> f32 dtable):
// atomic 2.91 / 2.39, rows 2.24 / 2.11;
// with 5% of the tokens on one id, atomic 1.22 / 2.08, rows 0.87 / 1.61. A one-kernel "scan"
// backward (each CTA read all ids and summed its range of 32, 64 or 128 vocabulary rows; no index
// preparation) measured 2.37 / 2.36 (64 rows), 2.54 / 2.43 (32), 2.92 / 2.17 (128), hot 1.19 /
// 2.02: no better than atomic at the Llama shapes, so it was removed; it only won where the index
// preparation is all there is (dim 8: 14 us for 128 rows against 36 us for atomic).
// The sorted index preparation:
//   1. keys[i] = tokens[i] (out-of-range ids -> vocab, sorted past every real row), values[i] = i;
//   2. CUB's stable LSD radix sort of (key, value) pairs on the bits the vocabulary needs, so equal
//      ids keep ascending token order;
//   3. row starts: offsets[v] = first sorted index with key >= v (from key changes, no atomics);
//   4. the f32 row sums (RowSumRowsKernel), each vocabulary row's run of dout rows added in sorted
//      order, written once (zeros for unused rows): a CTA takes kSumRows vocabulary rows at a time,
//      its threads on the row's packs of 8 columns (SumRuns, embedding_cuda.cuh); rows without the
//      16-byte layout: RowSumKernel, one column per thread.
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

template <typename I>
__device__ __forceinline__ int64_t IdAt(const void* tokens, int64_t i) {
  return int64_t(static_cast<const I*>(tokens)[i]);
}

// The flat forward: CTA (x, y) copies unit u = y * kFlatThreads + threadIdx.x of token rows
// x * kFlatRows .. x * kFlatRows + kFlatRows - 1; every thread of the CTA loads a row's id from the
// same address (one broadcast transaction per warp), then all kFlatRows loads are in flight before
// the stores. Out-of-range ids write zeros. Any dtype: a unit U is raw bytes (uint4 .. uint16_t).
constexpr int kFlatThreads = 128;
constexpr int kFlatRows = 2;

template <typename I, typename U>
__global__ void __launch_bounds__(kFlatThreads)
    ForwardFlatKernel(const I* __restrict__ tokens, const U* __restrict__ table, U* __restrict__ out, int64_t n,
                      int64_t vocab, uint32_t units) {
  constexpr int kRows = kFlatRows;
  WaitForPrimary();
  const uint32_t u = blockIdx.y * kFlatThreads + threadIdx.x;
  if (u >= units) return;
  const int64_t t0 = int64_t(blockIdx.x) * kRows;
  int64_t id[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) id[r] = t0 + r < n ? int64_t(tokens[t0 + r]) : -1;
  U v[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    v[r] = U{};
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

// The backward selected per call by SG_EMBEDDING_BWD ("atomic", "atomic_nopdl", "atomic2s", "rows";
// unset or unknown: atomic2s, see the header); read at every call so benchmarks and tests
// can switch.
enum class BackwardVariant { kRows, kAtomic, kAtomicNoPdl, kAtomic2s };
BackwardVariant BackwardVariantFromEnv() {
  const char* v = std::getenv("SG_EMBEDDING_BWD");
  if (v != nullptr && std::strcmp(v, "rows") == 0) return BackwardVariant::kRows;
  if (v != nullptr && std::strcmp(v, "atomic") == 0) return BackwardVariant::kAtomic;
  if (v != nullptr && std::strcmp(v, "atomic_nopdl") == 0) return BackwardVariant::kAtomicNoPdl;
  if (v != nullptr && std::strcmp(v, "atomic2s") == 0) return BackwardVariant::kAtomic2s;
  return BackwardVariant::kAtomic2s;
}

int EndBit(int64_t vocab) {  // bits for keys in [0, vocab]
  int bits = 1;
  while ((int64_t(1) << bits) <= vocab) ++bits;
  return bits;
}

// The widest unit (16, 8, 4 or 2 bytes) that divides a row and both pointers' alignment.
int UnitBytes(int64_t row_bytes, const void* table, const void* out) {
  const uint64_t bits = uint64_t(row_bytes) | reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out);
  for (int unit = 16; unit > 2; unit /= 2) {
    if (bits % uint64_t(unit) == 0) return unit;
  }
  return 2;
}

template <typename I, typename U>
absl::Status ForwardFlat(const Problem& p, const I* tokens, const void* table, void* out, uint32_t units,
                         cudaStream_t s) {
  const dim3 grid(unsigned((p.tokens + kFlatRows - 1) / kFlatRows), (units + kFlatThreads - 1) / kFlatThreads);
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ForwardFlatKernel<I, U>, grid, kFlatThreads, s, true, tokens,
                                         static_cast<const U*>(table), static_cast<U*>(out), p.tokens, p.vocab,
                                         units));
  return absl::OkStatus();
}

template <typename I>
absl::Status Forward(const Problem& p, const void* tokens, const void* table, void* out, cudaStream_t s) {
  const int64_t row_bytes = p.dim * int64_t(SizeOf(p.dtype));
  const int unit = UnitBytes(row_bytes, table, out);
  const int64_t units = row_bytes / unit;
  // The grid: token rows on x (< 2^31 CTAs), a row's units on y (< 65536 CTAs).
  SG_CHECK_ARG(units <= int64_t(65535) * kFlatThreads && p.tokens / kFlatRows < (int64_t(1) << 31) - 1,
               "EmbeddingForward: CUDA takes rows of at most ", int64_t(65535) * kFlatThreads, " units of ", unit,
               " bytes and fewer than 2^32 - 2 tokens, found ", units, " units, ", p.tokens, " tokens");
  const I* ids = static_cast<const I*>(tokens);
  const uint32_t u = uint32_t(units);
  if (unit == 16) return ForwardFlat<I, uint4>(p, ids, table, out, u, s);
  if (unit == 8) return ForwardFlat<I, uint2>(p, ids, table, out, u, s);
  if (unit == 4) return ForwardFlat<I, uint32_t>(p, ids, table, out, u, s);
  return ForwardFlat<I, uint16_t>(p, ids, table, out, u, s);
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
  if (vec) {
    const unsigned blocks = unsigned((p.vocab + kSumRows - 1) / kSumRows);
    RowSumRowsKernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(dout), order, offsets, dtable, p.vocab,
                                                    int(p.dim / 8));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumRowsKernel);
    return absl::OkStatus();
  }
  const unsigned grid = cuda_vec::GridFor((p.vocab * p.dim + kThreads - 1) / kThreads);
  RowSumKernel<T><<<grid, kThreads, 0, s>>>(static_cast<const T*>(dout), order, offsets, dtable, p.vocab, p.dim);
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
  return p.tokens_i64 ? Forward<int64_t>(p, tokens, table, out, s) : Forward<int32_t>(p, tokens, table, out, s);
}

absl::Status BackwardCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                          void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (BackwardVariantFromEnv()) {
    case BackwardVariant::kAtomic:
      return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, true);
    case BackwardVariant::kAtomicNoPdl:
      return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, false);
    case BackwardVariant::kAtomic2s:
      return BackwardAtomic2sCuda(p, dout, tokens, dtable, device, s);
    case BackwardVariant::kRows:
      break;
  }
  if (p.dtype == DType::kBF16) return BackwardAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s);
  if (p.dtype == DType::kF16) return BackwardAlloc<__half>(p, dout, tokens, dtable, device, s);
  return BackwardAlloc<float>(p, dout, tokens, dtable, device, s);
}

}  // namespace sg::kernels::embedding_internal
