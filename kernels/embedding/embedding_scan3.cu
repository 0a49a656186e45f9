// The embedding backward as one kernel with bulk copies (SG_EMBEDDING_BWD=scan3, the default above
// a vocabulary of 65536): an id listing (embedding_scan_list.cuh), then the row sums fed by the
// Hopper bulk-copy engine instead of per-thread loads. CTA c owns dtable rows [c * 64, c * 64 + 64);
// warp 0 lists with the others, then lane 0 of it becomes the producer, warps 1..8 the consumers:
//   1. every thread reads all ids and lists the (token, row) pairs of the CTA's rows, in token
//      order; warp 0 orders them by row (stable);
//   2. the producer walks the rows in order, and each row's segments (kSegCols columns) and tokens
//      in order, pulling each dout segment into the next slot of a shared-memory ring with one
//      cp.async.bulk (16-byte multiples, complete_tx on the slot's "full" mbarrier); up to `slots`
//      segments (64 KB) in flight per CTA, whatever the consumers are doing; runs longer than the
//      ring are prefetched into L2 (cp.async.bulk.prefetch) kPrefetchRounds rounds ahead;
//   3. the consumers walk the same sequence: every consumer thread owns one pack of 8 columns of
//      each segment, waits for the slot, adds the pack in f32 in token order from 0 (0 + dout[t0]
//      + dout[t1] + ...: the CPU reference's additions in its order, hence bitwise its result), and
//      each consumer warp releases the slot through its "empty" mbarrier (count: 8 warps);
//   4. finished rows are written from registers (16-byte stores); rows without tokens by bulk
//      stores from a zeroed shared buffer.
// Why: the one-kernel "scan2" it replaced (per-thread dout loads, 512 threads a CTA) kept only what
// registers hold in flight; a gathered dout row waits ~1-2 us under the write stream, stalling its
// warp's stores. Here the ring decouples the reads from the writes. A hot id needs no special path:
// its run streams through the ring. On the H200 (2026-11-30, Batch, decimal TB/s at vocab 128256 /
// 32000) scan3 3.38 / 2.81, hot 3.32 / ~1.0, against scan2 2.91 / 2.76, hot 2.70 / 1.48. Deleted
// with scan2 as no clear win: zero rows by streaming stores (- / 2.87), rows with tokens bulk-stored
// too (3.39 / 2.72, hot 3.34), 128 rows a CTA (3.47 / 2.94, but hot 3.06).
// Passes: when one CTA's ids overflow the list, it is summed early, rows written as partial sums
// (register stores), which the next pass loads back and continues; the ring's
// sequence numbers run on across passes. Out-of-range ids match no CTA: their gradients drop.
// Every mbarrier wait traps after ~2^35 SM clocks (~20 s) rather than hang (sm90::MbarWait).
// One launch, a programmatic dependent of the previous kernel, no scratch: capturable in a CUDA
// graph. Rows without the 16-byte layout (dim % 8, unaligned pointers) go to the atomic path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "kernels/core/sm90.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/embedding/embedding_cuda.cuh"
#include "kernels/embedding/embedding_scan_list.cuh"

