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
// On tables of 64 MiB or more, atomic2s's side stream first zeroes the table's first rows (the
// "early fill", at EarlyRows below, with its measurements).
// Capturable in a CUDA graph: no host synchronization, scratch from the caching allocator, static
// shared memory only (under 48 KB, no opt-in attribute).
//
// "atomic2s" (SG_EMBEDDING_BWD=atomic2s, 16-byte rows with dim % 8 == 0; otherwise "atomic"): the
// zero fill of the rows without tokens (60% of a 32000-row table at 16384 tokens) overlapped with
// the index preparation, which alone costs ~30 us of latency (the dim 8 shape), on two streams:
//   on the caller's stream S, every kernel at the device's greatest priority (a launch attribute,
//     so graph nodes carry it too) and chained by PDL: 1 as above (also zeroing num_touched), 2 as
//     CountTouchedKernel: the counts as above, and the leader whose atomic finds a count of 0
//     appends its id to a list of the touched rows (one atomic on num_touched per warp); a fork
//     event; 3 (ScanKernel<true> also writes cursor[v] = offsets[v + 1]), 4 (ScatterKernel<I, true>
//     decrements the cursor, so the counts stay read-only), 5 as SortSumTouchedKernel: a CTA per
//     kSumRows entries of the touched list (not kSumRows consecutive rows, of which ~2.4 have
//     tokens at 16384 / 32000: each CTA's chain of dependent loads, offsets -> order -> dout, moved
//     few bytes), sorting and summing as SortSumRowsKernel into each listed row. Kernels 1-3
//     trigger their dependents at their start (griddepcontrol.launch_dependents), so the next
//     one's CTAs are resident, waiting, when they end; the scatter does not, since the sums' CTAs
//     would hold every SM idle while it runs (measured below);
//   on a side stream H (one per device, cached) waiting on the fork, at the device's least
//     priority: ZeroUntouchedKernel, small independent CTAs (16 KB of rows each, 16-byte stores,
//     evict-first where tokens * 4 >= vocab) zeroing the rows whose count is 0: as they retire the
//     SMs go to S's pending CTAs first; a join event, which S waits on, so the scratch is freed
//     (reused in S's order) after the fill's reads of the counts.
// Until 2026-12-02 the scan, scatter and sums ran on H after the fork and the fill on S; the
// chain on S has no cross-stream wait on its path (see "2026-12-02 05:20-05:48" below).
// Measured (H200, 16384 tokens, vocab 32000, dim 2048, bf16) before the touched list, with
// consecutive rows per CTA: 3.04-3.08 TB/s against "atomic" 2.99 (a plain zero fill of the table
// 4.38). With the list (2026-11-30 17:40, the default since): 3.39-3.41 at vocab 32000 (atomic
// 3.00, under the 3.5 of issue #3), 4.11 at 128256 (scan3 3.37); 5% of the tokens on one id 1.56 /
// 3.19. Not adopted (17:47, branch emb2s3): the scatter also listing each row's run and first
// position, so this kernel loads them with the list in one round trip: no faster (3.39-3.40), and
// with a hot id 0.95 / 2.24 (every warp's leader of the hot row writing the same run, atomicMin on
// its first position). 2026-11-30 19:34-19:58 (same shape): the sums at 4 CTAs per SM (the
// default since) 3.43-3.44 against 3.36 at 3; not adopted: 8 listed rows per CTA (3.15), the scan
// and the scatter in one kernel with a grid-wide wait (no faster at 32000: 96.9-97.2 us against
// 97.1-97.6; it hung at vocab 128256, cause not found). 2026-11-30 23:28-23:44, not adopted:
// "singles", the count listing only rows reaching two tokens and recording first positions, the
// fill on S also copying the rows with one token (77% of the touched rows at 32000) so the side
// stream sums ~4x fewer: bitwise right, but slower in all three forms tried (3.25 / 2.80 TB/s at
// 32000 against 3.45; 3.46-3.65 at 128256 against 4.10): the single rows' dout reads slow the fill,
// which was the faster half; only the latency-bound dim-8 shape gained (23.4 against 27.9 us).
// 2026-12-01 04:26 (gpu_call46.sh), not adopted: the rows of one token copied in token order on the
// side stream right after the count (its own kernel, loads issued in phases), before the scan, with
// only rows of two tokens or more sorted and summed: 2.76 TB/s against 3.42-3.44 at 32000, 3.85
// against 4.10 at 128256, 1.37 against 1.52 with a hot id; the side stream's extra pass over the
// singles' dout rows lengthened the latency-bound half. Bitwise right; removed.
// 2026-12-01 04:48 (gpu_call49.sh), not adopted: a CTA of the touched rows' sums whose runs all
// hold at most 3 positions (98% at 32000) sorting them in registers, each thread loading the runs,
// instead of SortRuns' warp sort, barrier and reload: 3.28-3.30 TB/s against 3.44-3.46 with the
// general path inlined (40 bytes spilled at 64 registers), and with it out of line (no spill) 3.97
// against 4.09 at 128256 and 1.18 against 1.52 with a hot id. With v3's result, the sums' chain of
// dependent loads is not what holds them back. Bitwise right; removed.
// 2026-12-01 11:18-11:25 (gpu_call64.sh), not adopted: the untouched rows' fill row by row (one
// count read per row, no division per 16-byte store; the per-store form issues ~8 divisions per
// thread beside the sums), alternating processes: 3.362-3.408 TB/s against 3.428-3.430 at 32000,
// 4.011-4.039 against 4.085-4.097 at 128256, hot ids no better. The divisions were not what slowed
// the fill; its rows' count loads, one after another, may be. Removed.
// 2026-12-01 22:05-22:27 (gpu_call67.sh, gpu_call68.sh), not adopted, removed: "atomic2c",
// the touched rows' sums by a persistent grid (2-4 CTAs per SM, each a static share of the list, or
// chunks of 32 entries from a ticket), each chunk's runs resolved one entry a thread into shared
// memory (positions sorted there, tagged with their row at each run's end), then summed as one
// flat stream with 8 dout loads in flight per thread. Bitwise right (every embedding test), but
// 112.4-120.4 us against atomic2s's 95.2-96.0 at 32000 (2 CTAs per SM 130.2, 3 117.8), 292 against
// 273 at 128256, 383 against 211 with a hot id. Leaving one stream's last kernel out in the same
// runs: atomic2s's side stream alone 65.0 us (atomic2c's 84.2), the fill's stream alone 47.1 us;
// so atomic2s's sums alone move ~3.4 TB/s and are not the latency-bound chain that ncu's clocks
// suggested, and the two streams together move ~3.65 TB/s. Every kernel preferring the largest
// shared-memory carveout cost atomic2s 6% (100.8-101.1 us) and gave atomic2c nothing.
// 2026-12-01 22:34-22:40 (gpu_call69.sh, one H200, median of 3, alternating processes, vocab 32000):
// the zero fill's stores evict-first (st.global.cs) 94.1 / 94.0 us (3.504 TB/s; a later single run
// 94.6) against 96.1 / 95.8 plain (3.43-3.45); the touched sums' stores evict-first as well: no
// further change (94.0), alone none (96.1). At vocab 128256 (one run each) the evict-first fill was
// 1.7% slower (277.7 against 273.1 us), hot ids within 1% (212.6 / 211.2 at 32000). So the fill's
// stores are evict-first where the touched rows' traffic is a large share, tokens * 4 >= vocab (the
// 32000 shape at 16384 tokens: 0.51 of the rows touched; 128256: 0.13); SG_EMBEDDING_FILL_CS=0|1
// overrides for measurements. Not adopted: the fill by the bulk-copy engine (a thread per row, bulk
// stores of a zeroed shared buffer): 112.3-112.8 us.
// 2026-12-01 23:38 - 12-02 00:18 (gpu_call70-73.sh, one H200). Across processes of one binary the
// same call measured 94.3-98.7 us (0.1-0.5 us within a process: the placement of its buffers,
// presumably), so the comparisons since run in one process, by Google Benchmark's random
// interleaving. The evict-first fill against plain in three such processes: 94.3 / 97.5 / 94.3 us
// against 95.8 / 99.4 / 96.1 (kept). The fill's CTA size (kZeroVecs float4, 2048 until then): 1024
// 93.5 / 96.3 / 97.5 us against 2048's 94.5 / 97.5 / 97.9, 512 95.8, 4096 97.9 / 99.0, 8192 99.3 /
// 100.1; at vocab 128256 1024 274.6 against 276.3. So 1024 (16 KB a CTA) since. Not adopted,
// removed: "bucket", the count also keeping each row's first four positions (an int4 per row), and
// one kernel on the caller's stream (no scan, scatter or side stream) summing the listed rows, their
// positions sorted in registers, while zeroing its share of the untouched rows; a row of more than
// four tokens summed by its CTA scanning all ids in order. Predicted 86-92 us if the zero stores
// filled the time the sums' loads were in flight. Bitwise right (34 embedding tests), but 103.1 /
// 103.3 us against 94.6 / 94.4 at 32000, 288.4 against 273.1 at 128256, 27.6 against 30.6 at dim 8
// (71.6 against 31.2 at dim 8 of 128256); only the hot id gained (195.4 against 213.1). Without the
// side stream nothing runs beside the count, and the one kernel's traffic was no denser than the
// two streams'.
// 2026-12-02 00:50 (gpu_call74.sh, interleaved in two processes), not adopted, removed: the fill
// as a resident grid (1 or 2 CTAs per SM, each a contiguous share of rows, 256 counts at a time),
// predicted 88-93 us on the model that the sums' CTAs starve the fill's small CTAs: 105.4 / 109.3
// us at 1 CTA per SM, 102.5 / 105.4 at 2, against 93.1 / 96.4 for these small CTAs; the sums with
// one row's f32 sums live at a time (48 registers, 5 CTAs per SM) 94.3 / 97.3, and with the
// resident fill 105.3 / 109.4. Bitwise right; the model was wrong. Fresh buffers every repetition
// spread 94.96-96.68 us within one process (reused ones 0.1-0.5): placement is part of the spread
// between processes.
// 2026-12-02 02:58-03:24 (gpu_call76-79.sh), adopted: the early fill (EarlyRows below), 94.2-94.4 us
// (3.495-3.500 TB/s) against 96.4-96.9 without it, each pair in one process.
// 2026-12-02 05:20-05:48 (gpu_call81-83.sh, one H200). A timeline of the kernels (SG_EMB_TIMELINE,
// instrumented, ~107 us a call) put each of H's kernels ~3.8 us after the one before it ended
// (1.5-1.8 us at dim 8, with no fill beside them), and the scan 3.6 us after the count, across the
// fork. Measured in one process each (random interleaving, median of 3), us at 16384 tokens:
//   layout (triggering kernels)           32000 x 2048   128256 x 2048   32000 x 768   32000 x 8
//   chain on H, fill on S (none; before)  95.7 / 94.9    272.6 / 271.0   50.3          34.0
//   chain on H (scan)                     95.5           272.4                         30.9
//   chain on H (scan, scatter)            99.1           274.1                         31.6
//   chain on S, fill on H (none)          95.4 / 95.1    272.4                         29.8
//   chain on S (zero, count, scan): now   95.2 / 95.2    272.0 / 270.3   46.5          29.7
//   chain on S (all four)                 98.9           273.2                         29.6
// (and 128256 x 8: 29.3 against 31.4). So the new layout is even at dim 2048, where the fill keeps
// memory busy through the gaps, and 7-12% faster where latency dominates. Triggering the sums
// early costs 3.5%: their resident CTAs leave the fill no SM while the scatter runs. Not adopted:
// fewer sums CTAs per SM (dynamic shared memory so 3 or 2 fit, leaving registers for fill CTAs
// beside them): 98.6-98.8 us at 3, 106.4-107.5 at 2.
// 2026-12-02 18:19-18:40 (gpu_call86-88.sh, one H200 each, interleaved in one process), not adopted,
// removed: a larger early fill, 1-4 MB even with 16 KB (93.7 against 94.3 / 93.7 us), 8-24 MB
// slower (94.0-95.2); fill CTAs of 512 / 2048 float4 97.3 / 94.8 against 94.3; 8 listed rows per sums
// CTA at 4 CTAs per SM (heads held raw, 64 registers) 101.9; the sums' columns split so every store
// instruction writes whole 32-byte sectors (8-byte loads) 98.6-99.0 against 94.5-95.4, and 287 against
// 217 us with a hot id; the sums after the fill (S waits on the fill's join before them) 98.2-98.4
// against 93.5-93.9: the overlap itself gains.
// 2026-12-02 18:47-20:29 (gpu_call89-90.sh): replayed as a CUDA graph (how a compiled step runs it)
// the same kernels take 88.4-88.8 us (3.71-3.73 TB/s) with the node priorities kept, which the
// executor now does, and 90.0-90.2 without them; as stream calls 94.0-94.6 in the same processes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_cuda.cuh"
#include "kernels/embedding/embedding_timeline.h"

