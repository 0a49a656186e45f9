// The embedding backward's "atomic" index preparation (SG_EMBEDDING_BWD=atomic or atomic_nopdl):
// five launches instead of the sort's seven or so, each cheap, chained by programmatic dependent
// launch (each kernel waits on griddepcontrol.wait before touching memory) unless "_nopdl":
//   1. ZeroKernel: the counts, the scan's tile states and its ticket to 0;
//   2. CountKernel: counts[id] += 1 per in-range token (int atomics: the counts are deterministic),
//      one atomic per distinct id of a warp (__match_any_sync), so a repeated id costs 1/32 of it;
//   3. ScanKernel: offsets = exclusive scan of counts[0 .. vocab] (offsets[vocab] = in-range tokens),
//      single pass: 4096 counts per CTA, each CTA's predecessor sum by decoupled look-back over the
//      tiles' published aggregates / inclusive prefixes; tiles taken in the order CTAs start (an
//      atomic ticket), so a CTA only waits on CTAs already running: no deadlock;
//   4. ScatterKernel: order[offsets[id] + slot] = i, slot from an atomic decrement of counts[id]
//      (again one atomic per distinct id of a warp); the order within a run is arbitrary;
//   5. SortSumRowsKernel: a CTA per kSumRows vocabulary rows first sorts each of its runs
//      ascending in place (runs of 2-32 one warp per row by rank; up to kBitonicCap a bitonic sort
//      in shared memory; longer, e.g. one id repeated thousands of times, a bitmap of positions per
//      window of kWindow tokens, read out in order), then sums them as the "rows" kernel does
//      (SumRuns), so dtable is bitwise that of the sorted path. Without the 16-byte layout a
//      SortRunsKernel sorts and the general RowSumKernel sums.
// "overlap" (SG_EMBEDDING_BWD=overlap) keeps steps 1 and 2 and folds the rest into one launch,
// OverlapKernel, whose CTAs take roles by an atomic ticket: scan tiles, then scatter CTAs (waiting
// on a count of finished tiles), then row CTAs of 32 rows that first zero their rows without tokens
// (the counts suffice: no wait), and only then wait for the scatter CTAs and sort and sum the rest.
// Why: at 16384 tokens over 32000 rows ~60% of dtable is zeros, so most of the write traffic
// streams while the scan and the scatter run, instead of after them; waits only on smaller tickets
// (running CTAs), each bounded (trap after ~2^35 clocks). Untested on a GPU as of 2026-11-30.
// Out-of-range ids are neither counted nor scattered: their gradients drop, as in the sorted path.
// Capturable in a CUDA graph: no host synchronization, scratch from the caching allocator, static
// shared memory only (under 48 KB, no opt-in attribute).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_cuda.cuh"

