// CUDA embedding. Forward: a grid-stride copy of 16-byte packs (row = token id, looked up per pack
// from L1). Backward, deterministic without float atomics, in two stages (BackwardConfig picks the
// kernels; SG_EMBEDDING_BWD=rows|packs|fused selects a path per call until the GPU run picks one):
//   1. preparation: order = token positions stably sorted by id (out-of-range ids -> vocab, sorted
//      past every real row), offsets[v] = first sorted position with id >= v.
//      rows / packs: KeysKernel, CUB's stable LSD radix sort of (key, position) pairs on the bits the
//        vocabulary needs, RowStartsKernel (row starts from key changes): ~6 kernel launches.
//      fused: PrepareOneCtaKernel, one launch: a single CTA sorts up to kFusedMaxTokens keys in
//        shared memory (LSD radix, 8-bit digits; each warp ranks its items in order with ballots and
//        a per-(digit, warp) count table, so the sort is stable) and writes order and offsets.
//        Longer inputs take the CUB preparation.
//   2. row sums, each vocabulary row's run of dout rows added in f32 in sorted (= token) order, 0 + x
//      first, written once (zeros for unused rows): every dtable element written exactly once.
//      "rows" (RowSumRowsKernel): a CTA takes kSumRows vocabulary rows at a time, its threads on
//        the row's packs of 8 columns (two 16-byte f32 stores per thread, each covering half of
//        every 32-byte sector of the warp's span). "packs" (RowSumKernel, the first version: 1.52
//        TB/s for the whole backward on H200 at 16384 tokens, vocab 32000, dim 2048): one thread
//        per (row, pack), grid-stride, a 64-bit division per pack. "fused" (FusedRowSumKernel): a
//        CTA of 512 threads takes rows_per_step (default 8) rows per step, a thread 4 columns of
//        a row (a warp's f32 store covers 512 contiguous bytes, its bf16 load 256; dim 2048 is one
//        quad per thread). The step's run bounds and first tokens come from two coalesced warp
//        loads (not 2 x rows dependent loads per thread); empty rows (most: 16k random tokens over
//        32k rows) are stored at once, single-token rows load 8 rows (4 for f32) at a time then
//        store, runs of 2+ follow one row at a time, the warp loading 32 of the run's indices at
//        once and each thread 8 dout rows (4 for f32) ahead of its in-order additions. Launched
//        with programmatic dependent launch, so it is resident and waiting (griddepcontrol.wait)
//        when the one-CTA preparation ends. A run's additions are one dependent chain per column,
//        so a very frequent id (a 5% token: ~820 rows) costs ~L / 8 memory latencies in one CTA
//        (BM_*HotBatch measure it). Option early_zeros ("fused-early"): the preparation first
//        publishes a used-row bitmap (~1-2 us in) and the waiting row-sum CTAs store the empty rows
//        then, overlapping the rest of the sort; the bitmap is only a hint (see the kernel).
// Bytes: dout read once, dtable written once, plus O(tokens + vocab) indices.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <type_traits>

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

int EndBit(int64_t vocab) {  // bits for keys in [0, vocab]
  int bits = 1;
  while ((int64_t(1) << bits) <= vocab) ++bits;
  return bits;
}

// ---- One-CTA preparation (fused path) ----
// kPrepThreads threads hold kPrepItems keys each, "warp-striped": warp w's item k in lane l is
// position w * 32 * kPrepItems + 32 k + l, so a warp's items in (k, lane) order are its positions in
// ascending order, which is what makes the per-warp ranking stable.
constexpr int kPrepThreads = 512;
constexpr int kPrepWarps = kPrepThreads / 32;
constexpr int kPrepItems = int(kFusedMaxTokens / kPrepThreads);
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
constexpr int kTableEntries = kDigits * kPrepWarps;
constexpr int kTablePerThread = kTableEntries / kPrepThreads;
static_assert(kPrepItems * kPrepThreads == kFusedMaxTokens, "the CTA holds exactly kFusedMaxTokens keys");
static_assert(kTablePerThread * kPrepThreads == kTableEntries, "the count table splits evenly over the threads");
static_assert(kFusedMaxTokens <= (1 << 16) && 32 * kPrepItems < (1 << 16), "positions and ranks share 32 bits");
// Sorted keys and positions (the scatter's exchange buffers) and the [digit][warp] count table.
constexpr int kPrepSmemBytes = int((2 * kFusedMaxTokens + kTableEntries) * sizeof(uint32_t));
constexpr int kShortGap = 32;  // longer runs of offsets without tokens are written by a whole warp
static_assert(kHintMaxWords <= kTableEntries, "the used-row bitmap is built in the count table");

