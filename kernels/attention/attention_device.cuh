// Internal to kernels/attention (nvcc only): the device building blocks the CUDA attention kernels
// share -- PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16 bf16 or f16; the Hopper ones are
// kernels/core/sm90.h's), padded shared-memory tiles, fragment loaders, quad reductions and the
// resolved problem description.
//
// Element type: the helpers that touch 16-bit data take it as a template parameter T, bf16 (the
// default, what every kernel family supports) or f16 (IEEE half; the default family v4 only). Both
// are 16-bit, so copies, ldmatrix and the fragment layouts are the same; only the MMA's operand type
// and the float <-> 16-bit conversions differ.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 (k x n):    b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C 16x8 f32:        c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
// so an S accumulator pair (n-tiles 2k, 2k+1) packed to bf16 is exactly the A operand of P @ V.
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_DEVICE_CUH_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/status/statusor.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/core/sm90.h"
#include "kernels/core/status.h"

namespace sg::kernels::internal {
namespace attention_device {

// The Hopper primitives (SmemAddr, mbarriers, TMA, bulk reductions, setmaxnreg, wgmma fences and
// descriptors) come from kernels/core/sm90.h.
using namespace ::sg::sm90;  // NOLINT: every attention kernel file uses them

using bf16 = __nv_bfloat16;
using f16 = __half;
// True for f16 (IEEE half), false for bf16; the kernels are instantiated for these two only.
template <typename T>
constexpr bool kIsF16 = std::is_same_v<T, f16>;
template <typename T>
constexpr bool kIs16Bit = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// --- PTX wrappers ----------------------------------------------------------------------------------

// 16-byte async copy; `valid` false writes zeros (src is not read but must be a valid address).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4-byte async copy (through L1); `valid` false writes zero.
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void Ldmatrix4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a @ b for one m16n8k16 tile, with T (bf16 or f16) operands and f32 accumulators.
template <typename T = bf16>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(kIs16Bit<T>, "mma operands: bf16 or f16");
  if constexpr (kIsF16<T>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The two halves of a PackBf16 word, exactly (bf16 is the top half of an f32).
__device__ __forceinline__ float Bf16LoToFloat(uint32_t packed) { return __uint_as_float(packed << 16); }
__device__ __forceinline__ float Bf16HiToFloat(uint32_t packed) {
  return __uint_as_float(packed & 0xffff0000u);
}

// lo, hi rounded to nearest T (bf16 or f16; f16 overflows to inf) in one 32-bit word, lo first.
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  static_assert(kIs16Bit<T>, "Pack2: bf16 or f16");
  if constexpr (kIsF16<T>) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    return PackBf16(lo, hi);
  }
}
// The two halves of a Pack2<T> word as floats, exactly.
template <typename T>
__device__ __forceinline__ float Unpack2Lo(uint32_t packed) {
  if constexpr (kIsF16<T>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(packed & 0xffffu)));
  } else {
    return Bf16LoToFloat(packed);
  }
}
template <typename T>
__device__ __forceinline__ float Unpack2Hi(uint32_t packed) {
  if constexpr (kIsF16<T>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(packed >> 16)));
  } else {
    return Bf16HiToFloat(packed);
  }
}

// Index (in floats) of element (row, col) of a v3 dq workspace tile ([rows][kD] f32, one tile per
// bulk reduction; the v3 and v5 backward kernels write it, ConvertDqV3Kernel reads it): chunks of 8
// floats XOR-swizzled by row % 8, so the 8 rows of an MMA fragment store fall into distinct bank
// groups.
template <int kD>
__device__ __forceinline__ int DqSwizzle(int row, int col) {
  return row * kD + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// The A operand (T: bf16 or f16) of a k-step from two C accumulator tiles (columns 16k..16k+15 of
// a 16-row block).
template <typename T = bf16>
__device__ __forceinline__ void AccToA(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = Pack2<T>(c0[0], c0[1]);
  a[1] = Pack2<T>(c0[2], c0[3]);
  a[2] = Pack2<T>(c1[0], c1[1]);
  a[3] = Pack2<T>(c1[2], c1[3]);
}

// --- Shared-memory tiles -----------------------------------------------------------------------------

// A [kRows, kCols] tile of T (bf16 or f16) with rows padded by 16 bytes: the 8 rows an ldmatrix
// reads then start 4 banks apart, so every 8x8 load is conflict-free without swizzling.
template <int kRows, int kCols, typename T = bf16>
struct SmemTile {
  static_assert(kIs16Bit<T>, "tile elements: bf16 or f16");
  static_assert(kCols % 8 == 0, "tile columns must be whole 16-byte chunks");
  static constexpr int kStride = kCols + 8;
  static constexpr int kElems = kRows * kStride;
  T* p;
  __device__ T* at(int r, int c) const { return p + r * kStride + c; }
  __device__ uint32_t addr(int r, int c) const { return SmemAddr(at(r, c)); }

  // Async copy of rows [0, valid_rows) from global rows `row_stride` elements apart; rows beyond are
  // zero-filled. valid_rows >= 1.
  template <int kThreads>
  __device__ void Load(const T* g, int64_t row_stride, int valid_rows) const {
    constexpr int kChunksPerRow = kCols / 8;
    static_assert((kRows * kChunksPerRow) % kThreads == 0, "tile load must split evenly");
#pragma unroll
    for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
      const int c = i * kThreads + int(threadIdx.x);
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const bool valid = r < valid_rows;
      CpAsync16(addr(r, col), g + (valid ? r : 0) * row_stride + col, valid);
    }
  }
};