namespace sg::kernels::embedding_internal {
namespace {

constexpr int kScanPer = 16;                    // counts per thread of the scan (four int4)
constexpr int kScanTile = kThreads * kScanPer;  // counts per CTA of the scan
constexpr int kBitonicCap = 2048;               // longest run sorted in shared memory in one piece
constexpr int kWindowWords = 2048;              // bitmap words: a window of kWindowWords * 32 positions
constexpr int kWindow = kWindowWords * 32;
static_assert(kWindowWords % kThreads == 0, "each thread owns whole bitmap words");
// The tile states of the scan: status in the high word, the value in the low word.
constexpr unsigned long long kAggregate = 1ull << 32, kInclusive = 2ull << 32;

__global__ void __launch_bounds__(kThreads) ZeroKernel(int4* p, int64_t n4) {
  WaitForPrimary();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += int64_t(gridDim.x) * kThreads) {
    p[i] = make_int4(0, 0, 0, 0);
  }
}

// Token i's row, or -1 (past the tokens, or an out-of-range id).
template <typename I>
__device__ __forceinline__ int KeyAt(const I* tokens, int64_t i, int64_t n, int64_t vocab) {
  if (i >= n) return -1;
  const int64_t id = int64_t(tokens[i]);
  return id >= 0 && id < vocab ? int(id) : -1;
}

// Every lane of every warp runs to the __match_any_sync (no early return).
template <typename I>
__global__ void __launch_bounds__(kThreads) CountKernel(const I* __restrict__ tokens, int* counts, int64_t n,
                                                        int64_t vocab) {
  WaitForPrimary();
  const int key = KeyAt(tokens, int64_t(blockIdx.x) * kThreads + threadIdx.x, n, vocab);
  const unsigned same = __match_any_sync(0xffffffffu, key);
  const int lane = int(threadIdx.x) & 31;
  if (key >= 0 && lane == __ffs(same) - 1) atomicAdd(&counts[key], __popc(same));
}

template <typename I>
__global__ void __launch_bounds__(kThreads)
    ScatterKernel(const I* __restrict__ tokens, int* counts, const int* __restrict__ offsets, int* order, int64_t n,
                  int64_t vocab) {
  WaitForPrimary();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int key = KeyAt(tokens, i, n, vocab);
  const unsigned same = __match_any_sync(0xffffffffu, key);
  const int lane = int(threadIdx.x) & 31, leader = __ffs(same) - 1;
  int last = 0;  // the leader's counts[key] before its decrement: slots last - popc .. last - 1
  if (key >= 0 && lane == leader) last = atomicSub(&counts[key], __popc(same));
  last = __shfl_sync(0xffffffffu, last, leader);
  if (key >= 0) order[offsets[key] + last - 1 - __popc(same & ((1u << lane) - 1))] = int(i);
}

// The exclusive prefix sum of x over the CTA (blockDim.x == kThreads); *total = the sum of all.
__device__ __forceinline__ int BlockExclusiveSum(int x, int* warp_sums, int* total) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  int incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    const int s = warp_sums[w];
    if (w < warp) before += s;
    all += s;
  }
  __syncthreads();  // warp_sums may be reused
  *total = all;
  return before + incl - x;
}

__device__ __forceinline__ unsigned long long LoadVolatile(const unsigned long long* p) {
  return *reinterpret_cast<const volatile unsigned long long*>(p);
}

// Warp 0 of tile `tile`: the sum of all counts before the tile. Publishes the tile's aggregate, then
// walks back over its predecessors 32 at a time, adding aggregates until the nearest one that
// holds an inclusive prefix; finally publishes its own inclusive prefix.
__device__ int LookBack(unsigned long long* states, int64_t tile, int aggregate) {
  const int lane = int(threadIdx.x) & 31;
  int prefix = 0;
  if (tile > 0) {
    if (lane == 0) atomicExch(&states[tile], kAggregate | unsigned(aggregate));
    for (int64_t top = tile - 1;; top -= 32) {
      const int64_t k = top - lane;
      unsigned long long st = kInclusive;  // before tile 0: an inclusive prefix of 0
      if (k >= 0) {
        do {
          st = LoadVolatile(&states[k]);
        } while ((st >> 32) == 0);
      }
      const unsigned inclusive = __ballot_sync(0xffffffffu, (st & ~0xffffffffull) == kInclusive);
      const int stop = inclusive != 0 ? __ffs(inclusive) - 1 : 31;  // the nearest inclusive prefix
      prefix += int(__reduce_add_sync(0xffffffffu, lane <= stop ? unsigned(st & 0xffffffffu) : 0u));
      if (inclusive != 0) break;
    }
  }
  if (lane == 0) atomicExch(&states[tile], kInclusive | unsigned(prefix + aggregate));
  return prefix;
}