// Replaces each (digit, warp) count by the number of items before it in (digit, warp) order.
__device__ __forceinline__ void ExclusiveScanTable(uint32_t* table, uint32_t* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t v[kTablePerThread], sum = 0;
#pragma unroll
  for (int q = 0; q < kTablePerThread; ++q) {
    v[q] = table[threadIdx.x * kTablePerThread + q];
    sum += v[q];
  }
  uint32_t incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  uint32_t run = incl - sum;
  for (int w = 0; w < warp; ++w) run += warp_sums[w];
#pragma unroll
  for (int q = 0; q < kTablePerThread; ++q) {
    table[threadIdx.x * kTablePerThread + q] = run;
    run += v[q];
  }
}

// Stage 1 for n <= kFusedMaxTokens in one CTA of kPrepThreads (dynamic shared memory
// kPrepSmemBytes). Positions >= n are padding with key vocab: they sort after every real token.
// kMatchAny: the lanes with the item's digit from one __match_any_sync instead of kDigitBits
// ballots (the GPU run picks; BackwardConfig::prep_match_any).
template <typename I, bool kMatchAny>
__global__ void __launch_bounds__(kPrepThreads)
    PrepareOneCtaKernel(const void* tokens, int32_t* __restrict__ order, int32_t* __restrict__ offsets, int n,
                        int vocab, int key_bits, uint32_t* __restrict__ hint) {
  // hint (if given): the used-row bitmap and its ready flag; the flag is cleared before the row
  // sums can start, so they wait for this call's bitmap (a stale one would only cost speed).
  if (hint != nullptr && threadIdx.x == 0) {
    *reinterpret_cast<volatile uint32_t*>(hint + HintWords(vocab)) = 0;
    __threadfence();
  }
  __syncthreads();
  // The row sums (launched with programmatic stream serialization) may be scheduled now; they wait
  // for this grid's completion and memory flush in griddepcontrol.wait before reading order and
  // offsets.
  asm volatile("griddepcontrol.launch_dependents;");
  extern __shared__ uint32_t prep_smem[];
  uint32_t* skeys = prep_smem;
  uint32_t* svals = skeys + kFusedMaxTokens;
  uint32_t* table = svals + kFusedMaxTokens;  // [digit][warp]
  __shared__ uint32_t warp_sums[kPrepWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = warp * 32 * kPrepItems + lane;  // item k's position: first + 32 k
  const uint32_t lanes_below = (1u << lane) - 1;
  // val: a position (< 2^16) in the low 16 bits, during a pass the item's rank among its warp's
  // items of its digit (< 32 * kPrepItems) in the high 16 (two arrays would spill).
  uint32_t key[kPrepItems], val[kPrepItems];
#pragma unroll
  for (int k = 0; k < kPrepItems; ++k) {
    const int i = first + 32 * k;
    val[k] = uint32_t(i);
    key[k] = uint32_t(vocab);
    if (i < n) {
      const int64_t id = IdAt<I>(tokens, i);
      if (id >= 0 && id < vocab) key[k] = uint32_t(id);
    }
  }
  if (hint != nullptr) {  // the used-row bitmap, built in the count table's space
    const int words = HintWords(vocab);
    for (int e = threadIdx.x; e < words; e += kPrepThreads) table[e] = 0;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPrepItems; ++k) {
      const uint32_t bit = 1u << (key[k] % 32);
      // Checked first: a repeated id costs one atomic per warp, not one per token.
      if (key[k] < uint32_t(vocab) && (table[key[k] / 32] & bit) == 0) atomicOr(&table[key[k] / 32], bit);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < words; e += kPrepThreads) hint[e] = table[e];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(hint + words), "r"(1u) : "memory");
    }
  }
  for (int shift = 0; shift < key_bits; shift += kDigitBits) {
    const uint32_t mask = (1u << min(kDigitBits, key_bits - shift)) - 1;
    for (int e = threadIdx.x; e < kTableEntries; e += kPrepThreads) table[e] = 0;
    __syncthreads();
    // Rank of each item among the warp's items of its digit: the earlier items (previous k) are
    // in the table entry, the earlier lanes of this k are the peers below it.
#pragma unroll
    for (int k = 0; k < kPrepItems; ++k) {
      const uint32_t d = (key[k] >> shift) & mask;
      uint32_t peers = 0xffffffffu;
      if constexpr (kMatchAny) {
        peers = __match_any_sync(0xffffffffu, d);
      } else {
#pragma unroll
        for (int b = 0; b < kDigitBits; ++b) {  // bits above the mask are 0 in every lane: no-ops
          const uint32_t bit = (d >> b) & 1u;
          const uint32_t same = __ballot_sync(0xffffffffu, bit);
          peers &= bit ? same : ~same;
        }
      }
      uint32_t* slot = table + d * kPrepWarps + warp;
      const uint32_t base = *slot;
      const uint32_t below = __popc(peers & lanes_below);
      val[k] |= (base + below) << 16;
      __syncwarp();
      if (below == 0) *slot = base + __popc(peers);
      __syncwarp();
    }
    __syncthreads();
    ExclusiveScanTable(table, warp_sums);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPrepItems; ++k) {
      const uint32_t d = (key[k] >> shift) & mask;
      const uint32_t pos = table[d * kPrepWarps + warp] + (val[k] >> 16);
      skeys[pos] = key[k];
      svals[pos] = val[k] & 0xffffu;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPrepItems; ++k) {
      key[k] = skeys[first + 32 * k];
      val[k] = svals[first + 32 * k];
    }
  }
  // Sorted: item k is sorted position first + 32 k, skeys holds every sorted key. offsets[v] for v
  // in (key at pos - 1, key at pos] is pos; a warp writes the long gaps (rare ids) together.
