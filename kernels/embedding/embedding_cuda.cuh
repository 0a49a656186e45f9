// Device code shared by the CUDA files of the embedding (nvcc only): the row sums of the backward
// over runs of token positions already in ascending order, a launcher with optional programmatic
// dependent launch, and the entries of the "atomic" and "atomic2s" backwards (embedding_atomic.cu),
// which embedding.cu dispatches to.
//
// A run: the token positions order[offsets[v]] .. order[offsets[v + 1] - 1] whose id is v,
// ascending, so dtable[v, :] = 0 + dout[order[begin], :] + dout[order[begin + 1], :] + ... in f32:
// the CPU reference's additions in the CPU reference's order, hence bitwise equal results.
#ifndef SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_CUDA_CUH_
#define SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_CUDA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_internal.h"

namespace sg::kernels::embedding_internal {

constexpr int kThreads = 256;
constexpr int kSumRows = 4;  // vocabulary rows per CTA of the row-sum kernels
static_assert(kSumRows <= kThreads / 32, "the atomic path sorts each CTA's short runs one warp per row");

// Waits for the previous kernel on the stream when launched as its programmatic dependent; returns
// at once otherwise. Every kernel that LaunchMaybePdl may launch with pdl = true calls it before
// touching memory.
__device__ __forceinline__ void WaitForPrimary() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the next kernel on the stream, if launched as this one's programmatic dependent, be scheduled
// now rather than when this grid ends (its CTAs then wait in WaitForPrimary, holding their SM
// slots). Ordering is unchanged: WaitForPrimary still waits for this whole grid and its writes.
__device__ __forceinline__ void TriggerDependents() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// kernel<<<grid, threads, 0, s>>>(args...), as a programmatic dependent of the previous kernel on
// the stream when `pdl` (it may be scheduled while that kernel drains; see WaitForPrimary).
// `smem`: dynamic shared memory bytes (the kernel's attribute must allow them).
template <typename... KArgs, typename... Args>
cudaError_t LaunchMaybePdlSmem(void (*kernel)(KArgs...), dim3 grid, int threads, size_t smem, cudaStream_t s,
                               bool pdl, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KArgs>(args)...);
}
template <typename... KArgs, typename... Args>
cudaError_t LaunchMaybePdl(void (*kernel)(KArgs...), dim3 grid, int threads, cudaStream_t s, bool pdl,
                           Args... args) {
  return LaunchMaybePdlSmem(kernel, grid, threads, 0, s, pdl, args...);
}

// acc += dout rows order[j .. end), columns 8c .. 8c + 7, in that order: four rows' loads in flight
// before their additions, which stay in order (SumRunsThen's loop over a run's repeated rows).
// `end` by reference: so nvcc compiles SumRunsThen as it did before this helper existed (the code
// measured on the H200); by value it unrolls the loop differently.
template <typename T>
__device__ __forceinline__ void AddRun(const T* __restrict__ dout, const int32_t* order, int32_t j, const int32_t& end,
                                       int64_t dim, int c, float (&acc)[8]) {
  for (; j + 4 <= end; j += 4) {
    cuda_vec::Raw8<T> y[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) y[u] = cuda_vec::LoadRawOnce(dout + int64_t(order[j + u]) * dim + c * 8);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float f[8];
      cuda_vec::Unpack(y[u], f);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += f[k];
    }
  }
  for (; j < end; ++j) {
    float y[8];
    cuda_vec::Pack8<T>::Load(dout + int64_t(order[j]) * dim + c * 8, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += y[k];
  }
}

// The row sums of kSumRows rows, dim = 8 * packs, 16-byte aligned; [begin[r], end[r]) is row r's
// run in `order`. The rows' runs are independent chains in flight together; 32-bit column math. Used
// by every thread of the CTA. For each of the thread's packs c: store(r, c, acc) for every r,
// acc the run's sum of columns 8c .. 8c + 7 (0 when the run is empty).
template <typename T, typename Store>
__device__ __forceinline__ void SumRunsThen(const T* __restrict__ dout, const int32_t* order,
                                            const int32_t (&begin)[kSumRows], const int32_t (&end)[kSumRows],
                                            int packs, Store store) {
  const int64_t dim = int64_t(packs) * 8;
  // Most runs hold 0 or 1 dout rows (16k tokens over a 32k vocabulary): the first row of every run
  // is loaded for all kSumRows rows together, the rest (repeated tokens) after, in sorted order.
  int32_t first[kSumRows];
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) first[r] = begin[r] < end[r] ? order[begin[r]] : -1;
  for (int c = threadIdx.x; c < packs; c += kThreads) {
    float acc[kSumRows][8];
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      if (first[r] >= 0) cuda_vec::Pack8<T>::Load(dout + int64_t(first[r]) * dim + c * 8, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      // 0 + x, the CPU reference's first addition (it turns -0 into +0).
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[r][k] = first[r] >= 0 ? 0.f + acc[r][k] : 0.f;
      AddRun(dout, order, begin[r] + 1, end[r], dim, c, acc[r]);  // repeated ids
    }
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) store(r, c, acc[r]);
  }
}