// offsets[tile * kScanTile .. + kScanTile) = that tile of the exclusive scan of counts (both padded
// to whole tiles). Every thread of the CTA calls it; tiles must be taken in the order CTAs start
// (a ticket), so the look-back only waits on running CTAs. Ends with a barrier.
__device__ __forceinline__ void ScanTile(const int* __restrict__ counts, unsigned long long* states, int64_t tile,
                                         int* __restrict__ offsets, int* warp_sums, int* prefix_shared) {
  const int64_t base = tile * kScanTile + int64_t(threadIdx.x) * kScanPer;
  int c[kScanPer];
#pragma unroll
  for (int q = 0; q < kScanPer / 4; ++q) {
    const int4 v = reinterpret_cast<const int4*>(counts + base)[q];
    c[4 * q] = v.x, c[4 * q + 1] = v.y, c[4 * q + 2] = v.z, c[4 * q + 3] = v.w;
  }
  int sum = 0;
#pragma unroll
  for (int k = 0; k < kScanPer; ++k) {
    const int x = c[k];
    c[k] = sum;
    sum += x;
  }
  int aggregate = 0;
  const int before = BlockExclusiveSum(sum, warp_sums, &aggregate);
  if (threadIdx.x < 32) {
    const int prefix = LookBack(states, tile, aggregate);
    if (threadIdx.x == 0) *prefix_shared = prefix;
  }
  __syncthreads();
  const int add = *prefix_shared + before;
#pragma unroll
  for (int q = 0; q < kScanPer / 4; ++q) {
    reinterpret_cast<int4*>(offsets + base)[q] =
        make_int4(add + c[4 * q], add + c[4 * q + 1], add + c[4 * q + 2], add + c[4 * q + 3]);
  }
  __syncthreads();
}

// offsets[0 .. tiles * kScanTile) = exclusive scan of counts (both padded to whole tiles).
__global__ void __launch_bounds__(kThreads)
    ScanKernel(const int* __restrict__ counts, unsigned long long* states, int* ticket, int* __restrict__ offsets) {
  WaitForPrimary();
  __shared__ int tile_shared, prefix_shared;
  __shared__ int warp_sums[kThreads / 32];
  if (threadIdx.x == 0) tile_shared = atomicAdd(ticket, 1);
  __syncthreads();
  ScanTile(counts, states, tile_shared, offsets, warp_sums, &prefix_shared);
}

struct SortShared {
  union {
    int keys[kBitonicCap];
    unsigned bits[kWindowWords];
  };
  int warp_sums[kThreads / 32];
};

// A run of 2..32 positions, by one whole warp: each lane's rank is the number of smaller positions
// (positions are distinct).
__device__ __forceinline__ void WarpSortRun(int* run, int len) {
  const int lane = int(threadIdx.x) & 31;
  const int x = lane < len ? run[lane] : INT_MAX;
  int rank = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) rank += __shfl_sync(0xffffffffu, x, j) < x ? 1 : 0;
  __syncwarp();
  if (lane < len) run[rank] = x;
}

__device__ __forceinline__ void CompareSwap(int* keys, int i, int l) {
  const int a = keys[i], b = keys[l];
  if (a > b) {
    keys[i] = b;
    keys[l] = a;
  }
}

// A run of 33..kBitonicCap positions, by the whole CTA: padded with INT_MAX to a power of two and
// sorted by the bitonic network whose first step of each merge compares mirrored pairs, so every
// comparison puts the smaller key at the lower index.
__device__ void BlockBitonicSortRun(int* run, int len, SortShared& sh) {
  int p = 64;
  while (p < len) p <<= 1;
  for (int k = int(threadIdx.x); k < p; k += kThreads) sh.keys[k] = k < len ? run[k] : INT_MAX;
  __syncthreads();
  for (int size = 2; size <= p; size <<= 1) {
    const int half = size >> 1;
    for (int k = int(threadIdx.x); k < p / 2; k += kThreads) {
      const int off = k & (half - 1), base = (k - off) * 2;
      CompareSwap(sh.keys, base + off, base + size - 1 - off);
    }
    __syncthreads();
    for (int stride = size >> 2; stride > 0; stride >>= 1) {
      for (int k = int(threadIdx.x); k < p / 2; k += kThreads) {
        const int off = k & (stride - 1), i = (k - off) * 2 + off;
        CompareSwap(sh.keys, i, i + stride);
      }
      __syncthreads();
    }
  }
  for (int k = int(threadIdx.x); k < len; k += kThreads) run[k] = sh.keys[k];
  __syncthreads();  // sh reused by the next run
}

