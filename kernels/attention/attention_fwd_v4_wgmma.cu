// CUDA flash attention forward, v4 variant "wgmma" (SG_ATTN_FWD_VARIANT=wgmma): Hopper warpgroup
// MMA with cp.async loads. Not the default: "ws" (attention_fwd_v4_ws.cu, FA3's warp-specialized
// structure) is, and falls back to this kernel for tensors TMA cannot address. mma.sync tops out near
// two thirds of the H200's tensor throughput; wgmma reaches it, and runs asynchronously to the
// issuing warps.
//
// One block of 2 warpgroups per (128-query tile, head, batch); warpgroup w owns query rows
// [64 w, 64 w + 64). Key tiles of 128 in a 2-stage cp.async ring (one barrier per tile), as in v2:
//   S = Q K^T   wgmma m64n128k16, Q and K from shared memory (K-major, 128-byte swizzle)
//   softmax     on the S accumulators (the mma.sync C layout per warp), scale folded into exp2
//   O += P V    wgmma m64n{D}k16, P from registers (the mma.sync A layout per warp), V from shared
//               memory through an MN-major descriptor (V stays [key][d] as loaded)
// Element types: bf16 and f16 (IEEE half), the same kernel with the f16 wgmma (P rounded to f16 for
// P V; f32 accumulators and statistics).
// Variants that lost to this one on the H200 and were deleted (benchmarks/README.md has the numbers):
// "wgmmap" / "wgmmap64" (QK^T of tile t + 1 beside PV of tile t, 3 stages; 128- / 64-key tiles) and
// "wgmmat" (V transposed in shared memory); the mma.sync variants 4x32, 4x32j, 8x16q, 8x16.
//
// Shared-memory layout of every operand tile [rows][D]: D / 64 column blocks of [rows][64] (128-byte
// rows), 16-byte chunk c of row r at chunk (c ^ (r % 8)) -- the 128-byte swizzle pattern, in
// 1024-byte atoms of 8 rows. Descriptors (PTX "matrix descriptor"): K-major (Q, K): SBO = 1024 (next
// 8 rows), LBO unused (1); a k16 step is +32 bytes inside an atom, +rows*128 per column block.
// MN-major (V as B of P V): SBO = 1024 (next 8 keys), LBO = rows*128 (next 64 columns of d).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_fwd_v4.cuh"
#include "kernels/attention/attention_tiling.h"
#include "kernels/core/device.h"
#include "kernels/attention/attention_wgmma.cuh"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kDim>
struct WgmmaFwdConfig {
  static constexpr int kD = kDim, kThreads = 256, kBlockM = 128, kBlockN = 128, kStages = 2;
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128 (whole 64-column swizzle blocks)");
  static constexpr int kQBytes = kBlockM * kD * 2, kKvBytes = kBlockN * kD * 2;
  // + 1 KB to align the tiles to the 1024-byte swizzle atoms.
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

// Per key tile: QK^T, softmax, PV, each waited for; 2 stages. (The wrappers, descriptors, tile load
// and the QK^T / PV issue loops are in attention_wgmma.cuh.)
// T: the element type of q, k, v, out (bf16 or f16); P is rounded to T for P V.
template <typename T, int kD>
__global__ void __launch_bounds__(256, 1)
    WgmmaFwdKernel(Problem pr, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgmmaFwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sq = (SmemAddr(smem) + 1023) & ~1023u;
  const uint32_t sk = sq + C::kQBytes, sv = sk + kStages * C::kKvBytes;  // stage s at + s * kKvBytes

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int m_block = pr.causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);
  const int h = blockIdx.x, b = blockIdx.z, kh = h / (pr.heads / pr.kv_heads);
  const int m0 = m_block * kBlockM;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const T* q_base = q + (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
  const T* k_base = k + int64_t(b) * pr.seq_k * k_row + kh * kD;
  const T* v_base = v + int64_t(b) * pr.seq_k * k_row + kh * kD;

  const int n_end = VisibleKeyEnd(min(m0 + kBlockM, pr.seq_q), pr.seq_k, pr.causal, pr.q_minus_k);
  const int n_tiles = (n_end + kBlockN - 1) / kBlockN;

  // Commit groups: Q, then one per key tile (empty past the end).
  LoadSwizzled<kBlockM, kD, C::kThreads>(sq, q_base, q_row, pr.seq_q - m0);
  CpAsyncCommit();
  auto load_kv = [&](int t) {
    if (t < n_tiles) {
      const int n = t * kBlockN;
      const uint32_t offset = (t % kStages) * C::kKvBytes;
      LoadSwizzled<kBlockN, kD, C::kThreads>(sk + offset, k_base + n * k_row, k_row, pr.seq_k - n);
      LoadSwizzled<kBlockN, kD, C::kThreads>(sv + offset, v_base + n * k_row, k_row, pr.seq_k - n);
    }
    CpAsyncCommit();
  };
  auto k_tile = [&](int t) { return sk + (t % kStages) * C::kKvBytes; };
  auto v_tile = [&](int t) { return sv + (t % kStages) * C::kKvBytes; };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) load_kv(t);

