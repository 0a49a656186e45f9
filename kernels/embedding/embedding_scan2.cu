// The embedding backward as one kernel (SG_EMBEDDING_BWD=scan2: R = 64 vocabulary rows per CTA),
// the index work of the deleted "scan" kernel (git bfa87c6) with a row-sum phase built to keep many
// dout loads in flight. CTA c owns dtable rows [c * R, c * R + R); steps 1 and 2 live in
// embedding_scan_list.cuh (shared with scan3, embedding_scan3.cu):
//   1. it reads every token id (16-byte loads from L2, two steps of ids in flight) and appends
//      the (token, row) pairs whose id falls into its rows to a shared-memory list in token order:
//      per step a warp prefix from bit-sliced ballots and one barrier over the warps' totals give
//      every match its slot; per-row counts on the side;
//   2. warp 0 orders the list by row, stably (each row's tokens stay ascending), and lists the
//      rows whose run is longer than kLongRun;
//   3. the sums, in f32 in token order from 0 (0 + dout[t0] + dout[t1] + ...: the CPU reference's
//      additions in its order, so bitwise its result):
//      a. long runs (a hot id) by the whole CTA, a thread per 8 columns, kLongTokens dout rows in
//         flight per thread and L2 prefetches kRunAhead rows ahead;
//      b. every other row by one warp (warp w: rows w, w + kWarps, ...), the lanes on 8 columns
//         each: a row of one token loads kSinglePacks packs per lane before storing any (64 bytes
//         a lane, 32 KB a CTA, 64 KB an SM in flight); short runs kRunTokens dout rows at a time;
//         a row without tokens is written with 16-byte streaming stores. Warps move on
//         independently, so zero rows' stores overlap other warps' gathered loads.
// Why 512 threads and 2 CTAs an SM: the former scan kernel's sums (256 threads, one dout row load
// per thread at a time) reached only ~2.4-2.9 TB/s; Little's law wants several MB in flight.
// The list holds kListCap pairs. When one range's ids overflow it (a hot id), the list is summed
// early: those rows are written as partial sums, the next pass reads them back (after a barrier)
// and goes on adding in token order -- the same additions. Correct for any distribution.
// Out-of-range ids match no CTA: their gradients drop, as in the other paths.
// One launch, a programmatic dependent of the previous kernel, static shared memory (< 48 KB), no
// scratch: capturable in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_cuda.cuh"
#include "kernels/embedding/embedding_scan_list.cuh"