namespace sg::kernels::embedding_internal {
namespace {

using namespace sm90;  // NOLINT: the mbarriers and bulk copies this kernel is built from

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kScan3Threads = 32 + kConsumers;  // warp 0: producer (after the listing)
constexpr int kSegCols = kConsumers * 8;        // a segment: one pack of 8 columns per consumer
constexpr int kListCap3 = 2560;                 // >= two steps of 288 threads' ids
constexpr int kRows3 = 64;                      // vocabulary rows per CTA
constexpr int kRingBytes = 64 * 1024;
constexpr int kMaxSlots = 32;
constexpr int kPrefetchRounds = 4;  // L2 prefetch distance along a long run, in rounds of the ring
constexpr int kTokensAtOnce = 4;  // slots a consumer waits for before adding them in order
static_assert(kRingBytes >= kTokensAtOnce * kSegCols * 4, "the ring must hold kTokensAtOnce f32 segments");

template <int R>
struct Scan3Shared {
  scan_list::ScanList<kScan3Threads, kListCap3, R> list;
  uint64_t full[kMaxSlots];   // slot s holds its segment (one producer arrival + the bytes)
  uint64_t empty[kMaxSlots];  // slot s read by every consumer warp
  alignas(128) float zeros[kSegCols];
  alignas(128) unsigned char ring[kRingBytes];  // slots
};

// --- the ring ------------------------------------------------------------------------------------------

// Where the ring's sequence number `seq` lives: its slot, and the round's parity.
struct Ring {
  unsigned char* base;
  uint32_t slot_bytes, slots;
  __device__ __forceinline__ uint32_t Slot(uint32_t seq) const { return seq % slots; }
  __device__ __forceinline__ uint32_t Round(uint32_t seq) const { return seq / slots; }
  __device__ __forceinline__ unsigned char* Data(uint32_t seq) const { return base + Slot(seq) * slot_bytes; }
};

__device__ __forceinline__ int SegPacks(int packs, int seg) {
  const int left = packs - seg * kConsumers;
  return left < kConsumers ? left : kConsumers;
}

// Producer (one thread): every listed token's dout segments into the ring, in the consumers' order
// (rows ascending; per row its segments; per segment its tokens ascending), from sequence `seq`.
template <typename T, int R>
__device__ __forceinline__ void Produce(const T* __restrict__ dout, int rows, int dim, uint32_t seq, const Ring& ring,
                                        Scan3Shared<R>& sh) {
  const int packs = dim / 8, segs = (packs + kConsumers - 1) / kConsumers;
#pragma unroll 1
  for (int row = 0; row < rows; ++row) {
    const int begin = sh.list.begin[row], end = sh.list.begin[row + 1];
#pragma unroll 1
    for (int seg = 0; seg < segs && begin < end; ++seg) {
      const uint32_t bytes = uint32_t(SegPacks(packs, seg)) * 8 * sizeof(T);
      // A run longer than the ring (a hot id) is also prefetched into L2 up to kPrefetchRounds
      // rounds of the ring ahead: one CTA's ring alone keeps only 64 KB of it in flight.
      const int ahead = int(ring.slots) * kPrefetchRounds;
      auto src = [&](int j) { return dout + int64_t(sh.list.sorted[j]) * dim + int64_t(seg) * kSegCols; };
#pragma unroll 1
      for (int j = begin + int(ring.slots); j < end && j < begin + ahead; ++j) BulkPrefetchL2(src(j), bytes);
#pragma unroll 1
      for (int j = begin; j < end; ++j, ++seq) {
        if (j + ahead < end) BulkPrefetchL2(src(j + ahead), bytes);
        const uint32_t slot = ring.Slot(seq), round = ring.Round(seq);
        if (round > 0) MbarWait<true>(SmemAddr(&sh.empty[slot]), (round - 1) & 1);  // the last round's segment read
        MbarArriveExpectTx(SmemAddr(&sh.full[slot]), bytes);
        BulkLoad(SmemAddr(ring.Data(seq)), src(j), bytes, SmemAddr(&sh.full[slot]));
      }
    }
  }
}

// Consumer thread c (0 .. kConsumers - 1): pack c of every segment of every row, in the
// producer's order from sequence `seq`; writes each row (a partial sum unless `last`), and in the
// last pass zeros to rows that never had a token.
template <typename T, int R>
__device__ __forceinline__ void Consume(float* __restrict__ dtable, int64_t row0, int rows, int dim, bool last,
                                        uint32_t seq, const Ring& ring, Scan3Shared<R>& sh) {
  const int c = int(threadIdx.x) - 32, lane = int(threadIdx.x) & 31;
  const int packs = dim / 8, segs = (packs + kConsumers - 1) / kConsumers;
#pragma unroll 1
  for (int row = 0; row < rows; ++row) {
    const int begin = sh.list.begin[row], end = sh.list.begin[row + 1];
    const bool partial = sh.list.touched[row] != 0;
    float* out = dtable + (row0 + row) * int64_t(dim);
    if (begin == end) {
      if (!last || partial) continue;  // nothing new; a partial row already holds its sum
      if (c == 0) {
#pragma unroll 1
        for (int seg = 0; seg < segs; ++seg) {
          BulkStore(out + int64_t(seg) * kSegCols, SmemAddr(sh.zeros), uint32_t(SegPacks(packs, seg)) * 32);
        }
        BulkCommit();
      }
      continue;
    }
#pragma unroll 1
    for (int seg = 0; seg < segs; ++seg) {
      const int seg_packs = SegPacks(packs, seg);
      const bool active = c < seg_packs;
      float* dst = out + int64_t(seg) * kSegCols + c * 8;
      float acc[8];
      if (partial && active) {
        cuda_vec::Pack8<float>::Load(dst, acc);  // written by this thread in an earlier pass
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] = 0.f;
      }
#pragma unroll 1
      for (int j = begin; j < end; j += kTokensAtOnce) {
        cuda_vec::Raw8<T> y[kTokensAtOnce];
#pragma unroll
        for (int u = 0; u < kTokensAtOnce; ++u) {
          if (j + u < end) {
            MbarWait<true>(SmemAddr(&sh.full[ring.Slot(seq + u)]), ring.Round(seq + u) & 1);
            if (active) y[u] = reinterpret_cast<const cuda_vec::Raw8<T>*>(ring.Data(seq + u))[c];
          }
        }
#pragma unroll
        for (int u = 0; u < kTokensAtOnce; ++u) {
          if (j + u < end && active) {
            float v[8];
            cuda_vec::Unpack(y[u], v);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k] += v[k];
          }
        }
        __syncwarp();  // the warp's reads of these slots are done
        const int took = end - j < kTokensAtOnce ? end - j : kTokensAtOnce;
        if (lane == 0) {
          for (int u = 0; u < took; ++u) MbarArrive(SmemAddr(&sh.empty[ring.Slot(seq + u)]));
        }
        seq += uint32_t(took);
      }
      if (active) cuda_vec::Pack8<float>::Store(dst, acc);
    }
  }
}