#pragma unroll 4
  for (int k = 0; k < kPrepItems; ++k) {
    const int pos = first + 32 * k;
    if (pos < n) order[pos] = int32_t(val[k]);
    const int lo = pos == 0 ? 0 : int(skeys[pos - 1]) + 1, hi = int(key[k]);
    const bool long_gap = hi - lo + 1 > kShortGap;
    if (!long_gap) {
      for (int v = lo; v <= hi; ++v) offsets[v] = pos;
    }
    uint32_t pending = __ballot_sync(0xffffffffu, long_gap);
    while (pending != 0) {
      const int src = __ffs(pending) - 1;
      pending &= pending - 1;
      const int glo = __shfl_sync(0xffffffffu, lo, src), ghi = __shfl_sync(0xffffffffu, hi, src);
      for (int v = glo + lane; v <= ghi; v += 32) offsets[v] = pos - lane + src;
    }
  }
  // Past the last sorted position (only non-empty when n == kFusedMaxTokens): (last key, vocab].
  if (warp == kPrepWarps - 1) {
    const int lo = int(__shfl_sync(0xffffffffu, key[kPrepItems - 1], 31)) + 1;
    for (int v = lo + lane; v <= vocab; v += 32) offsets[v] = int32_t(kFusedMaxTokens);
  }
}