namespace sg::kernels::embedding_internal {

#ifdef SG_EMB_TIMELINE
// The diagnostic timeline (embedding_timeline.h). A CTA's thread 0 takes a ticket of its kernel;
// ticket / gridDim.x is the call (each kernel's grid is the same in every call of a benchmark).
constexpr int kTlKernels = EmbeddingTimeline::kKernels, kTlCalls = EmbeddingTimeline::kCalls;
__device__ unsigned long long g_tl_start[kTlKernels][kTlCalls], g_tl_waited[kTlKernels][kTlCalls],
    g_tl_end[kTlKernels][kTlCalls];
__device__ unsigned int g_tl_ticket[kTlKernels];
__device__ __forceinline__ unsigned long long TlNow() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
struct TlScope {
  int k = -1, call = -1;
  __device__ explicit TlScope(int kernel) {
    if (kernel < 0 || threadIdx.x != 0) return;
    const int c = int(atomicAdd(&g_tl_ticket[kernel], 1u) / gridDim.x);
    if (c >= kTlCalls) return;
    k = kernel;
    call = c;
    atomicMin(&g_tl_start[k][call], TlNow());
  }
  __device__ void Waited() const {
    if (call >= 0) atomicMin(&g_tl_waited[k][call], TlNow());
  }
  __device__ ~TlScope() {
    if (call >= 0) atomicMax(&g_tl_end[k][call], TlNow());
  }
};
#define SG_TL_SCOPE(kernel) const TlScope sg_tl_scope_(kernel)
#define SG_TL_WAITED() sg_tl_scope_.Waited()
#else
#define SG_TL_SCOPE(kernel) \
  do {                      \
  } while (0)
#define SG_TL_WAITED() \
  do {                 \
  } while (0)
#endif

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
  SG_TL_SCOPE(EmbeddingTimeline::kZero);
  TriggerDependents();
  WaitForPrimary();
  SG_TL_WAITED();
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

// CountKernel for "atomic2s", also listing the touched rows: the leader whose atomicAdd finds
// counts[key] == 0 is the first to count row key (exactly one per row), and appends key to
// `touched`, with one atomicAdd on *num_touched per warp for all its new rows. The list's order is
// arbitrary; each row's sum does not depend on it.
template <typename I>
__global__ void __launch_bounds__(kThreads)
    CountTouchedKernel(const I* __restrict__ tokens, int* counts, int* __restrict__ touched, int* num_touched,
                       int64_t n, int64_t vocab) {
  SG_TL_SCOPE(EmbeddingTimeline::kCount);
  TriggerDependents();
  WaitForPrimary();
  SG_TL_WAITED();
  const int key = KeyAt(tokens, int64_t(blockIdx.x) * kThreads + threadIdx.x, n, vocab);
  const unsigned same = __match_any_sync(0xffffffffu, key);
  const int lane = int(threadIdx.x) & 31, add = __popc(same);
  const bool fresh = key >= 0 && lane == __ffs(same) - 1 && atomicAdd(&counts[key], add) == 0;
  const unsigned fresh_lanes = __ballot_sync(0xffffffffu, fresh);
  if (fresh_lanes == 0) return;
  const int writer = __ffs(fresh_lanes) - 1;
  int base = 0;
  if (lane == writer) base = atomicAdd(num_touched, __popc(fresh_lanes));
  base = __shfl_sync(0xffffffffu, base, writer);
  if (fresh) touched[base + __popc(fresh_lanes & ((1u << lane) - 1))] = key;
}

// kCursor: `slots` is the scan's cursor (each run's end in `order`), decremented in place, so the
// counts stay read-only for a concurrent kernel ("atomic2s"); otherwise `slots` is the counts,
// relative to offsets[key]. Either way the run's positions are the same set.
template <typename I, bool kCursor>
__global__ void __launch_bounds__(kThreads)
    ScatterKernel(const I* __restrict__ tokens, int* slots, const int* __restrict__ offsets, int* order, int64_t n,
                  int64_t vocab) {
  SG_TL_SCOPE(kCursor ? EmbeddingTimeline::kScatter : -1);
  WaitForPrimary();
  SG_TL_WAITED();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int key = KeyAt(tokens, i, n, vocab);
  const unsigned same = __match_any_sync(0xffffffffu, key);
  const int lane = int(threadIdx.x) & 31, leader = __ffs(same) - 1;
  int last = 0;  // the leader's slots[key] before its decrement: slots last - popc .. last - 1
  if (key >= 0 && lane == leader) last = atomicSub(&slots[key], __popc(same));
  last = __shfl_sync(0xffffffffu, last, leader);
  if (key >= 0) {
    const int base = kCursor ? 0 : offsets[key];
    order[base + last - 1 - __popc(same & ((1u << lane) - 1))] = int(i);
  }
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

// offsets[0 .. tiles * kScanTile) = exclusive scan of counts (both padded to whole tiles); with
// kCursor also cursor[v] = offsets[v + 1], the inclusive scan (each run's end).
template <bool kCursor>
__global__ void __launch_bounds__(kThreads)
    ScanKernel(const int* __restrict__ counts, unsigned long long* states, int* ticket, int* __restrict__ offsets,
               int* __restrict__ cursor) {
  SG_TL_SCOPE(kCursor ? EmbeddingTimeline::kScan : -1);
  if (kCursor) TriggerDependents();
  WaitForPrimary();
  SG_TL_WAITED();
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
  if (kCursor) {
    // Count k's run ends where count k + 1's begins; the thread's last one at its total.
#pragma unroll
    for (int q = 0; q < kScanPer / 4; ++q) {
      const int e = q + 1 < kScanPer / 4 ? c[4 * q + 4] : sum;
      reinterpret_cast<int4*>(cursor + base)[q] =
          make_int4(add + c[4 * q + 1], add + c[4 * q + 2], add + c[4 * q + 3], add + e);
    }
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

// SortSumRowsKernel for "atomic2s" over CountTouchedKernel's list of touched rows: CTA b sorts and
// sums rows touched[kSumRows * b + r] (one int4 of the 16-byte aligned list), so each CTA has
// kSumRows rows with tokens but the last; the rows without tokens are ZeroUntouchedKernel's. The
// grid is the worst case (every token its own row); CTAs past *num_touched return at once
// (uniformly: no barrier reached). The list is read with its length, both written before the
// fork; entries past the length (unwritten scratch) are never used.
// Launch bounds: 4 CTAs per SM (64 registers, no spill) for bf16 and f16 dout; f32 dout only 2 (up
// to 128 registers): at 80 ptxas spilled 32 bytes here. 4 against 3 (80 registers), H200,
// 2026-11-30 19:58, 16384 tokens of 32000 x 2048 bf16, alternating: 3.43-3.44 TB/s (95.8-96.2 us)
// against 3.36 (98.0 us); with a hot id 1.56 against 1.53. (At 4 CTAs with the one-load loop the
// hot case had lost 25%: SumRunsThen's long runs now keep four loads in flight.) 5 CTAs per SM (48
// registers, ~200 bytes spilled) lost: 3.21 TB/s against 3.45-3.47 (2026-11-30 23:16).
template <typename T>
constexpr int kTouchedMinBlocks = sizeof(T) == 4 ? 2 : 4;
template <typename T>
__global__ void __launch_bounds__(kThreads, kTouchedMinBlocks<T>)
    SortSumTouchedKernel(const T* __restrict__ dout, int* order, int* tmp, const int* __restrict__ offsets,
                         const int4* __restrict__ touched, const int* __restrict__ num_touched,
                         float* __restrict__ dtable, int packs, int64_t n) {
  static_assert(kSumRows == 4, "a CTA's rows are one int4 of the touched list");
  SG_TL_SCOPE(EmbeddingTimeline::kSums);
  WaitForPrimary();
  SG_TL_WAITED();
  __shared__ SortShared sh;
  const int4 listed = touched[blockIdx.x];
  const int here = *num_touched - int(blockIdx.x) * kSumRows;
  if (here <= 0) return;
  const int32_t ids[kSumRows] = {listed.x, listed.y, listed.z, listed.w};
  int32_t rows[kSumRows], begin[kSumRows], end[kSumRows];
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) {
    rows[r] = r < here ? ids[r] : -1;
    begin[r] = r < here ? offsets[rows[r]] : 0;
    end[r] = r < here ? offsets[rows[r] + 1] : 0;
  }
  SortRuns(order, tmp, begin, end, n, sh);
  SumRuns<T>(dout, order, begin, end, dtable, rows, packs);
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

// The zero fill of "atomic2s": rows v0 .. v0 + rows - 1 of the f32 table (`vecs` float4 each)
// whose count is 0, i.e. the rows the chain's SortSumTouchedKernel leaves unwritten.
// Small independent CTAs (about kZeroVecs stores each), not a persistent grid: as they retire, the
// SMs go to the chain's higher-priority CTAs first. `evict_first`: st.global.cs stores, so the
// zeros do not hold L2 lines the chain's reads and sums could use (see the file comment).
constexpr int kZeroVecs = 1024;                     // 16 KB per CTA, 4 16-byte stores per thread
constexpr int64_t kMaxZeroVecs = int64_t(1) << 30;  // float4 per row: rows * vecs + kThreads fits 32 bits
__global__ void __launch_bounds__(kThreads) ZeroUntouchedKernel(const int* __restrict__ counts,
                                                                float4* __restrict__ dtable, int64_t first,
                                                                int64_t end, uint32_t vecs, uint32_t rows,
                                                                bool evict_first) {
  SG_TL_SCOPE(counts == nullptr ? EmbeddingTimeline::kEarlyFill : EmbeddingTimeline::kFill);
  const int64_t v0 = first + int64_t(blockIdx.x) * rows;
  const uint32_t here = uint32_t(min(int64_t(rows), end - v0)) * vecs;
  for (uint32_t i = threadIdx.x; i < here; i += kThreads) {
    const uint32_t r = i / vecs;
    if (counts != nullptr && counts[v0 + r] != 0) continue;
    float4* q = dtable + (v0 + r) * vecs + (i - r * vecs);
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    if (evict_first) {
      __stcs(q, zero);
    } else {
      *q = zero;
    }
  }
}

// Whether the zero fill stores evict-first: where tokens * 4 >= vocab (the file comment's
// measurements), unless SG_EMBEDDING_FILL_CS is "0" or "1".
bool FillEvictFirst(const Problem& p) {
  const char* v = std::getenv("SG_EMBEDDING_FILL_CS");
  if (v != nullptr && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0)) return v[0] == '1';
  return p.tokens * 4 >= p.vocab;
}

unsigned Blocks(int64_t work) { return unsigned((work + kThreads - 1) / kThreads); }

// Scratch, in ints: counts [padded] | tile states [2 * tiles] | ticket | num_touched ("atomic2s"
// only), zeroed together | offsets [padded] | then, "atomic2s" only: cursor [padded] | touched
// [listed] | and always: order [n] | tmp [n]; padded = tiles * kScanTile >= vocab + 1, listed =
// min(n, vocab) rounded up to a multiple of 4 (SortSumTouchedKernel reads one int4 per CTA).
// Every array but tmp starts 16-byte aligned.
struct AtomicScratch {
  int64_t tiles = 0, padded = 0, zero_ints = 0, listed = 0, ints = 0;
  int* counts = nullptr;
  unsigned long long* states = nullptr;
  int* ticket = nullptr;
  int* num_touched = nullptr;
  int* offsets = nullptr;
  int* cursor = nullptr;
  int* touched = nullptr;
  int* order = nullptr;
  int* tmp = nullptr;
};

AtomicScratch ScratchLayout(int64_t vocab, int64_t n, bool atomic2s) {
  AtomicScratch sc;
  sc.tiles = (vocab + 1 + kScanTile - 1) / kScanTile;
  sc.padded = sc.tiles * kScanTile;
  sc.zero_ints = (sc.padded + 2 * sc.tiles + (atomic2s ? 2 : 1) + 3) / 4 * 4;
  sc.listed = atomic2s ? (std::min(n, vocab) + 3) / 4 * 4 : 0;
  sc.ints = sc.zero_ints + (atomic2s ? 2 : 1) * sc.padded + sc.listed + 2 * n;
  return sc;
}

void CarveScratch(int* scratch, int64_t n, bool atomic2s, AtomicScratch& sc) {
  sc.counts = scratch;
  sc.states = reinterpret_cast<unsigned long long*>(scratch + sc.padded);  // padded: whole tiles, 16 KB each
  sc.ticket = scratch + sc.padded + 2 * sc.tiles;
  sc.num_touched = atomic2s ? sc.ticket + 1 : nullptr;
  sc.offsets = scratch + sc.zero_ints;
  sc.cursor = atomic2s ? sc.offsets + sc.padded : nullptr;
  sc.touched = atomic2s ? sc.cursor + sc.padded : nullptr;
  sc.order = sc.offsets + (atomic2s ? 2 : 1) * sc.padded + sc.listed;
  sc.tmp = sc.order + n;
}

// Steps 1 and 2 of "atomic" (ZeroKernel, CountKernel) on `s`.
template <typename I>
absl::Status ZeroAndCount(const Problem& p, const I* tokens, const AtomicScratch& sc, cudaStream_t s, bool pdl) {
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ZeroKernel, dim3(cuda_vec::GridFor(Blocks(sc.zero_ints / 4))), kThreads, s,
                                         pdl, reinterpret_cast<int4*>(sc.counts), sc.zero_ints / 4));
  if (p.tokens > 0) {
    SG_CUDA_RETURN_IF_ERROR(
        LaunchMaybePdl(CountKernel<I>, dim3(Blocks(p.tokens)), kThreads, s, pdl, tokens, sc.counts, p.tokens, p.vocab));
  }
  return absl::OkStatus();
}

template <typename T, typename I>
absl::Status BackwardAtomic(const Problem& p, const T* dout, const I* tokens, float* dtable, const AtomicScratch& sc,
                            cudaStream_t s, bool pdl) {
  const int64_t n = p.tokens;
  SG_RETURN_IF_ERROR(ZeroAndCount(p, tokens, sc, s, pdl));
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ScanKernel<false>, dim3(unsigned(sc.tiles)), kThreads, s, pdl, sc.counts,
                                         sc.states, sc.ticket, sc.offsets, static_cast<int*>(nullptr)));
  if (n > 0) {
    SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(ScatterKernel<I, false>, dim3(Blocks(n)), kThreads, s, pdl, tokens,
                                           sc.counts, sc.offsets, sc.order, n, p.vocab));
  }
  const dim3 row_groups(unsigned((p.vocab + kSumRows - 1) / kSumRows));
  const bool vec = p.dim % 8 == 0 && cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  if (vec) {
    SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdl(SortSumRowsKernel<T>, row_groups, kThreads, s, pdl, dout, sc.order,
                                           sc.tmp, sc.offsets, dtable, p.vocab, int(p.dim / 8), n));
    return absl::OkStatus();
  }
  SG_CUDA_RETURN_IF_ERROR(
      LaunchMaybePdl(SortRunsKernel, row_groups, kThreads, s, pdl, sc.order, sc.tmp, sc.offsets, p.vocab, n));
  // RowSumKernel does not wait on griddepcontrol: an ordinary launch. One column per thread: the
  // rows are not 16-byte aligned, or dim % 8 != 0.
  const unsigned grid = cuda_vec::GridFor(Blocks(p.vocab * p.dim));
  RowSumKernel<T><<<grid, kThreads, 0, s>>>(dout, sc.order, sc.offsets, dtable, p.vocab, p.dim);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumKernel);
  return absl::OkStatus();
}