  float o[kD / 2];  // m64n{kD} accumulator: n8 chunk j holds (row g, 8j + 2t..), (row g + 8, ..)
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float s[kBlockN / 2];
  uint32_t p[kBlockN / 16][4];
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
  const int first_row = m0 + 64 * wg + 16 * warp + lane / 4;  // and first_row + 8
  const uint32_t q_tile = sq + wg * 64 * 128;                  // this warpgroup's 64 rows of Q
  // The newest copy committed so far (by every thread) has landed and is visible to the async
  // proxy (wgmma), and every thread is done with the stage the next copy refills.
  auto all_landed = [&] {
    CpAsyncWait<0>();
    FenceProxyAsyncShared();
    __syncthreads();
  };

  for (int t = 0; t < n_tiles; ++t) {
    all_landed();  // tile t
    load_kv(t + 1);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.f;
    IssueQK<T, kD, kBlockM, kBlockN>(s, q_tile, k_tile(t));
    WgmmaWait<0>();
    FenceOperands(s);
    MaskTile<kBlockN>(s, pr, m0, t * kBlockN, first_row, lane);
    SoftmaxTile<kBlockN>(s, row_max, row_sum, alpha, pr.scale_log2);
    RescaleO<kD>(o, alpha);
    PackP<T, kBlockN>(p, s);
    IssuePV<T, kD, kBlockN>(o, p, v_tile(t));
    WgmmaWait<0>();
    FenceOperands(o);
    FenceOperands(p);
  }
  CpAsyncWait<0>();  // with no key tiles the Q copy may still be in flight

  StoreForwardRows<T, kD>(o, row_max, row_sum, pr, b, h, first_row, lane, out, lse);
#else
  __trap();  // wgmma needs sm_90a; the dispatch launches this kernel only there
#endif
}

template <typename T, int kD>
absl::Status LaunchWgmma(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                         void* out, float* lse, cudaStream_t stream) {
  using C = WgmmaFwdConfig<kD>;
  auto* kernel = WgmmaFwdKernel<T, kD>;
  const int m_blocks = (pr.seq_q + C::kBlockM - 1) / C::kBlockM;
  SG_CHECK_ARG(m_blocks <= 65535, "attention v4 wgmma forward: at most 65535 query tiles of ",
               C::kBlockM, " rows, found seq_q ", pr.seq_q);
  SG_RETURN_IF_ERROR(AllowSmem(kernel, C::kSmemBytes));
  kernel<<<dim3(pr.heads, m_blocks, batch), C::kThreads, C::kSmemBytes, stream>>>(
      pr, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<T*>(out), lse);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(WgmmaFwdKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchWgmmaDim(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                            const void* v, void* out, float* lse, cudaStream_t stream) {
  if (head_dim == 64) return LaunchWgmma<T, 64>(pr, batch, q, k, v, out, lse, stream);
  return LaunchWgmma<T, 128>(pr, batch, q, k, v, out, lse, stream);
}

}  // namespace

absl::Status LaunchForwardV4Wgmma(FwdV4Variant variant, DType dtype, const Problem& pr, int head_dim,
                                  int batch, const void* q, const void* k, const void* v, void* out,
                                  float* lse, cudaStream_t stream) {
  SG_RETURN_IF_ERROR(RequireSm90("attention v4 wgmma forward"));
  if (variant == FwdV4Variant::kWarpSpecialized) {
    const absl::Status st = LaunchForwardV4Ws(dtype, pr, head_dim, batch, q, k, v, out, lse, stream);
    if (!absl::IsUnimplemented(st)) return st;
    // Unaligned tensors or no tensor-map encoder: the cp.async kernel.
  }
  if (dtype == DType::kF16) return LaunchWgmmaDim<f16>(pr, head_dim, batch, q, k, v, out, lse, stream);
  return LaunchWgmmaDim<bf16>(pr, head_dim, batch, q, k, v, out, lse, stream);
}

}  // namespace sg::kernels::internal::attention_device