namespace sg::kernels::embedding_internal {
namespace {

constexpr int kScan2Threads = 512;
constexpr int kWarps = kScan2Threads / 32;
constexpr int kListCap = 4096;  // (token, row) pairs a CTA lists before it must sum them
constexpr int kLongRun = 64;    // runs longer than this are summed by the whole CTA
constexpr int kRunAhead = 32;   // L2 prefetch distance along a long run, in dout rows

// Per-lane work of the sums, sized so the live registers stay under the 64 that 2 CTAs of 512
// threads leave: raw dout packs in flight (16 bytes each for 2-byte types, 32 for f32). ptxas -v
// (sm_90a): 64 registers for bf16 / f16, 56 for f32, no spills but a few bytes (4 with i32 ids,
// 12 with i64) saved around the out-of-line SumListEarly call, the rare overflow path; twice these
// (8 packs a lane, 8 long-run tokens, 2 x 2 short-run loads) spilled 200-300 bytes.
template <typename T>
constexpr int kSinglePacks = sizeof(T) == 4 ? 2 : 4;
constexpr int kRunPacks = 1;
template <typename T>
constexpr int kRunTokens = sizeof(T) == 4 ? 1 : 2;
template <typename T>
constexpr int kLongTokens = sizeof(T) == 4 ? 2 : 4;

using scan_list::kIdsPerVec;
template <typename I>
constexpr int kStepIds = scan_list::kStepIds<I, kScan2Threads>;
// The id list (embedding_scan_list.cuh) with room for two steps of either id type.
template <int R>
using Scan2Shared = scan_list::ScanList<kScan2Threads, kListCap, R>;

// kW columns of a dout row kept as in memory (Raw8: half the registers of floats for 2-byte
// types) from the load until the addition; kW is 8 (16-byte layout) or 1.
template <typename T, int kW>
struct Cols {
  cuda_vec::Raw8<T> v;
  __device__ __forceinline__ void Load(const T* p) { v = cuda_vec::LoadRawOnce(p); }
  __device__ __forceinline__ void AddTo(float (&acc)[8]) const {
    float y[8];
    cuda_vec::Unpack(v, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += y[k];
  }
};
template <typename T>
struct Cols<T, 1> {
  T v;
  __device__ __forceinline__ void Load(const T* p) { v = *p; }
  __device__ __forceinline__ void AddTo(float (&acc)[1]) const { acc[0] += cuda_vec::ToF(v); }
};

template <int kW>
__device__ __forceinline__ void LoadAcc(const float* p, float (&acc)[kW]) {
  if constexpr (kW == 8) {
    cuda_vec::Pack8<float>::Load(p, acc);
  } else {
    acc[0] = *p;
  }
}
template <int kW>
__device__ __forceinline__ void StoreAcc(float* p, const float (&acc)[kW]) {
  if constexpr (kW == 8) {
    cuda_vec::Pack8<float>::Store(p, acc);
  } else {
    *p = acc[0];
  }
}
template <int kW>
__device__ __forceinline__ void StoreZeros(float* p) {
  if constexpr (kW == 8) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(0.f, 0.f, 0.f, 0.f));
    __stcs(reinterpret_cast<float4*>(p) + 1, make_float4(0.f, 0.f, 0.f, 0.f));
  } else {
    __stcs(p, 0.f);
  }
}

// A generic address: prefetch without a state space takes one.
__device__ __forceinline__ void PrefetchL2(const void* p) { asm volatile("prefetch.L2 [%0];" ::"l"(p)); }

// The run sorted[begin .. end) added to `out` (a partial sum when `partial`, else 0), by the whole
// CTA: thread t on packs t, t + kScan2Threads, ...; kLongTokens dout rows in flight.
template <typename T, int kW>
__device__ __forceinline__ void SumLongRun(const T* __restrict__ dout, const int* sorted, int begin, int end,
                                           bool partial, int packs, int64_t dim, float* out) {
  constexpr int kU = kLongTokens<T>;
#pragma unroll 1
  for (int c = int(threadIdx.x); c < packs; c += kScan2Threads) {
    const int64_t col = int64_t(c) * kW;
    float acc[kW];
    if (partial) {
      LoadAcc<kW>(out + col, acc);
    } else {
#pragma unroll
      for (int k = 0; k < kW; ++k) acc[k] = 0.f;
    }
    for (int k = begin; k < end && k < begin + kRunAhead; ++k) PrefetchL2(dout + int64_t(sorted[k]) * dim + col);
#pragma unroll 1
    for (int j = begin; j < end; j += kU) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (j + kRunAhead + u < end) PrefetchL2(dout + int64_t(sorted[j + kRunAhead + u]) * dim + col);
      }
      Cols<T, kW> y[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (j + u < end) y[u].Load(dout + int64_t(sorted[j + u]) * dim + col);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (j + u < end) y[u].AddTo(acc);
      }
    }
    StoreAcc<kW>(out + col, acc);
  }
}

// One row of one token (and no partial sum), by one warp: kSinglePacks packs per lane loaded
// before any is stored.
template <typename T, int kW>
__device__ __forceinline__ void CopyRow(const T* __restrict__ src, float* out, int packs, int lane) {
  constexpr int kP = kSinglePacks<T>;
#pragma unroll 1
  for (int c0 = lane; c0 < packs; c0 += 32 * kP) {
    Cols<T, kW> y[kP];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      if (c0 + 32 * p < packs) y[p].Load(src + int64_t(c0 + 32 * p) * kW);
    }
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      if (c0 + 32 * p < packs) {
        float acc[kW];
#pragma unroll
        for (int k = 0; k < kW; ++k) acc[k] = 0.f;
        y[p].AddTo(acc);  // 0 + x, the reference's first addition (it turns -0 into +0)
        StoreAcc<kW>(out + int64_t(c0 + 32 * p) * kW, acc);
      }
    }
  }
}

