// The Hopper (sm_90) device primitives the TMA / mbarrier / wgmma kernels are built from, as inline
// PTX, once for the whole project: shared-memory addresses, mbarriers with a bounded wait, TMA tile
// loads and stores, bulk copies and reductions, async-proxy fences, named barriers, clusters,
// register reallocation, the wgmma fences and shared-memory descriptors; and, on the host, the
// driver's cuTensorMapEncodeTiled. Only meaningful inside nvcc-compiled files (everything sits
// under __CUDACC__). The MMA instructions themselves (one wrapper per shape) stay with their kernels.
//
//   using namespace sg::sm90;
//   if (threadIdx.x == 0) { MbarInit(SmemAddr(&full), 1); FenceMbarInit(); }  // then __syncthreads()
//   MbarArriveExpectTx(SmemAddr(&full), bytes); TmaLoad2d(SmemAddr(tile), &map, c0, c1, SmemAddr(&full));
//   MbarWait(SmemAddr(&full), phase & 1);  // traps after ~20 s instead of hanging
//
// Conventions: shared-memory operands are 32-bit shared-window addresses (SmemAddr), global ones
// generic pointers; a tensor map is the generic address of a __grid_constant__ CUtensorMap
// parameter. mbarriers, bulk copies, TMA and clusters need sm_90 and exist in every device pass of
// this build (sm_90a and the compute_90 PTX); setmaxnreg and wgmma need sm_90a and exist only where
// __CUDA_ARCH_FEAT_SM90_ALL is defined, so code using them sits inside the same #if.
#ifndef SGTRAIN_KERNELS_CORE_SM90_H_
#define SGTRAIN_KERNELS_CORE_SM90_H_

#ifdef __CUDACC__
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/core/status.h"

namespace sg::sm90 {

// --- host: tensor maps ---------------------------------------------------------------------------

// cuTensorMapEncodeTiled from the driver, looked up once (the runtime links no libcuda).
// Unimplemented "<what>: the driver has no cuTensorMapEncodeTiled" on a driver older than 12.0, so
// a caller may fall back to a kernel without TMA.
inline absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> TensorMapEncoder(absl::string_view what) {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p)
               : nullptr;
  }();
  if (fn == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": the driver has no cuTensorMapEncodeTiled (needs CUDA driver >= 12.0)"));
  }
  return fn;
}