// One pass over the listed tokens: order them, stream them through the ring into their rows;
// unless `last`, marks the rows written and empties the list. Every thread calls it.
template <typename T, int R>
__device__ __forceinline__ void Scan3Pass(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                          int rows, int dim, int listed, bool last, uint32_t seq, const Ring& ring,
                                          Scan3Shared<R>& sh) {
  __syncthreads();  // the list and the counts complete; the last pass's slots all released
  if (threadIdx.x < 32) scan_list::OrderByRow(listed, sh.list);
  __syncthreads();
  if (threadIdx.x == 0) {
    Produce<T, R>(dout, rows, dim, seq, ring, sh);
  } else if (threadIdx.x >= 32) {
    Consume<T, R>(dtable, row0, rows, dim, last, seq, ring, sh);
  }
  if (last) return;
  __syncthreads();  // begin[], sorted[], touched[] read, and the partial sums written
  for (int r = int(threadIdx.x); r < R; r += kScan3Threads) {
    if (sh.list.count[r] > 0) sh.list.touched[r] = 1;
    sh.list.count[r] = 0;
  }
  // The next step's barrier orders these before the counts are used again.
}

// Scan3Pass for a list that overflowed: out of line, the rare path (a hot range).
template <typename T, int R>
__device__ __noinline__ void Scan3PassEarly(const T* __restrict__ dout, float* __restrict__ dtable, int64_t row0,
                                            int rows, int dim, int listed, uint32_t seq, const Ring& ring,
                                            Scan3Shared<R>& sh) {
  Scan3Pass<T, R>(dout, dtable, row0, rows, dim, listed, false, seq, ring, sh);
}

// dim % 8 == 0; dout, dtable 16-byte aligned; `slot_bytes` >= one dout segment, `slots` >= 4.
template <typename T, typename I, int R>
__global__ void __launch_bounds__(kScan3Threads, 2)
    Scan3BackwardKernel(const T* __restrict__ dout, const I* __restrict__ tokens, float* __restrict__ dtable,
                        int64_t n, int64_t vocab, int dim, bool ids_vec, uint32_t slot_bytes, uint32_t slots) {
  WaitForPrimary();
  extern __shared__ __align__(128) unsigned char smem[];
  Scan3Shared<R>& sh = *reinterpret_cast<Scan3Shared<R>*>(smem);
  const Ring ring{sh.ring, slot_bytes, slots};
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int rows = int(vocab - row0 < R ? vocab - row0 : R);
  for (int r = int(threadIdx.x); r < R; r += kScan3Threads) {
    sh.list.count[r] = 0;
    sh.list.touched[r] = 0;
  }
  for (int i = int(threadIdx.x); i < kSegCols; i += kScan3Threads) sh.zeros[i] = 0.f;
  FenceProxyAsyncShared();  // the zeros, before bulk stores read them
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < slots; ++s) {
      MbarInit(SmemAddr(&sh.full[s]), 1);
      MbarInit(SmemAddr(&sh.empty[s]), kConsumerWarps);
    }
    FenceMbarInit();
  }
  __syncthreads();
  constexpr int E = scan_list::kIdsPerVec<I>;
  constexpr int64_t kStep = scan_list::kStepIds<I, kScan3Threads>;
  const int64_t mine = int64_t(threadIdx.x) * E;
  const int segs = (dim / 8 + kConsumers - 1) / kConsumers;
  I cur[E], nxt[E];
  scan_list::LoadIds(tokens, mine, n, ids_vec, cur);
  scan_list::LoadIds(tokens, kStep + mine, n, ids_vec, nxt);
  int listed = 0, parity = 0;
  uint32_t seq = 0;  // the ring's next sequence number (the host bounds tokens x segments < 2^31)
  for (int64_t base = 0; base < n; base += kStep) {
    I far[E];
    scan_list::LoadIds(tokens, base + 2 * kStep + mine, n, ids_vec, far);  // in flight over two steps
    listed = scan_list::AppendStep<I>(cur, base, row0, rows, listed, parity, sh.list);
    parity ^= 1;
    if (listed > kListCap3 - kStep) {  // the next step might not fit: sum what is listed now
      Scan3PassEarly<T, R>(dout, dtable, row0, rows, dim, listed, seq, ring, sh);
      seq += uint32_t(listed) * uint32_t(segs);
      listed = 0;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      cur[e] = nxt[e];
      nxt[e] = far[e];
    }
  }
  Scan3Pass<T, R>(dout, dtable, row0, rows, dim, listed, true, seq, ring, sh);
  if (threadIdx.x == 32) BulkWaitRead<0>();  // the issuing thread's stores have read shared memory
}

