// The embedding backward as one kernel with no index preparation (SG_EMBEDDING_BWD=scan, scan32,
// scan128: R = 64, 32 or 128 vocabulary rows per CTA). CTA c owns dtable rows [c * R, c * R + R):
//   1. it reads every token id (from L2 after the first CTAs: 64 KB for 16384 i32 ids; 16-byte
//      loads, the next step's loads in flight while the current step is compacted) and appends the
//      (token, row) pairs whose id falls into its rows to a shared-memory list, in token order:
//      per step each thread's matches are counted, a warp prefix from bit-sliced ballots and one
//      barrier over the warps' totals give every match its slot; per-row counts on the side;
//   2. warp 0 orders the list by row, stably (so each row's tokens stay ascending): the counts'
//      exclusive scan gives each row's start, a walk over the list 32 entries at a time places
//      them (__match_any_sync ranks equal rows within the 32);
//   3. each row's dout rows are summed in f32 in that order, 0 + dout[t0] + dout[t1] + ..., and
//      the row is written with 16-byte stores (zeros for a row without tokens): the CPU
//      reference's additions in its order, so dtable is bitwise the reference's.
// The list holds kListCap pairs. When the ids of one range overflow it (a hot id), the list is
// summed early: those rows are written as partial sums, and the next pass reads them back and goes
// on adding in token order (the same additions; a row's partial is only ever read by the thread
// that wrote it). Correct for any distribution; fast when ids are spread (~n * R / vocab pairs a
// CTA). Long runs (a hot id) keep 2 dout rows in flight per thread and prefetch 16 ahead to L2.
// Out-of-range ids match no CTA: their gradients drop, as in the other paths.
// L2 traffic for the ids: vocab / R * n * sizeof(id), e.g. 32 MB for 16384 i32 ids, vocab 32000
// and R = 64, against 326 MB of HBM traffic (dout read, dtable written).
// One launch, a programmatic dependent of the previous kernel (griddepcontrol.wait before any
// memory access), static shared memory only (under 48 KB), no scratch: capturable in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_cuda.cuh"

