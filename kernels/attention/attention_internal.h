// Internal to kernels/attention: the resolved problem description and the per-device entry points
// that attention.cc dispatches to after checking arguments. Raw pointers, contiguous layouts as
// documented in attention.h.
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_INTERNAL_H_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_INTERNAL_H_

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_tiling.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::internal {

struct AttentionParams {
  int64_t batch = 0, seq_q = 0, seq_k = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  double scale = 0;  // resolved (never "unset")
  int64_t q_offset = 0, k_offset = 0;
  DType dtype = DType::kBF16;  // of q, k, v, out, dout and the gradients (the CUDA kernels' choice)

  // True when key j is masked for query i.
  bool Masked(int64_t i, int64_t j) const { return causal && k_offset + j > q_offset + i; }
};

// --- CPU reference (attention_cpu.cc): f64 accumulation, threads over (batch, head) ------------
// T is float, BFloat16, Half or double; S (statistics) is float or double. Instantiated for
// (float, float), (BFloat16, float), (Half, float) and (double, double); the last one is for finite
// differences.
template <typename T, typename S>
void AttentionForwardCpu(const AttentionParams& p, const T* q, const T* k, const T* v, T* out,
                         S* lse);
template <typename T, typename S>
void AttentionBackwardDeltaCpu(const AttentionParams& p, const T* out, const T* dout, S* delta);
template <typename T, typename S>
void AttentionBlockBackwardCpu(const AttentionParams& p, const T* q, const T* k, const T* v,
                               const T* dout, const S* lse, const S* delta, T* dq, T* dk, T* dv);
// rows = batch * seq * heads; lse index of row (b, s, h) is (b * heads + h) * seq + s.
template <typename T>
void AttentionMergeCpu(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, const T* out_a,
                       const float* lse_a, const T* out_b, const float* lse_b, T* out, float* lse);

// The CUDA kernel family. kV5 (the default since the H200 run of 2026-11-30 10:50, 1.42-1.54x v3's
// backward): v4's forward and the Hopper wgmma backward (attention_bwd_v5.cu; sm_90 only). kV4:
// v3's backward with the forward variant SG_ATTN_FWD_VARIANT picks (attention_fwd_v4.h). kV3 (the
// mma.sync family, bf16; what runs on a GPU without sm_90a features): v2's forward kernel with a
// heaviest-first grid order (and the scale folded into the exponent at head_dim 64); a backward
// with dq reduced tile-wise by the TMA unit and 128 x 128 tiles at head_dim 64 (attention_bwd_v3.cu).
// kV2: 4 warps x 32 query rows (forward), FA2-style backward with P and dS through shared memory
// and dq by per-thread atomics; kept because its kernels are every family's fallback (forward:
// scale <= 0 or more than 65535 query tiles; backward: more than 65535 key blocks), and selecting
// it is how the tests reach them. v1 (the first kernels) and v3a (v3 with v2's dq atomics, a
// diagnostic) were deleted on 2026-11-30. Chosen at each call by SG_ATTENTION_KERNEL=v2|v3|v4|v5
// (unset: v5).
// kGeneric (SG_ATTENTION_KERNEL=generic): the plain kernels of attention_generic.cu, which also run
// every case the flash families do not cover (f32 data, head_dim other than 64 and 128).
enum class AttentionKernel { kV2, kV3, kV4, kV5, kGeneric };
// The widest head the generic kernels take (kernels::kAttentionMaxHeadDim).
constexpr int kGenericMaxDim = 256;
inline absl::StatusOr<AttentionKernel> AttentionKernelFromEnv() {
  const char* s = std::getenv("SG_ATTENTION_KERNEL");
  // The default: v5 (the wgmma forward and the wgmma backward).
  if (s == nullptr || *s == '\0' || std::string(s) == "v5") return AttentionKernel::kV5;
  if (std::string(s) == "v4") return AttentionKernel::kV4;
  if (std::string(s) == "v3") return AttentionKernel::kV3;
  if (std::string(s) == "v2") return AttentionKernel::kV2;
  if (std::string(s) == "generic") return AttentionKernel::kGeneric;
  return absl::InvalidArgumentError(absl::StrCat(
      "SG_ATTENTION_KERNEL: expected v2, v3, v4, v5 or generic (or unset), found '", s, "'"));
}

// Floats of the f32 dq workspace AttentionBlockBackwardCuda needs, for every variant: v2 uses
// dq's shape [batch, seq_q, heads, head_dim], v3 and v5 [batch, heads, DqAccumRows(seq_q), head_dim].
inline int64_t DqWorkspaceElems(const AttentionParams& p) {
  return p.batch * p.heads * DqAccumRows(p.seq_q) * p.head_dim;
}

// --- CUDA (attention.cu): bf16 or f16 data (p.dtype; f16 on families v4 and v5 only), f32
// statistics; `stream` is a cudaStream_t -------------------------------------------------------------
absl::Status AttentionForwardCuda(const AttentionParams& p, const void* q, const void* k,
                                  const void* v, void* out, float* lse, void* stream);
absl::Status AttentionBackwardDeltaCuda(const AttentionParams& p, const void* out,
                                        const void* dout, float* delta, void* stream);
// dq_accum: f32 workspace of DqWorkspaceElems(p) floats (zeroed here).
absl::Status AttentionBlockBackwardCuda(const AttentionParams& p, const void* q, const void* k,
                                        const void* v, const void* dout, const float* lse,
                                        const float* delta, float* dq_accum, void* dq, void* dk,
                                        void* dv, void* stream);
// --- CUDA, the generic kernels (attention_generic.cu): f32, bf16 or f16 (p.dtype), head_dim 1 ..
// kGenericMaxDim, deterministic; where the flash families above do not apply, or when
// SG_ATTENTION_KERNEL=generic. dq, dk, dv are overwritten (no workspace).
absl::Status AttentionForwardGenericCuda(const AttentionParams& p, const void* q, const void* k, const void* v,
                                         void* out, float* lse, void* stream);
absl::Status AttentionBackwardDeltaGenericCuda(const AttentionParams& p, const void* out, const void* dout,
                                               float* delta, void* stream);
absl::Status AttentionBlockBackwardGenericCuda(const AttentionParams& p, const void* q, const void* k,
                                               const void* v, const void* dout, const float* lse,
                                               const float* delta, void* dq, void* dk, void* dv, void* stream);
// dtype f32, bf16 or f16.
absl::Status AttentionMergeCuda(DType dtype, int64_t batch, int64_t seq, int64_t heads,
                                int64_t head_dim, const void* out_a, const float* lse_a,
                                const void* out_b, const float* lse_b, void* out, float* lse,
                                void* stream);

}  // namespace sg::kernels::internal

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_INTERNAL_H_
