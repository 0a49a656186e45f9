// Internal to kernels/attention (nvcc only): the Hopper warpgroup-MMA (wgmma, sm_90a) building
// blocks shared by the wgmma forward (attention_fwd_v4_wgmma.cu) and the wgmma backward
// (attention_bwd_v5.cu): PTX wrappers, shared-memory descriptors, the swizzled tile load and the
// issue loops of the two GEMM shapes both kernels use.
//
// Shared-memory layout of every operand tile [rows][D] (D a multiple of 64): D / 64 column blocks
// of [rows][64] (128-byte rows), 16-byte chunk c of row r at chunk (c ^ (r % 8)) -- the 128-byte
// swizzle pattern, in 1024-byte atoms of 8 rows. Descriptors (PTX "matrix descriptor"):
//   K-major (the contraction runs along a row): SBO = 1024 (next 8 rows), LBO unused (16); a k16
//     step is +32 bytes inside an atom, +rows*128 per column block.
//   MN-major (the contraction runs down the rows): SBO = 1024 (next 8 rows of the contraction),
//     LBO = rows*128 (next 64 columns of M or N); a k16 step is +16 rows = +2048 bytes.
// Accumulator (m64nNk16, f32): warp w of the warpgroup, lane l: element i of d holds row
// 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2 -- per warp the mma.sync
// m16n8 C layout, one n8 chunk per 4 registers. A from registers: per warp the mma.sync m16k16 A
// layout, so PackP turns an accumulator into the A operand of the next product.
//
// The device functions exist only in the sm_90a pass (the compute_90 PTX pass has no wgmma): code
// using them sits inside #if defined(__CUDA_ARCH_FEAT_SM90_ALL).
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_WGMMA_CUH_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_WGMMA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/attention_device.cuh"

namespace sg::kernels::internal::attention_device {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// --- wgmma instruction wrappers (sm_90a; fences, waits and descriptors: kernels/core/sm90.h) ------

// d = A B (accumulate == 0) or d += A B for one k16 step, m64n{64,128}k16; A and B from shared
// memory, K-major descriptors, or MN-major with kTransA / kTransB = 1 (16-bit types only). T: the operand type, bf16 or f16 (each asm is spelled once, as a
// macro of the PTX type name, and expanded for both).
#define SG_ATTN_WGMMA_SS64_ASM(TYPE) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kTransA), "n"(kTransB))
template <typename T, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS64(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(kIs16Bit<T>, "wgmma operands: bf16 or f16");
  if constexpr (kIsF16<T>) {
    SG_ATTN_WGMMA_SS64_ASM("f16");
  } else {
    SG_ATTN_WGMMA_SS64_ASM("bf16");
  }
}
#undef SG_ATTN_WGMMA_SS64_ASM

#define SG_ATTN_WGMMA_SS128_ASM(TYPE) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kTransA), "n"(kTransB))
template <typename T, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(kIs16Bit<T>, "wgmma operands: bf16 or f16");
  if constexpr (kIsF16<T>) {
    SG_ATTN_WGMMA_SS128_ASM("f16");
  } else {
    SG_ATTN_WGMMA_SS128_ASM("bf16");
  }
}
#undef SG_ATTN_WGMMA_SS128_ASM

// d += A B for one k16 step, m64n{64,128}k16; A from registers (the mma.sync A layout in each warp),
// B from shared memory: kTransB = 1 through an MN-major descriptor, 0 K-major.
#define SG_ATTN_WGMMA_RS128_ASM(TYPE) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1), "n"(kTransB))
template <typename T, int kTransB>
__device__ __forceinline__ void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(kIs16Bit<T>, "wgmma operands: bf16 or f16");
  if constexpr (kIsF16<T>) {
    SG_ATTN_WGMMA_RS128_ASM("f16");
  } else {
    SG_ATTN_WGMMA_RS128_ASM("bf16");
  }
}
#undef SG_ATTN_WGMMA_RS128_ASM

#define SG_ATTN_WGMMA_RS64_ASM(TYPE) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1), "n"(kTransB))
template <typename T, int kTransB>
__device__ __forceinline__ void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(kIs16Bit<T>, "wgmma operands: bf16 or f16");
  if constexpr (kIsF16<T>) {
    SG_ATTN_WGMMA_RS64_ASM("f16");
  } else {
    SG_ATTN_WGMMA_RS64_ASM("bf16");
  }
}
#undef SG_ATTN_WGMMA_RS64_ASM

// --- Pieces of the kernel -----------------------------------------------------------------------------

// Async copy of a [kRows][kD] tile (rows `row_stride` elements apart, rows >= valid_rows zero-filled)
// into the swizzled layout at `tile` (1024-byte aligned), by all kThreads threads.
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void LoadSwizzled(uint32_t tile, const T* g, int64_t row_stride,
                                             int valid_rows) {
  constexpr int kChunks = kD / 8;
  static_assert(kRows * kChunks % kThreads == 0, "tile load must split evenly");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + int(threadIdx.x), r = idx / kChunks, c = idx % kChunks;
    const bool valid = r < valid_rows;
    const uint32_t dst = tile + (c / 8) * (kRows * 128) + r * 128 + (((c % 8) ^ (r % 8)) * 16);
    CpAsync16(dst, g + (valid ? r : 0) * row_stride + c * 8, valid);
  }
}