// The side stream of "atomic2s" on one device (created at the device's greatest priority, though
// every kernel on it carries the least as a launch attribute), its events and the priorities;
// created at the first call on the device and never destroyed (they live as long as the process).
// `mu` is held from the fork's record to the join's wait, so two host threads' records of the
// shared events never interleave.
struct SideStream {
  absl::Mutex mu;
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEvent_t early = nullptr;  // the early fill's end, which the sums wait on
  int greatest = 0;  // the device's greatest priority: the chain's on the caller's stream
  int least = 0;     // the device's least priority: the fills' on the side stream
};

// Creates `side`'s stream and events on `device`; the caller's current device is restored.
absl::Status CreateSideStream(int device, SideStream& side) {
  int current = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  const absl::Status st = [&]() -> absl::Status {
    SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    int least = 0, greatest = 0;  // greatest: numerically the smallest
    SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr, early = nullptr;
    SG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&early, cudaEventDisableTiming));
    side.stream = stream;
    side.fork = fork;
    side.join = join;
    side.early = early;
    side.greatest = greatest;
    side.least = least;
    return absl::OkStatus();
  }();
  SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(current));
  return st;
}

// Device ordinal -> its side stream (function-local: initialized once, thread-safely).
constexpr int kMaxDevices = 64;
SideStream* SideStreams() {
  static SideStream sides[kMaxDevices];
  return sides;
}