namespace sg::kernels::embedding_internal {
namespace {

using cuda_vec::Pack8;

constexpr int kWarps = kThreads / 32;
constexpr int kScanVecs = 2;       // 16-byte id loads per thread and step
constexpr int kListCap = 4096;     // (token, row) pairs a CTA lists before it must sum them
constexpr int kGroupRows = 4;      // rows whose first dout rows are loaded together
constexpr int kRunAhead = 16;      // L2 prefetch distance along a long run, in dout rows

// dout rows in flight per thread along one run: 2 for 2-byte types, 1 for f32 (ptxas -v: more
// spill under the 80 registers that 3 CTAs an SM leave; the kernel's remaining spill stores are
// the registers saved around the out-of-line SumListEarly call, the rare path).
template <typename T>
constexpr int kRunUnroll = sizeof(T) == 4 ? 1 : 2;
template <typename I>
constexpr int kIdsPerVec = int(16 / sizeof(I));
// Token ids a CTA reads per step (one barrier each).
template <typename I>
constexpr int kStepIds = kThreads * kScanVecs * kIdsPerVec<I>;
static_assert(kListCap >= 2 * kStepIds<int32_t> && kListCap >= 2 * kStepIds<int64_t>,
              "the list must take at least two steps before it has to be summed early");

template <int R>
struct ScanShared {
  static_assert(R % 32 == 0 && R <= 256, "R: whole warps of rows, and a row index fits a byte");
  int token[kListCap];    // listed token positions, in token order
  int sorted[kListCap];   // the same, ordered by row (stable)
  uint8_t row[kListCap];  // listed tokens' rows, relative to the CTA's first row
  int count[R];           // listed tokens per row
  int begin[R + 1];       // row r's tokens: sorted[begin[r] .. begin[r + 1])
  int cursor[R];
  int touched[R];         // non-zero: dtable's row holds a partial sum from an early pass
  int totals[2][kScanVecs][kWarps];  // matches per (load, warp) of a step; double-buffered
};

// E ids from token position `first` (a multiple of E): one 16-byte load when the ids are 16-byte
// aligned and all E exist, else one at a time; -1 past the last token.
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

// The ids of the step at `base`: load q of thread t covers positions base + (q * kThreads + t) * E
// .. + E - 1, so the token order of a step is (q, warp, lane, e).
template <typename I>
__device__ __forceinline__ void LoadStep(const I* __restrict__ tokens, int64_t base, int64_t n, bool vec,
                                         I (&ids)[kScanVecs][kIdsPerVec<I>]) {
#pragma unroll
  for (int q = 0; q < kScanVecs; ++q) {
    LoadIds(tokens, base + (int64_t(q) * kThreads + threadIdx.x) * kIdsPerVec<I>, n, vec, ids[q]);
  }
}

// Appends the step's ids in [row0, row0 + rows) to the list (which holds `listed` pairs, and room
// for a whole step) in token order; returns the new length, the same in every thread. One barrier.
template <typename I, int R>
__device__ __forceinline__ int AppendStep(const I (&ids)[kScanVecs][kIdsPerVec<I>], int64_t base, int64_t row0,
                                          int rows, int listed, int parity, ScanShared<R>& sh) {
  constexpr int E = kIdsPerVec<I>;
  constexpr int kCountBits = E == 4 ? 3 : 2;  // a thread's matches per load: 0 .. E
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const unsigned lanes_below = (1u << lane) - 1;
  unsigned match[kScanVecs];
  int below[kScanVecs];  // matches of the lower lanes of the warp, same load
#pragma unroll
  for (int q = 0; q < kScanVecs; ++q) {
    match[q] = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t local = int64_t(ids[q][e]) - row0;
      if (local >= 0 && local < rows) match[q] |= 1u << e;
    }
    const int c = __popc(match[q]);
    int total = 0;
    below[q] = 0;
#pragma unroll
    for (int k = 0; k < kCountBits; ++k) {
      const unsigned bits = __ballot_sync(0xffffffffu, (c >> k) & 1);
      below[q] += __popc(bits & lanes_below) << k;
      total += __popc(bits) << k;
    }
    if (lane == 0) sh.totals[parity][q][warp] = total;
  }
  __syncthreads();
  int run = listed, at[kScanVecs] = {};
#pragma unroll
  for (int q = 0; q < kScanVecs; ++q) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w == warp) at[q] = run + below[q];
      run += sh.totals[parity][q][w];
    }
  }
#pragma unroll
  for (int q = 0; q < kScanVecs; ++q) {
    if (match[q] == 0) continue;
    const int64_t first = base + (int64_t(q) * kThreads + threadIdx.x) * E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if ((match[q] >> e) & 1) {
        const int r = int(int64_t(ids[q][e]) - row0);
        sh.token[at[q]] = int(first + e);
        sh.row[at[q]] = uint8_t(r);
        atomicAdd(&sh.count[r], 1);  // integer counts: the order of the increments does not matter
        ++at[q];
      }
    }
  }
  return run;
}