// A short run (or a continued partial sum), by one warp: kRunPacks packs per lane, kRunTokens dout
// rows of them in flight, added in order.
template <typename T, int kW>
__device__ __forceinline__ void SumShortRun(const T* __restrict__ dout, const int* sorted, int begin, int end,
                                            bool partial, int packs, int64_t dim, float* out, int lane) {
  constexpr int kP = kRunPacks, kU = kRunTokens<T>;
#pragma unroll 1
  for (int c0 = lane; c0 < packs; c0 += 32 * kP) {
    float acc[kP][kW];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      if (partial && c0 + 32 * p < packs) {
        LoadAcc<kW>(out + int64_t(c0 + 32 * p) * kW, acc[p]);
      } else {
#pragma unroll
        for (int k = 0; k < kW; ++k) acc[p][k] = 0.f;
      }
    }
#pragma unroll 1
    for (int j = begin; j < end; j += kU) {
      Cols<T, kW> y[kU][kP];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (j + u < end) {
          const T* src = dout + int64_t(sorted[j + u]) * dim;
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            if (c0 + 32 * p < packs) y[u][p].Load(src + int64_t(c0 + 32 * p) * kW);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (j + u < end) {
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            if (c0 + 32 * p < packs) y[u][p].AddTo(acc[p]);
          }
        }
      }
    }
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      if (c0 + 32 * p < packs) StoreAcc<kW>(out + int64_t(c0 + 32 * p) * kW, acc[p]);
    }
  }
}

// Sums the listed tokens into their rows (sorted[], begin[], the long rows ready and visible).
// `last`: the final pass, which also writes zeros to rows that never had a token.
template <typename T, int kW, int R>
__device__ __forceinline__ void SumRows(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                        int rows, int64_t dim, bool last, const Scan2Shared<R>& sh) {
  const int packs = int(dim / kW);
  const int num_long = sh.num_long;
#pragma unroll 1
  for (int k = 0; k < num_long; ++k) {
    const int row = sh.long_rows[k];
    SumLongRun<T, kW>(dout, sh.sorted, sh.begin[row], sh.begin[row + 1], sh.touched[row] != 0, packs, dim,
                      dtable + (row0 + row) * dim);
  }
  const int lane = int(threadIdx.x) & 31;
#pragma unroll 1
  for (int row = int(threadIdx.x) >> 5; row < rows; row += kWarps) {
    const int begin = sh.begin[row], len = sh.begin[row + 1] - begin;
    const bool partial = sh.touched[row] != 0;
    float* out = dtable + (row0 + row) * dim;
    if (len > kLongRun) continue;
    if (len == 0) {
      if (last && !partial) {
#pragma unroll 1
        for (int c = lane; c < packs; c += 32) StoreZeros<kW>(out + int64_t(c) * kW);
      }
    } else if (len == 1 && !partial) {
      CopyRow<T, kW>(dout + int64_t(sh.sorted[begin]) * dim, out, packs, lane);
    } else {
      SumShortRun<T, kW>(dout, sh.sorted, begin, begin + len, partial, packs, dim, out, lane);
    }
  }
}

// One pass over the listed tokens: order them, sum them into their rows; unless `last`, marks the
// rows written and empties the list for the next steps. Every thread calls it (barriers inside).
template <typename T, int kW, int R>
__device__ __forceinline__ void SumList(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                        int rows, int64_t dim, int listed, bool last, Scan2Shared<R>& sh) {
  __syncthreads();  // the list and the counts complete
  if (threadIdx.x < 32) scan_list::OrderByRow(listed, kLongRun, sh);
  __syncthreads();
  SumRows<T, kW, R>(dout, dtable, row0, rows, dim, last, sh);
  if (last) return;
  __syncthreads();  // begin[], sorted[], touched[] read, and the partial sums written, by every thread
  for (int r = int(threadIdx.x); r < R; r += kScan2Threads) {
    if (sh.count[r] > 0) sh.touched[r] = 1;
    sh.count[r] = 0;
  }
  // The next step's barrier orders these before the counts are used again.
}

// SumList for a list that overflowed (not the last pass): out of line, so the registers of the
// ids in flight cost a save around this rare call instead of registers everywhere.
template <typename T, int kW, int R>
__device__ __noinline__ void SumListEarly(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                          int rows, int64_t dim, int listed, Scan2Shared<R>& sh) {
  SumList<T, kW, R>(dout, dtable, row0, rows, dim, listed, false, sh);
}