// kernel<<<grid, kThreads, 0, stream>>>(args...) at `priority` (a launch attribute, so a captured
// graph node carries it too), as a programmatic dependent when `pdl`.
template <typename... KArgs, typename... Args>
cudaError_t LaunchAt(void (*kernel)(KArgs...), dim3 grid, cudaStream_t stream, int priority, bool pdl,
                     Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(kThreads));
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributePriority;
  attr[0].val.priority = priority;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KArgs>(args)...);
}

// ZeroUntouchedKernel over rows first .. end - 1 of the table on `s`: about kZeroVecs float4 per
// CTA, whole rows; every row of the range when counts is null.
absl::Status ZeroUntouched(const Problem& p, const int* counts, float* dtable, int64_t first, int64_t end,
                           cudaStream_t s, const int* priority = nullptr) {
  if (end <= first) return absl::OkStatus();
  const uint32_t vecs = uint32_t(p.dim / 4);
  const uint32_t rows = uint32_t(std::max<int64_t>(1, kZeroVecs / int64_t(vecs)));
  const unsigned blocks = unsigned((end - first + rows - 1) / rows);
  if (priority == nullptr) {
    ZeroUntouchedKernel<<<blocks, kThreads, 0, s>>>(counts, reinterpret_cast<float4*>(dtable), first, end, vecs,
                                                     rows, FillEvictFirst(p));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(ZeroUntouchedKernel);
    return absl::OkStatus();
  }
  SG_CUDA_RETURN_IF_ERROR(LaunchAt(ZeroUntouchedKernel, dim3(blocks), s, *priority, false, counts,
                                   reinterpret_cast<float4*>(dtable), first, end, vecs, rows, FillEvictFirst(p)));
  return absl::OkStatus();
}