// ---- Row sums (fused path) ----
// Four consecutive elements of T: loaded raw (8 bytes for 2-byte types, 16 for f32), widened to a
// float4 when added, so loads in flight cost half the registers for bf16 / f16.
template <typename T>
using RawQuad = std::conditional_t<sizeof(T) == 4, float4, uint2>;
template <typename T>
__device__ __forceinline__ RawQuad<T> LoadQuad(const T* p) {
  return *reinterpret_cast<const RawQuad<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void AddQuad(float4& a, const RawQuad<T>& r) {
  if constexpr (sizeof(T) == 4) {
    a.x += r.x;
    a.y += r.y;
    a.z += r.z;
    a.w += r.w;
  } else {
    const T* h = reinterpret_cast<const T*>(&r);
    a.x += cuda_vec::ToF(h[0]);
    a.y += cuda_vec::ToF(h[1]);
    a.z += cuda_vec::ToF(h[2]);
    a.w += cuda_vec::ToF(h[3]);
  }
}

template <bool kStreaming>
__device__ __forceinline__ void StoreQuad(float* p, const float4& v) {
  if constexpr (kStreaming) {
    __stcs(reinterpret_cast<float4*>(p), v);
  } else {
    *reinterpret_cast<float4*>(p) = v;
  }
}

constexpr int kFusedThreads = 512;  // a thread per column quad at dim 2048
// Single-token rows whose dout loads a thread keeps in flight (registers: 16 for bf16, 16 for f32).
template <typename T>
constexpr int HeadBatch() {
  return sizeof(T) == 4 ? 4 : 8;
}

// Rows of a run after its first, loaded this many ahead of their additions.
template <typename T>
constexpr int RunAhead() {
  return sizeof(T) == 4 ? 4 : 8;
}

// acc (holding 0 + the run's first row) += the run's rows (first, end) of column quad q (skipped
// where !valid), in order. The whole warp calls it (the run is CTA-uniform): its lanes load 32 of
// the run's dout row indices at once and broadcast them with shuffles.
template <typename T>
__device__ __forceinline__ void AddRun(float4& acc, const T* __restrict__ dout, const int32_t* __restrict__ order,
                                       int first, int end, int64_t dim, int q, bool valid) {
  constexpr int kAhead = RunAhead<T>();
  const int lane = threadIdx.x % 32;
  const T* col = dout + int64_t(q) * 4;
  for (int j0 = first + 1; j0 < end; j0 += 32) {
    const int mine = j0 + lane < end ? order[j0 + lane] : 0;
    const int count = min(32, end - j0);
    int u0 = 0;
    for (; u0 + kAhead <= count; u0 += kAhead) {
      RawQuad<T> x[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        const int64_t row = __shfl_sync(0xffffffffu, mine, u0 + u);
        if (valid) x[u] = LoadQuad(col + row * dim);
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        if (valid) AddQuad<T>(acc, x[u]);
      }
    }
    for (; u0 < count; ++u0) {
      const int64_t row = __shfl_sync(0xffffffffu, mine, u0);
      if (valid) AddQuad<T>(acc, LoadQuad(col + row * dim));
    }
  }
}

// A CTA per step of kR (<= 31) vocabulary rows v0 + r (grid-stride when the grid is smaller than
// the steps); thread t on column quads t, t + kFusedThreads, ... of every row of the step. Every
// warp's lane r holds row v0 + r's run start (lane kR: the step's end) and first dout row, from two
// coalesced loads, and the step's rows are split by ballot into empty (zero stores, issued first),
// single-token (loads HeadBatch() at a time, then stores) and longer runs (one row at a time). All
// of it is CTA-uniform, so every branch on it is too (AddRun's shuffles need whole warps).
//
// kEarly (one step per CTA; hint = the preparation's used-row bitmap and ready flag): before
// griddepcontrol.wait, the CTA waits for the flag and stores zeros to the rows the bitmap calls
// unused; after it, each thread skips the zero stores it already made and stores every other row
// (so rows the bitmap got wrong are rewritten by the same thread, in program order).
template <typename T, int kR, bool kStreaming, bool kEarly>
__global__ void __launch_bounds__(kFusedThreads, 2)
    FusedRowSumKernel(const T* __restrict__ dout, const int32_t* __restrict__ order,
                      const int32_t* __restrict__ offsets, float* __restrict__ dtable, int vocab, int quads,
                      int steps, const uint32_t* __restrict__ hint) {
  static_assert(kR >= 1 && kR <= 31, "a step's rows and their end fit one warp");
  const int lane = threadIdx.x % 32;
  const int64_t dim = int64_t(quads) * 4;
  uint32_t early = 0;  // kEarly: this warp's rows of the step already stored as zeros
  if constexpr (kEarly) {
    if (threadIdx.x == 0) {
      // At most ~4 ms: a flag no preparation will set (offsets prepared another way) only costs
      // that, the bitmap being a hint.
      const uint32_t* flag = hint + HintWords(vocab);
      for (int spin = 0; spin < 20000; ++spin) {
        uint32_t ready;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(ready) : "l"(flag) : "memory");
        if (ready != 0) break;
        __nanosleep(200);
      }
    }
    __syncthreads();
    const int v = int(blockIdx.x) * kR + lane;
    const bool unused = lane < kR && v < vocab && ((__ldcg(hint + v / 32) >> (v % 32)) & 1u) == 0;
    early = __ballot_sync(0xffffffffu, unused);
    for (int q = threadIdx.x; q < quads; q += kFusedThreads) {
      float* out = dtable + int64_t(blockIdx.x) * kR * dim + int64_t(q) * 4;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if ((early >> r) & 1u) StoreQuad<kStreaming>(out + r * dim, make_float4(0.f, 0.f, 0.f, 0.f));
      }
    }
  }
  // A no-op unless launched with programmatic stream serialization: then it waits here for the
  // preparation kernel to finish and its writes to be visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int g = blockIdx.x; g < steps; g += gridDim.x) {
    const int v0 = g * kR;
    const int start = lane <= kR ? offsets[min(v0 + lane, vocab)] : 0;
    const int count = __shfl_down_sync(0xffffffffu, start, 1) - start;  // lanes < kR: row v0 + lane
    const bool row = lane < kR && v0 + lane < vocab;
    const int head = row && count > 0 ? order[start] : 0;
    const uint32_t empty = __ballot_sync(0xffffffffu, row && count == 0) & ~early;
    const uint32_t single = __ballot_sync(0xffffffffu, row && count == 1);
    const uint32_t longer = __ballot_sync(0xffffffffu, row && count > 1);
    for (int q0 = threadIdx.x; q0 - int(threadIdx.x) < quads; q0 += kFusedThreads) {
      const int q = q0;
      const bool valid = q < quads;
      float* out = dtable + int64_t(v0) * dim + int64_t(q) * 4;
      const T* in = dout + int64_t(q) * 4;
      if (valid) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          if ((empty >> r) & 1u) StoreQuad<kStreaming>(out + r * dim, make_float4(0.f, 0.f, 0.f, 0.f));
        }
      }
      constexpr int kHeadBatch = HeadBatch<T>();