// SumRunsThen storing row r's sums to dtable row v0 + r (those < vocab).
template <typename T>
__device__ __forceinline__ void SumRuns(const T* __restrict__ dout, const int32_t* order,
                                        const int32_t (&begin)[kSumRows], const int32_t (&end)[kSumRows],
                                        float* __restrict__ dtable, int64_t v0, int64_t vocab, int packs) {
  const int64_t dim = int64_t(packs) * 8;
  SumRunsThen<T>(dout, order, begin, end, packs, [&](int r, int c, const float (&acc)[8]) {
    if (v0 + r < vocab) cuda_vec::Pack8<float>::Store(dtable + (v0 + r) * dim + c * 8, acc);
  });
}

// SumRunsThen storing row r's sums to dtable row rows[r], an arbitrary row id (rows[r] < 0: none,
// its run empty; the "atomic2s" backward's compacted list of touched rows).
template <typename T>
__device__ __forceinline__ void SumRuns(const T* __restrict__ dout, const int32_t* order,
                                        const int32_t (&begin)[kSumRows], const int32_t (&end)[kSumRows],
                                        float* __restrict__ dtable, const int32_t (&rows)[kSumRows], int packs) {
  const int64_t dim = int64_t(packs) * 8;
  SumRunsThen<T>(dout, order, begin, end, packs, [&](int r, int c, const float (&acc)[8]) {
    if (rows[r] >= 0) cuda_vec::Pack8<float>::Store(dtable + int64_t(rows[r]) * dim + c * 8, acc);
  });
}

// Loads the kSumRows rows' run bounds (zero-length runs past the vocabulary).
__device__ __forceinline__ void LoadRuns(const int32_t* __restrict__ offsets, int64_t v0, int64_t vocab,
                                         int32_t (&begin)[kSumRows], int32_t (&end)[kSumRows]) {
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) {
    const bool ok = v0 + r < vocab;
    begin[r] = ok ? offsets[v0 + r] : 0;
    end[r] = ok ? offsets[v0 + r + 1] : 0;
  }
}

// Internal linkage: each .cu file gets its own copy of the kernel (no shared host launch stub
// between two separately compiled device modules).
namespace {

// The row sum without the 16-byte layout (any dim, any alignment): one thread per (row, column),
// grid-stride, with a 64-bit division per element and the run bounds loaded by every thread.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RowSumKernel(const T* __restrict__ dout, const int32_t* __restrict__ order, const int32_t* __restrict__ offsets,
                 float* __restrict__ dtable, int64_t vocab, int64_t dim) {
  const int64_t total = vocab * dim;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t v = i / dim, c = i - v * dim;
    float acc = 0.f;
    const int32_t end = offsets[v + 1];
    for (int32_t j = offsets[v]; j < end; ++j) acc += cuda_vec::ToF(dout[int64_t(order[j]) * dim + c]);
    dtable[i] = acc;
  }
}

}  // namespace

// The backward with the "atomic" index preparation (embedding_atomic.cu); `pdl` chains its kernels
// with programmatic dependent launch.
absl::Status BackwardAtomicCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                cudaStream_t s, bool pdl);

// The "atomic2s" backward (embedding_atomic.cu): the atomic path's index preparation and row sums
// of touched rows on `s` at a high priority, overlapped with the zero fill of the untouched rows on
// a cached side stream; joined back into `s` before it returns. Falls back to the atomic path
// where the rows lack the 16-byte layout.
absl::Status BackwardAtomic2sCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                  cudaStream_t s);

}  // namespace sg::kernels::embedding_internal

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_CUDA_CUH_