// A run longer than kBitonicCap, by the whole CTA, through `tmp` (as long as the run): for each
// window of kWindow token positions a bitmap of the run's positions in it, each thread's words
// counted, a block scan placing them, the set bits written out in order; then copied back.
__device__ void BlockWindowSortRun(int* run, int* tmp, int len, int64_t n, SortShared& sh) {
  constexpr int kWordsPerThread = kWindowWords / kThreads;
  const int first_word = int(threadIdx.x) * kWordsPerThread;
  int written = 0;
  for (int64_t w0 = 0; w0 < n && written < len; w0 += kWindow) {
    for (int k = int(threadIdx.x); k < kWindowWords; k += kThreads) sh.bits[k] = 0;
    __syncthreads();
    for (int k = int(threadIdx.x); k < len; k += kThreads) {
      const int64_t d = int64_t(run[k]) - w0;
      if (d >= 0 && d < kWindow) atomicOr(&sh.bits[d >> 5], 1u << (d & 31));
    }
    __syncthreads();
    int count = 0;
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) count += __popc(sh.bits[first_word + j]);
    int total = 0;
    int at = written + BlockExclusiveSum(count, sh.warp_sums, &total);
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      for (unsigned b = sh.bits[first_word + j]; b != 0; b &= b - 1) {
        tmp[at++] = int(w0 + int64_t(first_word + j) * 32 + (__ffs(b) - 1));
      }
    }
    written += total;
    __syncthreads();  // bits cleared for the next window only after every thread read them
  }
  for (int k = int(threadIdx.x); k < len; k += kThreads) run[k] = tmp[k];
  __syncthreads();
}

// Sorts the kSumRows runs [begin[r], end[r]) of `order` ascending in place; all threads of the CTA
// call it with the same runs (a CTA owns its rows' runs). Returns at once when no run has two
// positions; otherwise ends with a barrier, after which the sorted runs are visible to the CTA.
__device__ __forceinline__ void SortRuns(int* order, int* tmp, const int32_t (&begin)[kSumRows],
                                         const int32_t (&end)[kSumRows], int64_t n, SortShared& sh) {
  bool any = false;
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) any = any || end[r] - begin[r] >= 2;
  if (!any) return;
  const int warp = int(threadIdx.x) >> 5;
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) {
    const int len = end[r] - begin[r];
    if (warp == r && len >= 2 && len <= 32) WarpSortRun(order + begin[r], len);
  }
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) {
    const int len = end[r] - begin[r];
    if (len > kBitonicCap) {
      BlockWindowSortRun(order + begin[r], tmp + begin[r], len, n, sh);
    } else if (len > 32) {
      BlockBitonicSortRun(order + begin[r], len, sh);
    }
  }
  __syncthreads();
}

// `order` is written (sorted) and then read by the same kernel: neither const nor __restrict__.
// At least 3 CTAs per SM: the f32 instantiation then fits 80 registers without the 8-byte spill
// ptxas gives it otherwise (the f32 "rows" kernel uses 80 too; bf16 and f16 use 58).
template <typename T>
__global__ void __launch_bounds__(kThreads, 3)
    SortSumRowsKernel(const T* __restrict__ dout, int* order, int* tmp, const int* __restrict__ offsets,
                      float* __restrict__ dtable, int64_t vocab, int packs, int64_t n) {
  WaitForPrimary();
  __shared__ SortShared sh;
  const int64_t v0 = int64_t(blockIdx.x) * kSumRows;
  int32_t begin[kSumRows], end[kSumRows];
  LoadRuns(offsets, v0, vocab, begin, end);
  SortRuns(order, tmp, begin, end, n, sh);
  SumRuns<T>(dout, order, begin, end, dtable, v0, vocab, packs);
}

__global__ void __launch_bounds__(kThreads)
    SortRunsKernel(int* order, int* tmp, const int* __restrict__ offsets, int64_t vocab, int64_t n) {
  WaitForPrimary();
  __shared__ SortShared sh;
  const int64_t v0 = int64_t(blockIdx.x) * kSumRows;
  int32_t begin[kSumRows], end[kSumRows];
  LoadRuns(offsets, v0, vocab, begin, end);
  SortRuns(order, tmp, begin, end, n, sh);
}

// --- "overlap": the same counts, the rest in one kernel whose zero rows need no scan ---------------