#pragma unroll
      for (int r0 = 0; r0 < kR; r0 += kHeadBatch) {
        RawQuad<T> x[kHeadBatch];
#pragma unroll
        for (int r = r0; r < min(r0 + kHeadBatch, kR); ++r) {
          const int h = __shfl_sync(0xffffffffu, head, r);
          if (valid && ((single >> r) & 1u)) x[r - r0] = LoadQuad(in + int64_t(h) * dim);
        }
#pragma unroll
        for (int r = r0; r < min(r0 + kHeadBatch, kR); ++r) {
          if (valid && ((single >> r) & 1u)) {
            // 0 + x, the CPU reference's first addition (it turns -0 into +0).
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            AddQuad<T>(acc, x[r - r0]);
            StoreQuad<kStreaming>(out + r * dim, acc);
          }
        }
      }
      // One row at a time (a loop, not unrolled: one copy of the run code).
      for (uint32_t m = longer; m != 0; m &= m - 1) {
        const int r = __ffs(m) - 1;
        const int begin = __shfl_sync(0xffffffffu, start, r), end = __shfl_sync(0xffffffffu, start, r + 1);
        const int h = __shfl_sync(0xffffffffu, head, r);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (valid) AddQuad<T>(acc, LoadQuad(in + int64_t(h) * dim));
        AddRun(acc, dout, order, begin, end, dim, q, valid);
        if (valid) StoreQuad<kStreaming>(out + r * dim, acc);
      }
    }
  }
}

// cudaFuncSetAttribute once per kernel and device: dynamic shared memory beyond 48 KiB.
template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, int bytes) {
  static std::mutex mu;
  static std::set<int> done;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(dev) != 0) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done.insert(dev);
  return err;
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

// ---- Backward launchers ----