// R vocabulary rows per CTA; kW = 8: dim % 8 == 0 and dout, dtable 16-byte aligned.
template <typename T, typename I, int kW, int R>
__global__ void __launch_bounds__(kScan2Threads, 2)
    Scan2BackwardKernel(const T* __restrict__ dout, const I* __restrict__ tokens, float* __restrict__ dtable,
                        int64_t n, int64_t vocab, int64_t dim, bool ids_vec) {
  WaitForPrimary();
  __shared__ Scan2Shared<R> sh;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int rows = int(vocab - row0 < R ? vocab - row0 : R);
  for (int r = int(threadIdx.x); r < R; r += kScan2Threads) {
    sh.count[r] = 0;
    sh.touched[r] = 0;
  }
  // Ordered before any use by the first step's barrier, or SumList's when there are no tokens.
  constexpr int64_t kStep = kStepIds<I>;
  constexpr int E = kIdsPerVec<I>;
  const int64_t mine = int64_t(threadIdx.x) * E;
  I cur[E], nxt[E];
  scan_list::LoadIds(tokens, mine, n, ids_vec, cur);
  scan_list::LoadIds(tokens, kStep + mine, n, ids_vec, nxt);
  int listed = 0, parity = 0;
  for (int64_t base = 0; base < n; base += kStep) {
    I far[E];
    // In flight while two steps are listed.
    scan_list::LoadIds(tokens, base + 2 * kStep + mine, n, ids_vec, far);
    listed = scan_list::AppendStep(cur, base, row0, rows, listed, parity, sh);
    parity ^= 1;
    if (listed > kListCap - kStep) {  // the next step might not fit: sum what is listed now
      SumListEarly<T, kW, R>(dout, dtable, row0, rows, dim, listed, sh);
      listed = 0;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      cur[e] = nxt[e];
      nxt[e] = far[e];
    }
  }
  SumList<T, kW, R>(dout, dtable, row0, rows, dim, listed, true, sh);
}

template <typename T, typename I, int R>
absl::Status LaunchScan2(const Problem& p, const T* dout, const I* tokens, float* dtable, cudaStream_t s) {
  const dim3 grid(unsigned((p.vocab + R - 1) / R));
  const bool ids_vec = cuda_vec::Aligned16(tokens);
  const bool vec = p.dim % 8 == 0 && cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  cudaError_t err = vec ? LaunchMaybePdl(Scan2BackwardKernel<T, I, 8, R>, grid, kScan2Threads, s, true, dout,
                                         tokens, dtable, p.tokens, p.vocab, p.dim, ids_vec)
                        : LaunchMaybePdl(Scan2BackwardKernel<T, I, 1, R>, grid, kScan2Threads, s, true, dout,
                                         tokens, dtable, p.tokens, p.vocab, p.dim, ids_vec);
  SG_CUDA_RETURN_IF_ERROR(err /* launch of Scan2BackwardKernel */);
  return absl::OkStatus();
}

template <typename T, int R>
absl::Status Scan2(const Problem& p, const void* dout, const void* tokens, float* dtable, cudaStream_t s) {
  const T* d = static_cast<const T*>(dout);
  return p.tokens_i64 ? LaunchScan2<T, int64_t, R>(p, d, static_cast<const int64_t*>(tokens), dtable, s)
                      : LaunchScan2<T, int32_t, R>(p, d, static_cast<const int32_t*>(tokens), dtable, s);
}

template <int R>
absl::Status Scan2For(const Problem& p, const void* dout, const void* tokens, float* dtable, cudaStream_t s) {
  if (p.dtype == DType::kBF16) return Scan2<__nv_bfloat16, R>(p, dout, tokens, dtable, s);
  if (p.dtype == DType::kF16) return Scan2<__half, R>(p, dout, tokens, dtable, s);
  return Scan2<float, R>(p, dout, tokens, dtable, s);
}

}  // namespace

absl::Status BackwardScan2Cuda(const Problem& p, const void* dout, const void* tokens, float* dtable,
                               cudaStream_t s) {
  if (p.dim > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbeddingBackward: the CUDA kernel takes rows of at most 2^31 - 1 columns, found dim ", p.dim));
  }
  // 64 rows a CTA: on the H200 (2026-11-30) 128 rows measured 2.74 / 2.80 TB/s and 32 rows
  // 2.61 / 2.84 at vocab 32000 / 128256, against 2.75 / 2.92 for 64.
  return Scan2For<64>(p, dout, tokens, dtable, s);
}

}  // namespace sg::kernels::embedding_internal
