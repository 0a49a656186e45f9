// Internal to kernels/wgmma_gemm (nvcc only): the Hopper PTX the GEMM kernel is built from --
// mbarriers, TMA tile loads, register reallocation and wgmma m64n256k16 (bf16 in, f32 accumulate)
// with both operands K-major in shared memory.
//
// Shared-memory operand tile [rows][64] bf16 as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B from
// a 1024-byte-aligned base: row r at r * 128 bytes, its 16-byte chunk c at chunk c ^ (r % 8) (the
// swizzle is a function of the address bits, so a 1024-byte-aligned tile starts a fresh pattern).
// That is exactly the layout a K-major wgmma descriptor with 128-byte swizzling reads: 8-row core
// groups 1024 bytes apart (SBO), LBO unused for K-major swizzled layouts (set to 16 as CUTLASS
// does), base offset 0; a k16 step is +32 bytes of the start address inside the 128-byte row.
//
// Accumulator of m64n256k16 (f32, 128 registers): warp w of the warpgroup, lane l, register i holds
// row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2.
//
// Everything here exists only in the sm_90a device pass (__CUDA_ARCH_FEAT_SM90_ALL): the compute_90
// PTX pass has no wgmma or setmaxnreg.
#ifndef SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_DEVICE_CUH_
#define SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_DEVICE_CUH_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::kernels::wgmma_gemm_internal {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarriers ---------------------------------------------------------------------------------------

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initializations visible to the async proxy (the TMA unit's complete_tx) and the cluster.
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives and raises the phase's expected transaction bytes: the phase completes when the arrivals
// are in and `bytes` have landed through complete_tx (the TMA loads).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// True once the phase of parity `parity` has completed (a fresh barrier is in phase 0, so waiting
// on parity 1 returns at once: how the producer's first pass over the ring sees every slot free).
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits with a deadline: a wait that cannot end (a wrong parity or byte count) traps after ~20 s of
// SM clock instead of hanging the process, and the launch's stream reports the error.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  if (MbarTryWait(bar, parity)) return;
  const long long start = clock64();
  while (!MbarTryWait(bar, parity)) {
    if (clock64() - start > (1ll << 35)) __trap();
  }
}

// --- TMA -----------------------------------------------------------------------------------------------

// The 2-D box at (c0 = inner/contiguous coordinate, c1 = row) of `map` into shared memory at `dst`,
// completing `bytes` of `bar`'s transaction count. `map` is the generic address of a __grid_constant__
// kernel parameter.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The same box multicast to the CTAs of the cluster named by `cta_mask` (bit r: rank r): each gets
// it at `dst` and has `bytes` of its own barrier at `bar` completed (same offsets in every CTA).
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
// Stores the shared-memory box at `src` to (c0, c1) of `map` as one bulk group of this thread.
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
__device__ __forceinline__ void BulkCommitGroup() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// All of this thread's bulk groups but the newest kPending have finished reading shared memory.
template <int kPending>
__device__ __forceinline__ void BulkWaitGroupRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// All of this thread's bulk groups are complete (their global writes done).
__device__ __forceinline__ void BulkWaitAll() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (a TMA store).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void StShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// --- clusters -----------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster arrives, then waits for all the others (so no thread may
// have exited); release/acquire order shared-memory accesses across the cluster. Not .aligned: the
// callers arrive from diverged warps.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrives on the barrier at the same shared-memory offset `bar` in the cluster's CTA `rank`.
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// --- register reallocation (whole warpgroup) -------------------------------------------------------------

template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// --- wgmma ---------------------------------------------------------------------------------------------------

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// All of this warp's wgmma groups but the newest kPending are complete (their shared-memory reads
// included).
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the fences and waits.
template <int kN>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A K-major shared-memory matrix descriptor with 128-byte swizzling (layout type 1 in bits 62-63):
// start address, LBO and SBO in 16-byte units; base offset 0 (tiles are 1024-byte aligned).
__device__ __forceinline__ uint64_t KMajorSw128Desc(uint32_t addr) {
  constexpr uint64_t kLbo = 16, kSbo = 1024;
  return uint64_t((addr & 0x3FFFF) >> 4) | (kLbo >> 4) << 16 | (kSbo >> 4) << 32 | uint64_t(1) << 62;
}

// d = A B^T (accumulate == 0) or d += A B^T for one k16 step: A [64][16] and B [256][16] bf16 from
// shared memory, both K-major (no transpose), f32 accumulators.
__device__ __forceinline__ void WgmmaM64N256K16(float (&d)[128], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sg::kernels::wgmma_gemm_internal

#endif  // SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_DEVICE_CUH_
