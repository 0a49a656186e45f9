// Internal to kernels/attention (nvcc only): the Hopper pieces of the warp-specialized forward
// (attention_fwd_v4_ws.cu) -- mbarriers with bounded waits, TMA tile loads, register reallocation
// and named barriers -- plus the host-side tensor map of a [batch, seq, heads, head_dim] tensor.
//
// The 4-D tensor map views q (or k, v) as dims {head_dim, heads, seq, batch} (innermost first) and
// loads boxes of {64, 1, rows, 1}: 64 columns of one head for `rows` consecutive positions of one
// batch element, 128-byte swizzled. In shared memory (1024-byte-aligned destination) the box is row
// r at r * 128 bytes, 16-byte chunk c at chunk c ^ (r % 8): one column block of the swizzled tile
// layout attention_wgmma.cuh describes, so the wgmma descriptors read it unchanged. Positions past
// the sequence are zero-filled by the TMA unit (and still count in the transaction bytes).
//
//   CUtensorMap map;
//   SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map, DType::kBF16, k, batch, seq_k, kv_heads, 64, 128));
//   ... in the kernel: MbarArriveExpectTx(full, 128 * 64 * 2); TmaLoad4d(dst, &map, 0, kh, n0, b, full);
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_TMA_CUH_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_TMA_CUH_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::internal::attention_device {

// The tensor map of a contiguous [batch, seq, heads, head_dim] tensor of dtype (kBF16 or kF16),
// read in {64, 1, box_rows, 1} boxes with 128-byte swizzling. Errors: no cuTensorMapEncodeTiled in
// the driver, a base not 16-byte aligned, or the driver rejecting the map (Internal, its code).
absl::Status EncodeHeadTileMap(CUtensorMap* map, DType dtype, const void* base, int64_t batch,
                               int64_t seq, int64_t heads, int64_t head_dim, int box_rows);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// --- mbarriers -----------------------------------------------------------------------------------

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initializations visible to the async proxy (the TMA unit's complete_tx).
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives and raises the phase's expected transaction bytes (completed by the TMA loads).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// True once the phase of parity `parity` has completed (a fresh barrier is in phase 0, so parity 1
// reads as complete: how the producer's first pass over the ring finds every stage free).
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Out of line on purpose: with an inline trap in the consumers' code, ptxas (nvcc 13.0) ignores
// their setmaxnreg raise and compiles them under the launch budget of 168 registers (a
// 200-register loop spilled 384 bytes with the trap inline, none behind this call).
__device__ __noinline__ void TrapOnTimeout() { __trap(); }
// Waits with a deadline: a wait that cannot end (a wrong parity or byte count, a lost arrival)
// traps after ~2^35 SM clocks (~20 s) instead of hanging; the launch's stream reports the error.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  if (MbarTryWait(bar, parity)) return;
  const long long start = clock64();
  while (!MbarTryWait(bar, parity)) {
    if (clock64() - start > (1ll << 35)) TrapOnTimeout();
  }
}

// --- TMA -------------------------------------------------------------------------------------------

// The box at coordinates (c0 column, c1 head, c2 position, c3 batch) of `map` into shared memory at
// `dst`, completing its bytes on `bar`. `map`: the generic address of a __grid_constant__ parameter.
__device__ __forceinline__ void TmaLoad4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// --- register reallocation (every thread of the warpgroup) and named barriers ----------------------

template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: waits for them all.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives on named barrier `id` without waiting (the producer side of a hand-off).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sg::kernels::internal::attention_device

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_TMA_CUH_