constexpr int kOverlapRows = 32;  // vocabulary rows per row CTA: one warp's ballot of their counts
static_assert(kOverlapRows == 32 && kOverlapRows % kSumRows == 0, "a row CTA's rows: one ballot, whole groups");
constexpr long long kSpinClocks = 1ll << 35;  // ~20 s: a protocol bug traps instead of hanging
// Control words after the zeroed counts and cursors: the role ticket, tiles scanned, scatter CTAs
// done.
constexpr int kCtlTicket = 0, kCtlScanned = 1, kCtlScattered = 2, kCtlWords = 4;
// dout rows in flight per thread along a run (raw 16- or 32-byte packs in registers): as many as
// fit OverlapKernel's 128 registers with at most a few spilled words (ptxas -v, nvcc 13.0, with the
// positions loaded a batch ahead: 12 bf16 rows spill 40 bytes, 10 still 32; f32: 4 rows none, 8
// spilled 132 bytes even without the positions ahead).
template <typename T>
constexpr int kRunLoads = sizeof(T) == 4 ? 4 : 12;

// The CTA's writes so far, then one count on `done` (the cooperative-groups grid-barrier pattern).
__device__ __forceinline__ void PublishDone(int* done) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(done, 1);
  }
}

// Until *done >= target, then the writes published before those counts are visible to the CTA.
// Only waits on CTAs with a smaller role ticket, which are running or done: no deadlock.
__device__ __forceinline__ void AwaitDone(const int* done, int target) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (*reinterpret_cast<const volatile int*>(done) < target) {
      if (clock64() - start > kSpinClocks) __trap();
      __nanosleep(64);
    }
    __threadfence();
  }
  __syncthreads();
}

// Row CTA, pass 2: the group's runs (bounds through L2: written by this kernel's scan CTAs).
__device__ __forceinline__ void LoadRunsCoherent(const int* offsets, int64_t v0, int64_t vocab,
                                                 int32_t (&begin)[kSumRows], int32_t (&end)[kSumRows]) {
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) {
    const bool ok = v0 + r < vocab;
    begin[r] = ok ? __ldcg(offsets + v0 + r) : 0;
    end[r] = ok ? __ldcg(offsets + v0 + r + 1) : 0;
  }
}

// The sorted runs of kSumRows rows from v0 (every thread of the CTA, dim = 8 * packs): only rows
// with tokens are written (the others were zeroed in pass 1). As SumRuns, the first dout row of
// every run is loaded for all rows together; a longer run then keeps kRunLoads<T> rows in flight,
// the next batch's positions loaded while they are. The same f32 additions in the same order.
template <typename T>
__device__ __forceinline__ void SumHitRuns(const T* __restrict__ dout, const int* order,
                                           const int32_t (&begin)[kSumRows], const int32_t (&end)[kSumRows],
                                           float* __restrict__ dtable, int64_t v0, int packs) {
  constexpr int K = kRunLoads<T>;
  const int64_t dim = int64_t(packs) * 8;
  int32_t first[kSumRows];
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) first[r] = begin[r] < end[r] ? order[begin[r]] : -1;
  for (int c = int(threadIdx.x); c < packs; c += kThreads) {
    cuda_vec::Raw8<T> head[kSumRows];
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      if (first[r] >= 0) head[r] = cuda_vec::LoadRawOnce(dout + int64_t(first[r]) * dim + c * 8);
    }
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) {
      if (first[r] < 0) continue;
      float acc[8];
      cuda_vec::Unpack(head[r], acc);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] = 0.f + acc[k];  // the CPU reference's first addition
      int32_t at[K];  // the batch's positions, loaded one batch ahead of its dout rows
#pragma unroll
      for (int u = 0; u < K; ++u) at[u] = begin[r] + 1 + u < end[r] ? order[begin[r] + 1 + u] : 0;
#pragma unroll 1
      for (int32_t j = begin[r] + 1; j < end[r]; j += K) {
        cuda_vec::Raw8<T> y[K];
#pragma unroll
        for (int u = 0; u < K; ++u) {
          if (j + u < end[r]) y[u] = cuda_vec::LoadRawOnce(dout + int64_t(at[u]) * dim + c * 8);
        }
#pragma unroll
        for (int u = 0; u < K; ++u) at[u] = j + K + u < end[r] ? order[j + K + u] : 0;
#pragma unroll
        for (int u = 0; u < K; ++u) {
          if (j + u < end[r]) {
            float v[8];
            cuda_vec::Unpack(y[u], v);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k] += v[k];
          }
        }
      }
      cuda_vec::Pack8<float>::Store(dtable + (v0 + r) * dim + c * 8, acc);
    }
  }
}

