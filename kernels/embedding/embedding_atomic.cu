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

// offsets[0 .. tiles * kScanTile) = exclusive scan of counts (both padded to whole tiles).
__global__ void __launch_bounds__(kThreads)
    ScanKernel(const int* __restrict__ counts, unsigned long long* states, int* ticket, int* __restrict__ offsets) {
  WaitForPrimary();
  __shared__ int tile_shared, prefix_shared;
  __shared__ int warp_sums[kThreads / 32];
  if (threadIdx.x == 0) tile_shared = atomicAdd(ticket, 1);
  __syncthreads();
  const int64_t tile = tile_shared;
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
    if (threadIdx.x == 0) prefix_shared = prefix;
  }
  __syncthreads();
  const int add = prefix_shared + before;
#pragma unroll
  for (int q = 0; q < kScanPer / 4; ++q) {
    reinterpret_cast<int4*>(offsets + base)[q] =
        make_int4(add + c[4 * q], add + c[4 * q + 1], add + c[4 * q + 2], add + c[4 * q + 3]);
  }
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

}  // namespace

absl::Status BackwardAtomicCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                cudaStream_t s, bool pdl) {
  if (p.dtype == DType::kBF16) return BackwardAtomicAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s, pdl);
  if (p.dtype == DType::kF16) return BackwardAtomicAlloc<__half>(p, dout, tokens, dtable, device, s, pdl);
  return BackwardAtomicAlloc<float>(p, dout, tokens, dtable, device, s, pdl);
}

}  // namespace sg::kernels::embedding_internal