// The early fill: the side stream starts each call by zeroing the table's first rows (one fill
// CTA's worth, kZeroVecs float4) unconditionally, at the device's least priority, before the counts
// exist; the fill after the count starts past them (a touched one among them is zeroed, then
// written by the sums, which wait on an event after it). Its bytes do not matter: measured
// 2026-12-02 (gpu_call76-78.sh, one H200, interleaved in one process each), at 16384 of 32000 x 2048
// the same ~2.5 us gain from 8 KB to 4 MB early (93.8-94.8 us against 96.2-97.9 without, and 16 KB,
// the adopted size, 94.2-94.4 against 96.4-96.9; 16 to 32 MB 95.2-96.1), and an event wait at the
// entry without the kernel gains nothing (96.8-96.9). Why
// a side stream that starts with a kernel at the entry takes the scan sooner was not established.
// It pays where the table is large: 128256 x 2048 271.2 against 275.5 us, a hot id 219.5 against
// 220.9; but at dim 8 (1-4 MB tables, latency-bound) it lost: 32.5 against 30.2 us at vocab 32000,
// 32.7 against 32.4 at 128256. So it runs for tables of kEarlyFillMinBytes or more, unless
// SG_EMBEDDING_EARLY_FILL is "0" or "1".
constexpr int64_t kEarlyFillMinBytes = int64_t(64) << 20;
int64_t EarlyRows(const Problem& p) {
  const char* v = std::getenv("SG_EMBEDDING_EARLY_FILL");
  const bool on = v != nullptr && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0)
                      ? v[0] == '1'
                      : p.vocab * p.dim * int64_t(sizeof(float)) >= kEarlyFillMinBytes;
  return on ? std::min(p.vocab, std::max<int64_t>(1, kZeroVecs / (p.dim / 4))) : 0;
}