// A operand (16 rows x 16 k at (row0, k0)) of a row-major tile.
template <typename Tile>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const Tile& t, int row0, int k0, int lane) {
  Ldmatrix4(a, t.addr(row0 + (lane % 16), k0 + (lane / 16) * 8));
}
// B operands of two n-tiles (rows n0..n0+15 of a tile stored [n][k]) at k0: b[0], b[1] for n-tile
// n0, b[2], b[3] for n0 + 8.
template <typename Tile>
__device__ __forceinline__ void LoadBNk(uint32_t (&b)[4], const Tile& t, int n0, int k0, int lane) {
  Ldmatrix4(b, t.addr(n0 + (lane / 16) * 8 + (lane % 8), k0 + ((lane / 8) % 2) * 8));
}
// B operands of two n-tiles from a tile stored [k][n] (rows k0..k0+15, columns n0..n0+15).
template <typename Tile>
__device__ __forceinline__ void LoadBKn(uint32_t (&b)[4], const Tile& t, int k0, int n0, int lane) {
  Ldmatrix4Trans(b, t.addr(k0 + (lane % 16), n0 + (lane / 16) * 8));
}
// A operand (16 rows x 16 k) from a tile stored transposed, [k][row] (k0.., row0..).
template <typename Tile>
__device__ __forceinline__ void LoadATransposed(uint32_t (&a)[4], const Tile& t, int row0, int k0,
                                                int lane) {
  Ldmatrix4Trans(a, t.addr(k0 + (lane / 16) * 8 + (lane % 8), row0 + ((lane / 8) % 2) * 8));
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

struct Problem {
  int seq_q, seq_k, heads, kv_heads;
  float scale;         // softmax scale
  float scale_log2;    // scale * log2(e): scores live in the log2 domain
  bool causal;
  int64_t q_minus_k;   // q_offset - k_offset: key j is masked for query i when j > i + q_minus_k
};

// 2^x with the hardware approximation (2 ulp; ex2(-inf) = +0), skipping exp2f's range handling.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

inline absl::StatusOr<Problem> MakeProblem(const AttentionParams& p) {
  SG_CHECK_ARG(p.seq_q < (int64_t(1) << 30) && p.seq_k < (int64_t(1) << 30) && p.heads <= 65535 &&
                   p.batch <= 65535,
               "CUDA attention: sizes out of range (seq < 2^30, heads and batch <= 65535), found batch ",
               p.batch, " seq_q ", p.seq_q, " seq_k ", p.seq_k, " heads ", p.heads);
  return Problem{int(p.seq_q), int(p.seq_k), int(p.heads), int(p.kv_heads), float(p.scale),
                 float(p.scale * 1.4426950408889634), p.causal, p.q_offset - p.k_offset};
}

template <typename Kernel>
absl::Status AllowSmem(Kernel kernel, int bytes) {
  SG_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return absl::OkStatus();
}

// Variant v2 (attention_fwd_v2.cu, attention_bwd_v2.cu); head_dim 64 or 128, arguments as in attention_internal.h.
absl::Status LaunchForwardV2(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                             const void* v, void* out, float* lse, cudaStream_t stream);
absl::Status LaunchBackwardV2(const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dk, void* dv,
                              cudaStream_t stream);

// Variant v3's forward (attention_fwd_v2.cu: the v2 kernel with its kV3 switches; scale <= 0 runs
// v2's), arguments as LaunchForwardV2.
absl::Status LaunchForwardV3(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                             const void* v, void* out, float* lse, cudaStream_t stream);
// Variant v3 (attention_bwd_v3.cu): the backward kernel and the dq conversion. dq_accum holds
// DqWorkspaceElems floats (zeroed by the caller) in v3's tile layout; dq is written here.
// dQ tiles are added by the TMA unit (BulkReduceAddF32). dtype: kBF16, or kF16 (family v4's
// backward).
absl::Status LaunchBackwardV3(DType dtype, const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dq, void* dk, void* dv,
                              cudaStream_t stream);
// dq[b, i, h, :] = scale * the v3 workspace (DqSwizzle tiles, DqAccumRows(seq_q) rows per head),
// rounded to dtype (kBF16 or kF16); shared by the v3 and v5 backward.
absl::Status LaunchConvertDqV3(DType dtype, const Problem& pr, int head_dim, int batch,
                               const float* dq_accum, void* dq, cudaStream_t stream);
// Variant v5 (attention_bwd_v5.cu): the wgmma backward (sm_90a) and v3's dq conversion; arguments
// and workspace as LaunchBackwardV3 (bf16 or f16). Unimplemented on GPUs other than sm_90.
absl::Status LaunchBackwardV5(DType dtype, const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dq, void* dk, void* dv,
                              cudaStream_t stream);

}  // namespace attention_device
}  // namespace sg::kernels::internal

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_DEVICE_CUH_