// Zeros to row `row` of dim = 8 * packs columns: 16-byte streaming stores (written once, not read
// back by this kernel).
__device__ __forceinline__ void ZeroRow(float* __restrict__ dtable, int64_t row, int packs) {
  float4* out = reinterpret_cast<float4*>(dtable + row * int64_t(packs) * 8);
  for (int c = int(threadIdx.x); c < packs; c += kThreads) {
    __stcs(out + 2 * c, make_float4(0.f, 0.f, 0.f, 0.f));
    __stcs(out + 2 * c + 1, make_float4(0.f, 0.f, 0.f, 0.f));
  }
}

// Everything after the counts, one launch; each CTA takes a role by ticket, in this order:
//   tickets [0, tiles): scan tile `ticket` of the counts into offsets, then counts itself done;
//   [tiles, tiles + scatter_ctas): waits for every tile, then scatters kThreads token positions
//     into their runs (slot from an atomic increment of the run's cursor: counts stay intact);
//   the rest: row CTA g = ticket - tiles - scatter_ctas owns rows [32 g, 32 g + 32): pass 1
//     zeros its rows whose count is 0 at once (no wait: the counts are complete when the kernel
//     starts); pass 2, only if it has rows with tokens, waits for every scatter CTA, then per
//     group of kSumRows rows sorts the runs in place (SortRuns) and sums them (SumHitRuns).
// Most of dtable is zeros (16384 tokens over 32000 rows: ~60% of the rows unused), so pass 1
// streams most of the write traffic while the scan and the scatter finish.
// `order` and `offsets` are written by this kernel's CTAs: read through L2 or plain loads, never
// the non-coherent path. Two CTAs an SM (128 registers): the row sums' batched loads need them.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads, 2)
    OverlapKernel(const T* __restrict__ dout, const I* __restrict__ tokens, const int* __restrict__ counts,
                  int* cursors, unsigned long long* states, int* ctl, int* offsets, int* order, int* tmp,
                  float* __restrict__ dtable, int64_t n, int64_t vocab, int packs, int tiles, int scatter_ctas) {
  WaitForPrimary();
  __shared__ SortShared sh;
  __shared__ int role_shared, prefix_shared;
  if (threadIdx.x == 0) role_shared = atomicAdd(&ctl[kCtlTicket], 1);
  __syncthreads();
  int role = role_shared;
  if (role < tiles) {
    ScanTile(counts, states, role, offsets, sh.warp_sums, &prefix_shared);
    PublishDone(&ctl[kCtlScanned]);
    return;
  }
  role -= tiles;
  if (role < scatter_ctas) {
    AwaitDone(&ctl[kCtlScanned], tiles);
    const int64_t i = int64_t(role) * kThreads + threadIdx.x;
    const int key = KeyAt(tokens, i, n, vocab);
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int lane = int(threadIdx.x) & 31, leader = __ffs(same) - 1;
    int slot = 0;  // the leader's cursor before its increment: slots slot .. slot + popc - 1
    if (key >= 0 && lane == leader) slot = atomicAdd(&cursors[key], __popc(same));
    slot = __shfl_sync(0xffffffffu, slot, leader);
    if (key >= 0) order[__ldcg(offsets + key) + slot + __popc(same & ((1u << lane) - 1))] = int(i);
    PublishDone(&ctl[kCtlScattered]);
    return;
  }
  role -= scatter_ctas;
  const int64_t row0 = int64_t(role) * kOverlapRows;
  const int lane = int(threadIdx.x) & 31;
  const bool in = row0 + lane < vocab;
  // Every warp takes the same ballot: bit r set when row row0 + r exists (valid) / has tokens (hit).
  const unsigned valid = __ballot_sync(0xffffffffu, in);
  const unsigned hit = __ballot_sync(0xffffffffu, in && counts[row0 + lane] != 0);
  for (unsigned z = valid & ~hit; z != 0; z &= z - 1) ZeroRow(dtable, row0 + __ffs(z) - 1, packs);
  if (hit == 0) return;
  AwaitDone(&ctl[kCtlScattered], scatter_ctas);
#pragma unroll 1
  for (int g = 0; g < kOverlapRows; g += kSumRows) {
    if (((hit >> g) & ((1u << kSumRows) - 1)) == 0) continue;
    const int64_t v0 = row0 + g;
    int32_t begin[kSumRows], end[kSumRows];
    LoadRunsCoherent(offsets, v0, vocab, begin, end);
    SortRuns(order, tmp, begin, end, n, sh);
    SumHitRuns<T>(dout, order, begin, end, dtable, v0, packs);
  }
}