// "atomic2s" (16-byte rows, dim % 8 == 0): the early fill on the side stream where the table is
// large; on `s` the chain (zero, count, scan, scatter, sums) at the greatest priority, with a fork
// after the count to the side stream's fill of the untouched rows; `s` then waits on the join.
// Once the side stream has waited on `s` (the early fill's fork, or the count's), the join is
// recorded and waited even after a failed launch, so a capture never ends with the side stream
// unjoined.
template <typename T, typename I>
absl::Status BackwardAtomic2s(const Problem& p, const T* dout, const I* tokens, float* dtable, const AtomicScratch& sc,
                              cudaStream_t s, SideStream& side) {
  const int64_t early = EarlyRows(p), n = p.tokens;
  const int hi = side.greatest;
  bool forked = false;
  absl::Status st = [&]() -> absl::Status {
    if (early > 0) {  // ordered after `s`'s earlier work, as the rest of the side stream's
      SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.fork, s));
      SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.stream, side.fork, 0));
      forked = true;
      SG_RETURN_IF_ERROR(ZeroUntouched(p, nullptr, dtable, 0, early, side.stream, &side.least));
      SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.early, side.stream));
    }
    SG_CUDA_RETURN_IF_ERROR(LaunchAt(ZeroKernel, dim3(cuda_vec::GridFor(Blocks(sc.zero_ints / 4))), s, hi, true,
                                     reinterpret_cast<int4*>(sc.counts), sc.zero_ints / 4));
    if (n == 0) return ZeroUntouched(p, sc.counts, dtable, early, p.vocab, s);  // every row untouched
    SG_CUDA_RETURN_IF_ERROR(LaunchAt(CountTouchedKernel<I>, dim3(Blocks(n)), s, hi, true, tokens, sc.counts,
                                     sc.touched, sc.num_touched, n, p.vocab));
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.fork, s));
    SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.stream, side.fork, 0));
    forked = true;
    SG_CUDA_RETURN_IF_ERROR(LaunchAt(ScanKernel<true>, dim3(unsigned(sc.tiles)), s, hi, true, sc.counts, sc.states,
                                     sc.ticket, sc.offsets, sc.cursor));
    SG_CUDA_RETURN_IF_ERROR(LaunchAt(ScatterKernel<I, true>, dim3(Blocks(n)), s, hi, true, tokens, sc.cursor,
                                     sc.offsets, sc.order, n, p.vocab));
    // A touched row among the early fill's is zeroed there first (long done by now).
    if (early > 0) SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, side.early, 0));
    const dim3 list_groups(unsigned((sc.listed + kSumRows - 1) / kSumRows));
    SG_CUDA_RETURN_IF_ERROR(LaunchAt(SortSumTouchedKernel<T>, list_groups, s, hi, true, dout, sc.order, sc.tmp,
                                     sc.offsets, reinterpret_cast<const int4*>(sc.touched), sc.num_touched, dtable,
                                     int(p.dim / 8), n));
    return ZeroUntouched(p, sc.counts, dtable, early, p.vocab, side.stream, &side.least);
  }();
  if (!forked) return st;
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.join, side.stream));
  SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, side.join, 0));
  return st;
}