// Warp 0: begin[] from the counts, then the listed tokens into sorted[] by row, keeping token
// order within a row. The counts and the list must be visible to warp 0 (a barrier before).
template <int R>
__device__ __forceinline__ void OrderByRow(int listed, ScanShared<R>& sh) {
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

// kW columns of one dout row as floats: 8 with 16-byte loads, or 1.
template <typename T, int kW>
__device__ __forceinline__ void LoadCols(const T* __restrict__ p, float (&v)[kW]) {
  if constexpr (kW == 8) {
    Pack8<T>::Load(p, v);
  } else {
    v[0] = cuda_vec::ToF(*p);
  }
}

// A generic address: prefetch without a state space takes one.
__device__ __forceinline__ void PrefetchL2(const void* p) { asm volatile("prefetch.L2 [%0];" ::"l"(p)); }

// kW columns of one dout row kept as they are in memory (half the registers of floats for 2-byte
// types) until they are added.
template <typename T, int kW>
struct RawCols {
  cuda_vec::Raw8<T> v;
};
template <typename T>
struct RawCols<T, 1> {
  T v;
};
template <typename T, int kW>
__device__ __forceinline__ RawCols<T, kW> LoadRaw(const T* __restrict__ p) {
  RawCols<T, kW> r;
  if constexpr (kW == 8) {
    r.v = cuda_vec::LoadRawOnce(p);
  } else {
    r.v = *p;
  }
  return r;
}
template <typename T, int kW>
__device__ __forceinline__ void AddRaw(const RawCols<T, kW>& r, float (&acc)[kW]) {
  if constexpr (kW == 8) {
    float y[8];
    cuda_vec::Unpack(r.v, y);
#pragma unroll
    for (int w = 0; w < 8; ++w) acc[w] += y[w];
  } else {
    acc[0] += cuda_vec::ToF(r.v);
  }
}

// acc += dout[sorted[j], col ..] for j = j .. end - 1, in that order, kRunUnroll loads in flight;
// runs longer than that prefetch kRunAhead rows ahead to L2.
template <typename T, int kW>
__device__ __forceinline__ void AddRun(const T* __restrict__ dout, const int* sorted, int j, int end, int64_t dim,
                                       int64_t col, float (&acc)[kW]) {
  if (end - j > 2 * kRunUnroll<T>) {
    for (int k = j + kRunUnroll<T>; k < end && k < j + kRunAhead; ++k) PrefetchL2(dout + int64_t(sorted[k]) * dim + col);
  }
#pragma unroll 1
  for (; j < end; j += kRunUnroll<T>) {
#pragma unroll
    for (int k = 0; k < kRunUnroll<T>; ++k) {
      if (j + kRunAhead + k < end) PrefetchL2(dout + int64_t(sorted[j + kRunAhead + k]) * dim + col);
    }
    RawCols<T, kW> y[kRunUnroll<T>];
#pragma unroll
    for (int k = 0; k < kRunUnroll<T>; ++k) {
      if (j + k < end) y[k] = LoadRaw<T, kW>(dout + int64_t(sorted[j + k]) * dim + col);
    }
#pragma unroll
    for (int k = 0; k < kRunUnroll<T>; ++k) {
      if (j + k < end) AddRaw<T, kW>(y[k], acc);
    }
  }
}

template <int kW>
__device__ __forceinline__ void StoreCols(float* __restrict__ p, const float (&v)[kW]) {
  if constexpr (kW == 8) {
    Pack8<float>::Store(p, v);
  } else {
    *p = v[0];
  }
}

// Sums the listed tokens into their rows (sorted[] and begin[] ready, visible to all threads).
// `last`: the final pass, which also writes zeros to rows that never had a token. Threads form
// teams of a power of two >= the packs of a row (at most the CTA): a team takes kGroupRows rows at
// a time, a thread the same packs of each (so a row's partial sum is read back by its writer).
// The common rows (no token, or one and no partial sum) go first, their dout rows in flight
// together; then, one row at a time, the runs of two or more tokens and the rows that continue a
// partial sum: fewer registers than carrying every row's accumulator through the long runs.
template <typename T, int kW, int R>
__device__ __forceinline__ void SumRows(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                        int rows, int64_t dim, bool last, const ScanShared<R>& sh) {
  const int packs = int(dim / kW);
  int team_size = 1;
  while (team_size < packs && team_size < kThreads) team_size <<= 1;
  const int teams = kThreads / team_size, team = int(threadIdx.x) / team_size;
  const int tl = int(threadIdx.x) - team * team_size;
  for (int g = team * kGroupRows; g < rows; g += teams * kGroupRows) {
    int first[kGroupRows];  // the token of a simple row with one, else -1
    bool simple[kGroupRows];
    unsigned runs = 0;  // bit r: row g + r goes through the run loop
#pragma unroll
    for (int r = 0; r < kGroupRows; ++r) {
      const bool ok = g + r < rows;
      const int begin = ok ? sh.begin[g + r] : 0, len = ok ? sh.begin[g + r + 1] - begin : 0;
      const bool partial = ok && sh.touched[g + r] != 0;
      simple[r] = (len == 1 && !partial) || (len == 0 && ok && last && !partial);
      first[r] = len == 1 && !partial ? sh.sorted[begin] : -1;
      if (len >= 2 || (len == 1 && partial)) runs |= 1u << r;
    }
#pragma unroll 1
    for (int c = tl; c < packs; c += team_size) {
      const int64_t col = int64_t(c) * kW;
      float acc[kGroupRows][kW];
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        if (first[r] >= 0) LoadCols<T, kW>(dout + int64_t(first[r]) * dim + col, acc[r]);
      }
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        if (simple[r]) {
#pragma unroll
          for (int w = 0; w < kW; ++w) acc[r][w] = first[r] >= 0 ? 0.f + acc[r][w] : 0.f;  // 0 + x, as the reference
          StoreCols<kW>(dtable + (row0 + g + r) * dim + col, acc[r]);
        }
      }
    }
    for (unsigned left = runs; left != 0; left &= left - 1) {
      const int row = g + __ffs(left) - 1;
      const int begin = sh.begin[row], end = sh.begin[row + 1];
      const bool partial = sh.touched[row] != 0;
      float* out = dtable + (row0 + row) * dim;
#pragma unroll 1
      for (int c = tl; c < packs; c += team_size) {
        const int64_t col = int64_t(c) * kW;
        float acc[kW];
        if (partial) {
          LoadCols<float, kW>(out + col, acc);
        } else {
#pragma unroll
          for (int w = 0; w < kW; ++w) acc[w] = 0.f;
        }
        AddRun<T, kW>(dout, sh.sorted, begin, end, dim, col, acc);
        StoreCols<kW>(out + col, acc);
      }
    }
  }
}