unsigned Blocks(int64_t work) { return unsigned((work + kThreads - 1) / kThreads); }

// Scratch, in ints: counts [padded] | tile states [2 * tiles] | ticket, zeroed together |
// offsets [padded] | order [n] | tmp [n]; padded = tiles * kScanTile >= vocab + 1.
template <typename T, typename I>
absl::Status BackwardAtomic(const Problem& p, const T* dout, const I* tokens, float* dtable, int* scratch,
                            int64_t tiles, cudaStream_t s, bool pdl) {
  const int64_t n = p.tokens, padded = tiles * kScanTile;
  const int64_t zero_ints = (padded + 2 * tiles + 1 + 3) / 4 * 4;
  int* counts = scratch;
  auto* states = reinterpret_cast<unsigned long long*>(scratch + padded);  // padded: whole tiles, 16 KB each
  int* ticket = scratch + padded + 2 * tiles;
  int* offsets = scratch + zero_ints;
  int* order = offsets + padded;
  int* tmp = order + n;
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ZeroKernel, dim3(cuda_vec::GridFor(Blocks(zero_ints / 4))), kThreads, s, pdl,
                                         reinterpret_cast<int4*>(scratch), zero_ints / 4));
  if (n > 0) {
    SG_CUDA_RETURN_IF_ERROR(
        LaunchMaybePdl(CountKernel<I>, dim3(Blocks(n)), kThreads, s, pdl, tokens, counts, n, p.vocab));
  }
  SG_CUDA_RETURN_IF_ERROR(
      LaunchMaybePdl(ScanKernel, dim3(unsigned(tiles)), kThreads, s, pdl, counts, states, ticket, offsets));
  if (n > 0) {
    SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ScatterKernel<I>, dim3(Blocks(n)), kThreads, s, pdl, tokens, counts,
                                           offsets, order, n, p.vocab));
  }
  const dim3 row_groups(unsigned((p.vocab + kSumRows - 1) / kSumRows));
  const bool vec = p.dim % 8 == 0 && cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  if (vec) {
    SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(SortSumRowsKernel<T>, row_groups, kThreads, s, pdl, dout, order, tmp,
                                           offsets, dtable, p.vocab, int(p.dim / 8), n));
    return absl::OkStatus();
  }
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(SortRunsKernel, row_groups, kThreads, s, pdl, order, tmp, offsets, p.vocab, n));
  // RowSumKernel does not wait on griddepcontrol: an ordinary launch. One column per thread: the
  // rows are not 16-byte aligned, or dim % 8 != 0.
  const unsigned grid = cuda_vec::GridFor(Blocks(p.vocab * p.dim));
  RowSumKernel<T><<<grid, kThreads, 0, s>>>(dout, order, offsets, dtable, p.vocab, p.dim);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status BackwardAtomicAlloc(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                 cudaStream_t s, bool pdl) {
  const int64_t tiles = (p.vocab + 1 + kScanTile - 1) / kScanTile;
  const int64_t padded = tiles * kScanTile;
  const int64_t ints = (padded + 2 * tiles + 1 + 3) / 4 * 4 + padded + 2 * p.tokens;
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(ints * int64_t(sizeof(int))));
  const T* d = static_cast<const T*>(dout);
  int* sc = static_cast<int*>(scratch);
  absl::Status st = p.tokens_i64
                        ? BackwardAtomic<T>(p, d, static_cast<const int64_t*>(tokens), dtable, sc, tiles, s, pdl)
                        : BackwardAtomic<T>(p, d, static_cast<const int32_t*>(tokens), dtable, sc, tiles, s, pdl);
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