template <typename T, typename I>
absl::Status LaunchScan3(const Problem& p, const T* dout, const I* tokens, float* dtable, cudaStream_t s) {
  constexpr int R = kRows3;
  auto kernel = Scan3BackwardKernel<T, I, R>;
  constexpr int kSmem = int(sizeof(Scan3Shared<R>));
  static_assert(2 * (kSmem + 1024) <= 228 * 1024, "two CTAs an SM must fit the H100/H200's shared memory");
  // Once per device (a bit each), so that a call under CUDA-graph capture sets nothing.
  static std::atomic<uint64_t> attributes_set{0};
  int device = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device & 63);
  if ((attributes_set.load() & bit) == 0) {
    SG_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    SG_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 int(cudaSharedmemCarveoutMaxShared)));
    attributes_set.fetch_or(bit);
  }
  const int64_t seg_packs = p.dim / 8 < kConsumers ? p.dim / 8 : kConsumers;
  const uint32_t slot_bytes = uint32_t(seg_packs * 8 * int64_t(sizeof(T)));
  const uint32_t slots = kRingBytes / slot_bytes < kMaxSlots ? kRingBytes / slot_bytes : kMaxSlots;
  const dim3 grid(unsigned((p.vocab + R - 1) / R));
  SG_CUDA_RETURN_IF_ERROR(LaunchMaybePdlSmem(kernel, grid, kScan3Threads, size_t(kSmem), s, true, dout, tokens,
                                             dtable, p.tokens, p.vocab, int(p.dim), cuda_vec::Aligned16(tokens),
                                             slot_bytes, slots) /* launch of Scan3BackwardKernel */);
  return absl::OkStatus();
}

template <typename T>
absl::Status Scan3(const Problem& p, const void* dout, const void* tokens, float* dtable, cudaStream_t s) {
  const T* d = static_cast<const T*>(dout);
  return p.tokens_i64 ? LaunchScan3<T, int64_t>(p, d, static_cast<const int64_t*>(tokens), dtable, s)
                      : LaunchScan3<T, int32_t>(p, d, static_cast<const int32_t*>(tokens), dtable, s);
}

}  // namespace

absl::Status BackwardScan3Cuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                               cudaStream_t s) {
  const int64_t segs = (p.dim / 8 + kConsumers - 1) / kConsumers;
  const bool bulk = p.dim % 8 == 0 && p.dim <= INT_MAX / 2 && cuda_vec::Aligned16(dout) &&
                    cuda_vec::Aligned16(dtable) && p.tokens * segs < (int64_t(1) << 31);
  if (!bulk) return BackwardAtomicCuda(p, dout, tokens, dtable, device, s, true);
  if (p.dtype == DType::kBF16) return Scan3<__nv_bfloat16>(p, dout, tokens, dtable, s);
  if (p.dtype == DType::kF16) return Scan3<__half>(p, dout, tokens, dtable, s);
  return Scan3<float>(p, dout, tokens, dtable, s);
}

}  // namespace sg::kernels::embedding_internal