// Issues S = Q K^T for this warpgroup's 64 rows (q_tile: its first row in the swizzled Q tile of
// kBlockM rows) against a kBlockN-key tile, as one wgmma group. Both operands K-major. (The
// backward calls it with the roles swapped: S^T = K Q^T, A = its 64 keys of a kBlockM = 128-key
// tile, B = the query tile.)
template <typename T, int kD, int kBlockM, int kBlockN>
__device__ __forceinline__ void IssueQK(float (&s)[kBlockN / 2], uint32_t q_tile, uint32_t k_tile) {
  static_assert(kBlockN == 64 || kBlockN == 128, "QK^T wrappers: m64n64 and m64n128");
  FenceOperands(s);
  WgmmaFence();
  const uint64_t a0 = Sw128Desc(q_tile, 16, 1024), b0 = Sw128Desc(k_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {  // k16 step: + (kk / 4) column blocks + (kk % 4) * 32 bytes
    const uint32_t within = (kk % 4) * 32;
    const uint64_t a_desc = Sw128DescAdvance(a0, (kk / 4) * (kBlockM * 128) + within);
    const uint64_t b_desc = Sw128DescAdvance(b0, (kk / 4) * (kBlockN * 128) + within);
    if constexpr (kBlockN == 128) {
      WgmmaSS128<T>(s, a_desc, b_desc, kk > 0);
    } else {
      WgmmaSS64<T>(s, a_desc, b_desc, kk > 0);
    }
  }
  WgmmaCommit();
}

// Issues O += P V (P: T A fragments, k16 step kk = keys 16 kk..) as one wgmma group; V as loaded,
// [kBlockN][kD] read through an MN-major descriptor. (The backward: dV += P^T dO and dK += dS^T Q,
// with kBlockN = the query tile's rows.)
template <typename T, int kD, int kBlockN>
__device__ __forceinline__ void IssuePV(float (&o)[kD / 2], const uint32_t (&p)[kBlockN / 16][4],
                                        uint32_t v_tile) {
  FenceOperands(o);
  WgmmaFence();
  const uint64_t b0 = Sw128Desc(v_tile, kBlockN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t b_desc = Sw128DescAdvance(b0, kk * 16 * 128);
    if constexpr (kD == 128) {
      WgmmaRS128<T, 1>(o, p[kk], b_desc);
    } else {
      WgmmaRS64<T, 1>(o, p[kk], b_desc);
    }
  }
  WgmmaCommit();
}

// P as T A fragments: k16 step kk is S chunks 2 kk and 2 kk + 1 (the mma.sync A layout).
template <typename T, int kBlockN>
__device__ __forceinline__ void PackP(uint32_t (&p)[kBlockN / 16][4], const float (&s)[kBlockN / 2]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[kk][i] = Pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  }
}

// --- The forward's softmax on accumulators (attention_fwd_v4_wgmma.cu, attention_fwd_v4_ws.cu) ---------

// Masks keys past the end and (causal) after the query in the scores of key tile n0. Element i of
// s is (row first_row + 8 ((i / 2) % 2), key n0 + 8 (i / 4) + 2 (lane % 4) + i % 2).
template <int kBlockN>
__device__ __forceinline__ void MaskTile(float (&s)[kBlockN / 2], const Problem& pr, int m0, int n0,
                                         int first_row, int lane) {
  if (!TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k)) return;
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    const int col = n0 + (i / 4) * 8 + 2 * (lane % 4) + (i & 1);
    const int row = first_row + ((i & 2) ? 8 : 0);
    if (col >= pr.seq_k || (pr.causal && int64_t(col) > row + pr.q_minus_k)) s[i] = -INFINITY;
  }
}

// Online softmax of one tile in the log2 domain on raw scores (scale > 0): s becomes
// p = 2^(s c - m) with m the new running max; alpha = 2^(old max - new max) per row half.
template <int kBlockN>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBlockN / 2], float (&row_max)[2],
                                            float (&row_sum)[2], float (&alpha)[2], float c) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = fmaxf(row_max[r], QuadMax(mx) * c);
    const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: keep 2^x finite
    alpha[r] = FastExp2(row_max[r] - m_use);
    row_max[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      s[4 * j + 2 * r] = FastExp2(fmaf(s[4 * j + 2 * r], c, -m_use));
      s[4 * j + 2 * r + 1] = FastExp2(fmaf(s[4 * j + 2 * r + 1], c, -m_use));
      sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    row_sum[r] = row_sum[r] * alpha[r] + sum;  // per-thread partial; quad-reduced at the end
  }
}

template <int kD>
__device__ __forceinline__ void RescaleO(float (&o)[kD / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] *= alpha[(i / 2) % 2];
}

// The forward's epilogue, shared by the wgmma and ws kernels: each thread's two query rows
// (first_row, first_row + 8) of O normalized by their softmax sums and stored to out [b, s, h, kD],
// and the rows' lse (natural log, [b, h, row]; -inf for a row that saw no key) from the lane that
// holds column 0 of the quad. Rows at or past seq_q store nothing.
template <typename T, int kD>
__device__ __forceinline__ void StoreForwardRows(const float (&o)[kD / 2], const float (&row_max)[2],
                                                 const float (&row_sum)[2], const Problem& pr, int b, int h,
                                                 int first_row, int lane, T* out, float* lse) {
  const int64_t q_row = int64_t(pr.heads) * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = QuadSum(row_sum[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = first_row + 8 * r;
    if (row < pr.seq_q) {
      if (lane % 4 == 0) {
        lse[(int64_t(b) * pr.heads + h) * pr.seq_q + row] = l > 0.f ? (row_max[r] + __log2f(l)) * kLn2 : -INFINITY;
      }
      T* out_row = out + (int64_t(b) * pr.seq_q + row) * q_row + h * kD + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        *reinterpret_cast<uint32_t*>(out_row + 8 * j) = Pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sg::kernels::internal::attention_device

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_WGMMA_CUH_