// Stage 1 with CUB: scratch for the keys, sorted keys, positions and the sort from the allocator.
template <typename I>
absl::Status PrepareCub(const Problem& p, const void* tokens, int32_t* order, int32_t* offsets, int device,
                        cudaStream_t s) {
  const int64_t n = p.tokens;
  size_t sort_bytes = 0;
  if (n > 0) {
    SG_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<int32_t*>(nullptr),
                                                            static_cast<int32_t*>(nullptr),
                                                            static_cast<int32_t*>(nullptr),
                                                            static_cast<int32_t*>(nullptr), int(n), 0,
                                                            EndBit(p.vocab), s));
  }
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  // The sort's temporary storage starts at a 256-byte boundary after the key arrays.
  const int64_t key_bytes = (3 * n * int64_t(sizeof(int32_t)) + 255) / 256 * 256;
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(std::max<int64_t>(256, key_bytes + int64_t(sort_bytes))));
  int32_t* keys = static_cast<int32_t*>(scratch);
  int32_t* keys_sorted = keys + n;
  int32_t* values = keys_sorted + n;
  void* sort_temp = static_cast<char*>(scratch) + key_bytes;
  cudaError_t err = cudaSuccess;
  const char* failed = "KeysKernel";
  if (n > 0) {
    KeysKernel<I><<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(tokens, keys, values, n, p.vocab);
    err = cudaGetLastError();
    if (err == cudaSuccess) {
      err = cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys, keys_sorted, values, order, int(n), 0,
                                            EndBit(p.vocab), s);
      failed = "cub::DeviceRadixSort::SortPairs";
    }
  }
  if (err == cudaSuccess) {
    RowStartsKernel<<<unsigned((n + 1 + kThreads - 1) / kThreads), kThreads, 0, s>>>(keys_sorted, offsets, n,
                                                                                       p.vocab);
    err = cudaGetLastError();
    failed = "RowStartsKernel";
  }
  alloc->Free(scratch);  // reused only by later work on the same stream
  if (err != cudaSuccess) {
    return LibraryError(absl::StatusCode::kInternal, "CUDA", err, cudaGetErrorString(err), failed, __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

// Stage 1 in one launch (n <= kFusedMaxTokens).
template <typename I, bool kMatchAny>
absl::Status PrepareOneCta(const Problem& p, const void* tokens, int32_t* order, int32_t* offsets, uint32_t* hint,
                           cudaStream_t s) {
  auto kernel = PrepareOneCtaKernel<I, kMatchAny>;
  SG_CUDA_RETURN_IF_ERROR(AllowSharedMemory(kernel, kPrepSmemBytes));
  kernel<<<1, kPrepThreads, kPrepSmemBytes, s>>>(tokens, order, offsets, int(p.tokens), int(p.vocab), EndBit(p.vocab),
                                                 hint);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(PrepareOneCtaKernel);
  return absl::OkStatus();
}

// Early zeros' bitmap and flag: past offsets[vocab] (BackwardOffsetsInts).
uint32_t* HintOf(const Problem& p, const BackwardConfig& cfg, const int32_t* offsets) {
  return UsesEarlyZeros(p, cfg) ? reinterpret_cast<uint32_t*>(const_cast<int32_t*>(offsets) + p.vocab + 1) : nullptr;
}

template <typename I>
absl::Status PrepareOneCta(const Problem& p, const BackwardConfig& cfg, const void* tokens, int32_t* order,
                           int32_t* offsets, cudaStream_t s) {
  uint32_t* hint = HintOf(p, cfg, offsets);
  return cfg.prep_match_any ? PrepareOneCta<I, true>(p, tokens, order, offsets, hint, s)
                            : PrepareOneCta<I, false>(p, tokens, order, offsets, hint, s);
}

template <typename T, int kR, bool kStreaming, bool kEarly>
cudaError_t LaunchFusedRowSum(const Problem& p, const BackwardConfig& cfg, const T* dout, const int32_t* order,
                              const int32_t* offsets, float* dtable, cudaStream_t s) {
  const int64_t steps = (p.vocab + kR - 1) / kR;
  cudaLaunchConfig_t lc = {};
  // kEarly needs one step per CTA (UsesEarlyZeros: ctas_per_sm 0).
  lc.gridDim = dim3(cfg.ctas_per_sm > 0 && !kEarly ? cuda_vec::GridFor(steps, cfg.ctas_per_sm) : unsigned(steps));
  lc.blockDim = dim3(kFusedThreads);
  lc.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = cfg.pdl ? 1 : 0;
  const uint32_t* hint = HintOf(p, cfg, offsets);
  return cudaLaunchKernelEx(&lc, FusedRowSumKernel<T, kR, kStreaming, kEarly>, dout, order, offsets, dtable,
                            int(p.vocab), int(p.dim / 4), int(steps), hint);
}

template <typename T, int kR>
cudaError_t LaunchFusedRowSum(const Problem& p, const BackwardConfig& cfg, const T* dout, const int32_t* order,
                              const int32_t* offsets, float* dtable, cudaStream_t s) {
  if (UsesEarlyZeros(p, cfg)) {
    return cfg.streaming_stores ? LaunchFusedRowSum<T, kR, true, true>(p, cfg, dout, order, offsets, dtable, s)
                                : LaunchFusedRowSum<T, kR, false, true>(p, cfg, dout, order, offsets, dtable, s);
  }
  return cfg.streaming_stores ? LaunchFusedRowSum<T, kR, true, false>(p, cfg, dout, order, offsets, dtable, s)
                              : LaunchFusedRowSum<T, kR, false, false>(p, cfg, dout, order, offsets, dtable, s);
}

// Stage 2: the path's row-sum kernel where the layout allows it (16-byte aligned rows of 8 columns
// for rows, of 4 for fused), else the packs kernel (8 or 1 columns per thread).
template <typename T>
absl::Status RowSums(const Problem& p, const BackwardConfig& cfg, const T* dout, const int32_t* order,
                     const int32_t* offsets, float* dtable, cudaStream_t s) {
  const bool aligned = cuda_vec::Aligned16(dout) && cuda_vec::Aligned16(dtable);
  const bool vec8 = aligned && p.dim % 8 == 0;
  if (cfg.path == BackwardPath::kFused && aligned && p.dim % 4 == 0) {
    cudaError_t err;
    if (cfg.rows_per_step <= 4) {
      err = LaunchFusedRowSum<T, 4>(p, cfg, dout, order, offsets, dtable, s);
    } else if (cfg.rows_per_step <= 8) {
      err = LaunchFusedRowSum<T, 8>(p, cfg, dout, order, offsets, dtable, s);
    } else {
      err = LaunchFusedRowSum<T, 16>(p, cfg, dout, order, offsets, dtable, s);
    }
    SG_CUDA_RETURN_IF_ERROR(err /* FusedRowSumKernel */);
    return absl::OkStatus();
  }
  if (cfg.path == BackwardPath::kRows && vec8) {
    const unsigned blocks = unsigned((p.vocab + kSumRows - 1) / kSumRows);
    RowSumRowsKernel<T><<<blocks, kThreads, 0, s>>>(dout, order, offsets, dtable, p.vocab, int(p.dim / 8));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumRowsKernel);
    return absl::OkStatus();
  }
  const int64_t work = p.vocab * (vec8 ? p.dim / 8 : p.dim);
  const unsigned grid = cuda_vec::GridFor((work + kThreads - 1) / kThreads);
  if (vec8) {
    RowSumKernel<T, 8><<<grid, kThreads, 0, s>>>(dout, order, offsets, dtable, p.vocab, p.dim);
  } else {
    RowSumKernel<T, 1><<<grid, kThreads, 0, s>>>(dout, order, offsets, dtable, p.vocab, p.dim);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowSumKernel);
  return absl::OkStatus();
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

absl::Status BackwardPrepareCuda(const Problem& p, const BackwardConfig& cfg, const void* tokens, int32_t* order,
                                 int32_t* offsets, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cfg.path == BackwardPath::kFused && p.tokens <= kFusedMaxTokens) {
    return p.tokens_i64 ? PrepareOneCta<int64_t>(p, cfg, tokens, order, offsets, s)
                        : PrepareOneCta<int32_t>(p, cfg, tokens, order, offsets, s);
  }
  return p.tokens_i64 ? PrepareCub<int64_t>(p, tokens, order, offsets, device, s)
                      : PrepareCub<int32_t>(p, tokens, order, offsets, device, s);
}

absl::Status BackwardRowSumCuda(const Problem& p, const BackwardConfig& cfg, const void* dout, const int32_t* order,
                                const int32_t* offsets, float* dtable, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) {
    return RowSums(p, cfg, static_cast<const __nv_bfloat16*>(dout), order, offsets, dtable, s);
  }
  if (p.dtype == DType::kF16) return RowSums(p, cfg, static_cast<const __half*>(dout), order, offsets, dtable, s);
  return RowSums(p, cfg, static_cast<const float*>(dout), order, offsets, dtable, s);
}

// order and offsets from one allocation; CUB's own scratch (if that preparation runs) from another.
absl::Status BackwardCudaWith(const Problem& p, const BackwardConfig& cfg, const void* dout, const void* tokens,
                              float* dtable, int device, void* stream) {
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate((p.tokens + BackwardOffsetsInts(p)) * int64_t(sizeof(int32_t))));
  int32_t* order = static_cast<int32_t*>(scratch);
  int32_t* offsets = order + p.tokens;
  absl::Status st = BackwardPrepareCuda(p, cfg, tokens, order, offsets, device, stream);
  if (st.ok()) st.Update(BackwardRowSumCuda(p, cfg, dout, order, offsets, dtable, stream));
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

absl::Status BackwardCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                          void* stream) {
  return BackwardCudaWith(p, BackwardConfigFromEnv(), dout, tokens, dtable, device, stream);
}

}  // namespace sg::kernels::embedding_internal