// Scratch, in ints: counts [padded] | cursors [padded] | tile states [2 * tiles] | control words,
// zeroed together | offsets [padded] | order [n] | tmp [n]. Three launches, each a programmatic
// dependent of the one before: ZeroKernel, CountKernel, OverlapKernel.
template <typename T, typename I>
absl::Status BackwardOverlap(const Problem& p, const T* dout, const I* tokens, float* dtable, int* scratch,
                             int64_t tiles, cudaStream_t s) {
  const int64_t n = p.tokens, padded = tiles * kScanTile;
  const int64_t zero_ints = (2 * padded + 2 * tiles + kCtlWords + 3) / 4 * 4;
  int* counts = scratch;
  int* cursors = counts + padded;
  auto* states = reinterpret_cast<unsigned long long*>(cursors + padded);  // 8-byte aligned: whole tiles
  int* ctl = cursors + padded + 2 * tiles;
  int* offsets = scratch + zero_ints;
  int* order = offsets + padded;
  int* tmp = order + n;
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ZeroKernel, dim3(cuda_vec::GridFor(Blocks(zero_ints / 4))), kThreads, s, true,
                                         reinterpret_cast<int4*>(scratch), zero_ints / 4));
  if (n > 0) {
    SG_CUDA_RETURN_IF_ERROR(
        LaunchMaybePdl(CountKernel<I>, dim3(Blocks(n)), kThreads, s, true, tokens, counts, n, p.vocab));
  }
  const int64_t scatter_ctas = Blocks(n);
  const int64_t ctas = tiles + scatter_ctas + (p.vocab + kOverlapRows - 1) / kOverlapRows;
  SG_CHECK_ARG(ctas < (int64_t(1) << 31), "EmbeddingBackward (overlap): at most 2^31 - 1 CTAs, found ", ctas);
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(OverlapKernel<T, I>, dim3(unsigned(ctas)), kThreads, s, true, dout, tokens,
                                         counts, cursors, states, ctl, offsets, order, tmp, dtable, n, p.vocab,
                                         int(p.dim / 8), int(tiles), int(scatter_ctas)));
  return absl::OkStatus();
}

template <typename T>
absl::Status BackwardOverlapAlloc(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                  cudaStream_t s) {
  const int64_t tiles = (p.vocab + 1 + kScanTile - 1) / kScanTile;
  const int64_t padded = tiles * kScanTile;
  const int64_t ints = (2 * padded + 2 * tiles + kCtlWords + 3) / 4 * 4 + padded + 2 * p.tokens;
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(ints * int64_t(sizeof(int))));
  const T* d = static_cast<const T*>(dout);
  int* sc = static_cast<int*>(scratch);
  absl::Status st = p.tokens_i64
                        ? BackwardOverlap<T>(p, d, static_cast<const int64_t*>(tokens), dtable, sc, tiles, s)
                        : BackwardOverlap<T>(p, d, static_cast<const int32_t*>(tokens), dtable, sc, tiles, s);
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

}  // namespace

absl::Status BackwardAtomicCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                cudaStream_t s, bool pdl) {
  if (p.dtype == DType::kBF16) return BackwardAtomicAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s, pdl);
  if (p.dtype == DType::kF16) return BackwardAtomicAlloc<__half>(p, dout, tokens, dtable, device, s, pdl);
  return BackwardAtomicAlloc<float>(p, dout, tokens, dtable, device, s, pdl);
}

absl::Status BackwardOverlapCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                 cudaStream_t s) {
  const bool vec = p.dim % 8 == 0 && p.dim / 8 <= INT_MAX && cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  if (!vec) return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, true);
  if (p.dtype == DType::kBF16) return BackwardOverlapAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s);
  if (p.dtype == DType::kF16) return BackwardOverlapAlloc<__half>(p, dout, tokens, dtable, device, s);
  return BackwardOverlapAlloc<float>(p, dout, tokens, dtable, device, s);
}

}  // namespace sg::kernels::embedding_internal