// One pass over the listed tokens: order them, sum them into their rows; unless `last`, marks the
// rows written and empties the list for the next steps. Every thread calls it (barriers inside).
template <typename T, int kW, int R>
__device__ __forceinline__ void SumList(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                        int rows, int64_t dim, int listed, bool last, ScanShared<R>& sh) {
  __syncthreads();  // the list and the counts complete
  if (threadIdx.x < 32) OrderByRow<R>(listed, sh);
  __syncthreads();
  SumRows<T, kW, R>(dout, dtable, row0, rows, dim, last, sh);
  if (last) return;
  __syncthreads();  // begin[], sorted[] and touched[] read by every thread
  for (int r = int(threadIdx.x); r < R; r += kThreads) {
    if (sh.count[r] > 0) sh.touched[r] = 1;
    sh.count[r] = 0;
  }
  // The next step's barrier orders these before the counts are used again.
}

// SumList for a list that overflowed (not the last pass): out of line, so that the ids of the
// next step, live across it, cost a spill around this rare call instead of registers everywhere.
template <typename T, int kW, int R>
__device__ __noinline__ void SumListEarly(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                          int rows, int64_t dim, int listed, ScanShared<R>& sh) {
  SumList<T, kW, R>(dout, dtable, row0, rows, dim, listed, false, sh);
}