// "atomic2s" when `side` is given (holding its mutex), else "atomic" (with PDL when `pdl`).
template <typename T, typename I>
absl::Status BackwardAtomicOn(const Problem& p, const void* dout, const I* tokens, float* dtable,
                              const AtomicScratch& sc, cudaStream_t s, bool pdl, SideStream* side) {
  const T* d = static_cast<const T*>(dout);
  if (side == nullptr) return BackwardAtomic<T>(p, d, tokens, dtable, sc, s, pdl);
  absl::MutexLock lock(&side->mu);
  return BackwardAtomic2s<T>(p, d, tokens, dtable, sc, s, *side);
}

template <typename T>
absl::Status BackwardAtomicAlloc(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                 cudaStream_t s, bool pdl, SideStream* side) {
  AtomicScratch sc = ScratchLayout(p.vocab, p.tokens, side != nullptr);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(sc.ints * int64_t(sizeof(int))));
  CarveScratch(static_cast<int*>(scratch), p.tokens, side != nullptr, sc);
  const auto* ids32 = static_cast<const int32_t*>(tokens);
  const auto* ids64 = static_cast<const int64_t*>(tokens);
  const absl::Status st = p.tokens_i64 ? BackwardAtomicOn<T>(p, dout, ids64, dtable, sc, s, pdl, side)
                                       : BackwardAtomicOn<T>(p, dout, ids32, dtable, sc, s, pdl, side);
  // Reused only by later work on `s`, which the side stream's work (joined) precedes.
  alloc->Free(scratch);
  return st;
}

}  // namespace

