// The id listing of the one-kernel backward (embedding_scan3.cu), nvcc only. A CTA of kThreads
// threads owns R vocabulary rows [row0, row0 + R); it reads every token id and lists the (token,
// row) pairs whose id falls into its rows, in token order, then orders the list by row, stably
// (each row's tokens stay ascending: the order the sums must add them in).
//
//   ScanList<kThreads, kCap, R> list;  // in shared memory, count[] zeroed
//   listed = AppendStep<I>(ids, base, row0, rows, listed, parity, list);  // per step, one barrier
//   ...; __syncthreads(); if (threadIdx.x < 32) OrderByRow(listed, list); __syncthreads();
//   // row r's tokens: list.sorted[list.begin[r] .. list.begin[r + 1])
//
// The list holds kCap pairs; a caller whose next step might not fit sums the list early (see the
// kernel's pass logic). Everything here is a template.
#ifndef SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_SCAN_LIST_CUH_
#define SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_SCAN_LIST_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace sg::kernels::embedding_internal::scan_list {

template <typename I>
constexpr int kIdsPerVec = int(16 / sizeof(I));
// Ids a CTA of kThreads reads per step (one barrier).
template <typename I, int kThreads>
constexpr int kStepIds = kThreads * kIdsPerVec<I>;

template <int kThreads, int kCap, int R>
struct ScanList {
  static_assert(R % 32 == 0 && R <= 256, "R: whole warps of rows, and a row index fits a byte");
  static_assert(kThreads % 32 == 0, "whole warps");
  static_assert(kCap >= 2 * kStepIds<int32_t, kThreads> && kCap >= 2 * kStepIds<int64_t, kThreads>,
                "the list must take at least two steps before it has to be summed early");
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = R;
  int token[kCap];        // listed token positions, in token order
  int sorted[kCap];       // the same, ordered by row (stable)
  uint8_t row[kCap];      // listed tokens' rows, relative to the CTA's first row
  int count[R];           // listed tokens per row
  int begin[R + 1];       // row r's tokens: sorted[begin[r] .. begin[r + 1])
  int cursor[R];
  int touched[R];         // non-zero: dtable's row holds a partial sum from an early pass
  int totals[2][kWarps];  // matches per warp of a step; double-buffered
};

// The E ids from token position `first` (a multiple of E): one 16-byte load when the ids are
// 16-byte aligned and all E exist, else one at a time; -1 past the last token.
template <typename I>
__device__ __forceinline__ void LoadIds(const I* __restrict__ tokens, int64_t first, int64_t n, bool vec,
                                        I (&v)[kIdsPerVec<I>]) {
  constexpr int E = kIdsPerVec<I>;
  if (vec && first + E <= n) {
    if constexpr (sizeof(I) == 4) {
      const int4 raw = *reinterpret_cast<const int4*>(tokens + first);
      v[0] = raw.x, v[1] = raw.y, v[2] = raw.z, v[3] = raw.w;
    } else {
      const longlong2 raw = *reinterpret_cast<const longlong2*>(tokens + first);
      v[0] = raw.x, v[1] = raw.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] = first + e < n ? tokens[first + e] : I(-1);
  }
}

// Appends the step's ids (thread t: positions base + t * E .. + E - 1) in [row0, row0 + rows) to
// the list, which holds `listed` pairs and room for a whole step, in token order; returns the new
// length, the same in every thread. One barrier. Every thread of the CTA calls it.
template <typename I, int kThreads, int kCap, int R>
__device__ __forceinline__ int AppendStep(const I (&ids)[kIdsPerVec<I>], int64_t base, int64_t row0, int rows,
                                          int listed, int parity, ScanList<kThreads, kCap, R>& sh) {
  constexpr int E = kIdsPerVec<I>;
  constexpr int kCountBits = E == 4 ? 3 : 2;  // a thread's matches: 0 .. E
  constexpr int kWarps = kThreads / 32;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const unsigned lanes_below = (1u << lane) - 1;
  unsigned match = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t local = int64_t(ids[e]) - row0;
    if (local >= 0 && local < rows) match |= 1u << e;
  }
  const int c = __popc(match);
  int total = 0, below = 0;
#pragma unroll
  for (int k = 0; k < kCountBits; ++k) {
    const unsigned bits = __ballot_sync(0xffffffffu, (c >> k) & 1);
    below += __popc(bits & lanes_below) << k;
    total += __popc(bits) << k;
  }
  if (lane == 0) sh.totals[parity][warp] = total;
  __syncthreads();
  int run = listed, at = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) at = run + below;
    run += sh.totals[parity][w];
  }
  if (match != 0) {
    const int64_t first = base + int64_t(threadIdx.x) * E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if ((match >> e) & 1) {
        const int r = int(int64_t(ids[e]) - row0);
        sh.token[at] = int(first + e);
        sh.row[at] = uint8_t(r);
        atomicAdd(&sh.count[r], 1);  // integer counts: the order of the increments does not matter
        ++at;
      }
    }
  }
  return run;
}

// Warp 0: begin[] from the counts, then the listed tokens into sorted[] by row, keeping token order
// within a row. The counts and the list must be visible (a barrier before).
template <int kThreads, int kCap, int R>
__device__ __forceinline__ void OrderByRow(int listed, ScanList<kThreads, kCap, R>& sh) {
  constexpr int kPer = R / 32;  // rows per lane in the scan
  const int lane = int(threadIdx.x) & 31;
  int c[kPer], sum = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    c[k] = sh.count[lane * kPer + k];
    sum += c[k];
  }
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  int at = incl - sum;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    sh.begin[lane * kPer + k] = at;
    sh.cursor[lane * kPer + k] = at;
    at += c[k];
  }
  if (lane == 31) sh.begin[R] = at;
  __syncwarp();
  const unsigned lanes_below = (1u << lane) - 1;
  for (int j0 = 0; j0 < listed; j0 += 32) {
    const int j = j0 + lane;
    const int r = j < listed ? int(sh.row[j]) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, r);
    if (r >= 0) sh.sorted[sh.cursor[r] + __popc(peers & lanes_below)] = sh.token[j];
    __syncwarp();  // every lane has read cursor[r] before the leader moves it
    if (r >= 0 && lane == __ffs(peers) - 1) sh.cursor[r] += __popc(peers);
    __syncwarp();
  }
}

}  // namespace sg::kernels::embedding_internal::scan_list

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_SCAN_LIST_CUH_