// Encodes `map` for a tensor of `rank` dims (innermost first; `strides` in bytes, of dims 1..rank-1)
// read in `box` tiles, 128-byte swizzled (the layout the K-major / MN-major wgmma descriptors below
// read), L2 promotion 256 B, out-of-bounds elements zero-filled. Errors: TensorMapEncoder's, or
// Internal with the driver's code when it rejects the map.
inline absl::Status EncodeTensorMapSw128(CUtensorMap* map, CUtensorMapDataType dtype, uint32_t rank,
                                         const void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                                         const cuuint32_t* box, absl::string_view what) {
  SG_ASSIGN_OR_RETURN(PFN_cuTensorMapEncodeTiled_v12000 encode, TensorMapEncoder(what));
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, dtype, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return LibraryError(absl::StatusCode::kInternal, "CUDA driver", r,
                        absl::StrCat(what, ": tensor map rejected").c_str(), "cuTensorMapEncodeTiled",
                        __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

// --- shared memory -------------------------------------------------------------------------------

// The 32-bit shared-window address of a generic pointer into shared memory (what PTX's .shared
// operands take).
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarriers -----------------------------------------------------------------------------------

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initializations visible to the async proxy (the TMA unit's complete_tx) and the cluster;
// then a CTA (or cluster) barrier before any use.
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives and raises the phase's expected transaction bytes: the phase completes when the arrivals
// are in and `bytes` have landed through complete_tx (TMA loads, bulk copies).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// Arrives on the barrier at the same shared-memory offset `bar` in the cluster's CTA `rank`.
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// True once the phase of parity `parity` has completed (a fresh barrier is in phase 0, so waiting
// on parity 1 returns at once: how a producer's first pass over a ring sees every slot free).
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// SM clocks after which MbarWait gives up: 2^35, ~20 s at the H200's ~1.7 GHz.
constexpr long long kMbarWaitClocks = 1ll << 35;

// Out of line on purpose: with an inline trap in a warp-specialized consumer's code, ptxas (nvcc
// 13.0) ignored its setmaxnreg raise and compiled it under the launch budget (the attention ws
// forward's 200-register loop spilled 384 bytes with the trap inline, none behind this call).
// static: one private copy per translation unit (device code is not linked across files here).
static __device__ __noinline__ void TrapOnTimeout() { __trap(); }

// Waits for the phase of parity `parity` with a deadline: a wait that cannot end (a wrong parity or
// byte count, a lost arrival) traps after kMbarWaitClocks instead of hanging the process, and the
// launch's stream reports the error. kInlineTrap puts the trap inline instead of behind the call
// above: WgmmaGemm compiles to its previous code with it, and the GEMM measured 1.5-1.8% slower
// with the call (H200, 2026-11-30, the two binaries alternating in one run: 658 / 647 TFLOP/s
// inline against 648 / 635 behind the call, 16384 x N x 2048, N = 3072 / 8192).
template <bool kInlineTrap = false>
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  if (MbarTryWait(bar, parity)) return;
  const long long start = clock64();
  while (!MbarTryWait(bar, parity)) {
    if (clock64() - start > kMbarWaitClocks) {
      if constexpr (kInlineTrap) {
        __trap();
      } else {
        TrapOnTimeout();
      }
    }
  }
}

// --- TMA (tensor maps) ---------------------------------------------------------------------------

// The 2-D box at (c0 = inner/contiguous coordinate, c1 = row) of `map` into shared memory at `dst`,
// completing its bytes on `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same box multicast to the CTAs of the cluster named by `cta_mask` (bit r: rank r): each gets
// it at `dst` and has the bytes of its own barrier at `bar` completed (same offsets in every CTA).
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
// The 4-D box at (c0, c1, c2, c3) (innermost first) of `map` into shared memory at `dst`,
// completing its bytes on `bar`.
__device__ __forceinline__ void TmaLoad4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Stores the shared-memory box at `src` to (c0, c1) of `map` in this thread's current bulk group.
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// --- bulk copies and reductions (no tensor map) --------------------------------------------------
// Sizes are multiples of 16 bytes, addresses 16-byte aligned. Shared memory a bulk store or
// reduction reads must be written, then fenced with FenceProxyAsyncShared by every writer, then a
// barrier, before one thread issues it; it may be overwritten once BulkWaitRead in that thread (and
// a barrier for the others) says it has been read.

// `bytes` from global `src` to shared `dst`, counted on `bar`'s transaction bytes.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// `bytes` from shared `src` to global `dst`, in this thread's current bulk group.
__device__ __forceinline__ void BulkStore(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
// global[dst, dst + bytes) += shared[src, src + bytes) as f32, element-wise atomic (relaxed, gpu
// scope), performed by the TMA unit, in this thread's current bulk group.
__device__ __forceinline__ void BulkReduceAddF32(float* dst, uint32_t src, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
// A hint: `bytes` from global `src` into L2.
__device__ __forceinline__ void BulkPrefetchL2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
// Closes this thread's current bulk group (stores, reductions, TMA stores).
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups but the newest kPending have finished reading shared memory.
template <int kPending>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// ... and are complete (their global writes performed).
template <int kPending>
__device__ __forceinline__ void BulkWait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (bulk stores,
// reductions, TMA stores that read them).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// --- named barriers and clusters ------------------------------------------------------------------

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32): waits
// for them all.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives on named barrier `id` without waiting (the producer side of a hand-off).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster arrives, then waits for all the others (so no thread may
// have exited); release/acquire order shared-memory accesses across the cluster. Not .aligned:
// callers may arrive from diverged warps.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// --- sm_90a only: register reallocation and wgmma --------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Every thread of the warpgroup, with the same kRegs (a multiple of 8, 24..256).
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// The warpgroup's wgmma groups but the newest kPending are complete (their shared-memory reads
// included).
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the fences and waits above.
template <int kN>
__device__ __forceinline__ void FenceOperands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for the A fragments of a register-sourced (RS) wgmma: they are read asynchronously until
// the wait, so they must stay allocated (not reused for temporaries) until then.
template <int kK>
__device__ __forceinline__ void FenceOperands(uint32_t (&a)[kK][4]) {
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[kk][i])::"memory");
  }
}

// A shared-memory matrix descriptor with 128-byte swizzling (layout type 1 in bits 62-63): start
// address, LBO and SBO in 16-byte units, base offset 0 (tiles 1024-byte aligned). K-major operands:
// LBO unused (16), SBO 1024 (the next 8 rows); MN-major: LBO the bytes to the next 64 columns of M
// or N, SBO 1024 (the next 8 rows of the contraction).
__device__ __forceinline__ uint64_t Sw128Desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16 |
         uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32 | uint64_t(1) << 62;
}

// The descriptor of the same operand `bytes` further on (a multiple of 16): Sw128Desc(addr + bytes,
// lbo, sbo) from Sw128Desc(addr, lbo, sbo). The start address field (bits 0-13, address / 16) cannot
// carry while addr + bytes stays in shared memory's 256 KiB window, so a k-step loop adds to the low
// word of one descriptor (one integer add, or none where it folds) instead of building each anew.
__device__ __forceinline__ uint64_t Sw128DescAdvance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4), hi = uint32_t(desc >> 32);
  return uint64_t(hi) << 32 | lo;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sg::sm90

#endif  // __CUDACC__
#endif  // SGTRAIN_KERNELS_CORE_SM90_H_