// R vocabulary rows per CTA; kW = 8: dim % 8 == 0 and dout, dtable 16-byte aligned.
template <typename T, typename I, int kW, int R>
__global__ void __launch_bounds__(kThreads, 3)
    ScanBackwardKernel(const T* __restrict__ dout, const I* __restrict__ tokens, float* __restrict__ dtable,
                       int64_t n, int64_t vocab, int64_t dim, bool ids_vec) {
  WaitForPrimary();
  __shared__ ScanShared<R> sh;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int rows = int(vocab - row0 < R ? vocab - row0 : R);
  for (int r = int(threadIdx.x); r < R; r += kThreads) {
    sh.count[r] = 0;
    sh.touched[r] = 0;
  }
  // Ordered before any use by the first step's barrier, or SumList's when there are no tokens.
  constexpr int64_t kStep = kStepIds<I>;
  I ids[kScanVecs][kIdsPerVec<I>];
  LoadStep(tokens, 0, n, ids_vec, ids);
  int listed = 0, parity = 0;
  for (int64_t base = 0; base < n; base += kStep) {
    I next[kScanVecs][kIdsPerVec<I>];
    LoadStep(tokens, base + kStep, n, ids_vec, next);  // in flight while this step is listed
    listed = AppendStep<I, R>(ids, base, row0, rows, listed, parity, sh);
    parity ^= 1;
    if (listed > kListCap - kStep) {  // the next step might not fit: sum what is listed now
      SumListEarly<T, kW, R>(dout, dtable, row0, rows, dim, listed, sh);
      listed = 0;
    }
#pragma unroll
    for (int q = 0; q < kScanVecs; ++q) {
#pragma unroll
      for (int e = 0; e < kIdsPerVec<I>; ++e) ids[q][e] = next[q][e];
    }
  }
  SumList<T, kW, R>(dout, dtable, row0, rows, dim, listed, true, sh);
}

template <typename T, typename I, int R>
absl::Status LaunchScan(const Problem& p, const T* dout, const I* tokens, float* dtable, cudaStream_t s) {
  const dim3 grid(unsigned((p.vocab + R - 1) / R));
  const bool ids_vec = cuda_vec::Aligned16(tokens);
  const bool vec = p.dim % 8 == 0 && cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  cudaError_t err = vec ? LaunchMaybePdl(ScanBackwardKernel<T, I, 8, R>, grid, kThreads, s, true, dout, tokens,
                                         dtable, p.tokens, p.vocab, p.dim, ids_vec)
                        : LaunchMaybePdl(ScanBackwardKernel<T, I, 1, R>, grid, kThreads, s, true, dout, tokens,
                                         dtable, p.tokens, p.vocab, p.dim, ids_vec);
  SG_CUDA_RETURN_IF_ERROR(err /* launch of ScanBackwardKernel */);
  return absl::OkStatus();
}

template <typename T, int R>
absl::Status Scan(const Problem& p, const void* dout, const void* tokens, float* dtable, cudaStream_t s) {
  const T* d = static_cast<const T*>(dout);
  return p.tokens_i64 ? LaunchScan<T, int64_t, R>(p, d, static_cast<const int64_t*>(tokens), dtable, s)
                      : LaunchScan<T, int32_t, R>(p, d, static_cast<const int32_t*>(tokens), dtable, s);
}

template <int R>
absl::Status ScanFor(const Problem& p, const void* dout, const void* tokens, float* dtable, cudaStream_t s) {
  if (p.dtype == DType::kBF16) return Scan<__nv_bfloat16, R>(p, dout, tokens, dtable, s);
  if (p.dtype == DType::kF16) return Scan<__half, R>(p, dout, tokens, dtable, s);
  return Scan<float, R>(p, dout, tokens, dtable, s);
}

}  // namespace

absl::Status BackwardScanCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int rows,
                              cudaStream_t s) {
  if (p.dim > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbeddingBackward: the CUDA kernel takes rows of at most 2^31 - 1 columns, found dim ", p.dim));
  }
  if (rows == 32) return ScanFor<32>(p, dout, tokens, dtable, s);
  if (rows == 128) return ScanFor<128>(p, dout, tokens, dtable, s);
  return ScanFor<64>(p, dout, tokens, dtable, s);
}

}  // namespace sg::kernels::embedding_internal
