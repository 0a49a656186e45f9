// Internal to kernels/wgmma_gemm (nvcc only): the GEMM kernel's own PTX -- wgmma m64n256k16 (bf16
// in, f32 accumulate) with both operands K-major in shared memory, and its descriptor. The shared
// Hopper primitives (mbarriers, TMA, bulk groups, clusters, setmaxnreg, wgmma fences) are
// kernels/core/sm90.h's.
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

#include "kernels/core/sm90.h"

namespace sg::kernels::wgmma_gemm_internal {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void StShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LdShared32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// A K-major operand's descriptor (sm90::Sw128Desc with LBO 16, SBO 1024): see the layout above.
__device__ __forceinline__ uint64_t KMajorSw128Desc(uint32_t addr) { return sm90::Sw128Desc(addr, 16, 1024); }

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