absl::Status BackwardAtomicCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                cudaStream_t s, bool pdl) {
  if (p.dtype == DType::kBF16) {
    return BackwardAtomicAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s, pdl, nullptr);
  }
  if (p.dtype == DType::kF16) return BackwardAtomicAlloc<__half>(p, dout, tokens, dtable, device, s, pdl, nullptr);
  return BackwardAtomicAlloc<float>(p, dout, tokens, dtable, device, s, pdl, nullptr);
}

absl::Status BackwardAtomic2sCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                                  cudaStream_t s) {
  // Rows without the 16-byte layout (or too wide for 32-bit row math): the one-stream path.
  const bool vec = p.dim % 8 == 0 && p.dim / 4 <= kMaxZeroVecs && cuda_vec::Aligned16(dout) &&
                   cuda_vec::Aligned16(dtable);
  if (!vec) return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, true);
  SG_CHECK_ARG(device >= 0 && device < kMaxDevices, "EmbeddingBackward (atomic2s): device ordinal in [0, ",
               kMaxDevices, "), found ", device);
  SideStream& side = SideStreams()[device];
  {
    absl::MutexLock lock(&side.mu);
    if (side.stream == nullptr) {
      // The first call on the device creates the side stream and its events; inside a capture it
      // takes the one-stream path instead (bitwise the same result), so no stream or event is made
      // while capturing.
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      SG_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(s, &capture));
      if (capture != cudaStreamCaptureStatusNone) return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, true);
      SG_RETURN_IF_ERROR(CreateSideStream(device, side));
    }
  }
  if (p.dtype == DType::kBF16) {
    return BackwardAtomicAlloc<__nv_bfloat16>(p, dout, tokens, dtable, device, s, true, &side);
  }
  if (p.dtype == DType::kF16) return BackwardAtomicAlloc<__half>(p, dout, tokens, dtable, device, s, true, &side);
  return BackwardAtomicAlloc<float>(p, dout, tokens, dtable, device, s, true, &side);
}

}  // namespace sg::kernels::embedding_internal

#ifdef SG_EMB_TIMELINE
namespace sg::kernels {

absl::Status EmbeddingTimelineReset() {
  using namespace embedding_internal;
  static unsigned long long unset[kTlKernels][kTlCalls], zeros[kTlKernels][kTlCalls];
  static unsigned int tickets[kTlKernels];
  for (auto& row : unset) std::fill(std::begin(row), std::end(row), ~0ull);
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_tl_start, unset, sizeof(unset)));
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_tl_waited, unset, sizeof(unset)));
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_tl_end, zeros, sizeof(zeros)));
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_tl_ticket, tickets, sizeof(tickets)));
  return absl::OkStatus();
}

absl::StatusOr<EmbeddingTimeline> EmbeddingTimelineRead() {
  using namespace embedding_internal;
  EmbeddingTimeline t;
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(t.start, g_tl_start, sizeof(t.start)));
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(t.waited, g_tl_waited, sizeof(t.waited)));
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(t.end, g_tl_end, sizeof(t.end)));
  return t;
}

}  // namespace sg::kernels
#endif
