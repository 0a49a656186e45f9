// Internal to kernels/attention: the forward variants of kernel family v4 (also the forward of the
// default family v5; SG_ATTENTION_KERNEL=v3 selects the older one; v4's backward is v3's). SG_ATTN_FWD_VARIANT picks
// the forward at each call, so one binary can compare them (attention_benchmark's forward_v4 sets
// both variables itself and sweeps every variant):
//
//   SG_ATTENTION_KERNEL=v4 SG_ATTN_FWD_VARIANT=8x16q llama ...   # any program calling attention
//
// mma.sync variants (attention_fwd_v4.cu), "<warps>x<query rows per warp>":
//   4x32   4 warps x 32 rows, 64-key tiles, K and V waited separately, lazy O rescale
//   4x32j  as 4x32 with K and V in one cp.async group (one barrier per tile, as v2)
//   8x16q  8 warps x 16 rows, Q in registers, 128-key tiles, one block per SM
//   8x16   8 warps x 16 rows, Q from shared memory, 64-key tiles, two blocks per SM
// wgmma variants (attention_fwd_v4_wgmma.cu): Hopper warpgroup MMA, 2 warpgroups x 64 rows, one
// block per SM:
//   wgmma     128-key tiles; QK^T, softmax and PV in turn (2 stages) (the fallback of ws and wsi
//             for tensors TMA cannot address)
//   wgmmap    128-key tiles; QK^T of tile t + 1 and PV of tile t in flight together, the softmax
//             of tile t + 1 under the PV (3 stages)
//   wgmmap64  as wgmmap with 64-key tiles (fewer registers in flight)
//   wgmmat    as wgmma with V transposed in shared memory, so that P V reads a K-major B like
//             QK^T does (a check on the MN-major descriptor of the others)
// warp-specialized wgmma variants (attention_fwd_v4_ws.cu): a TMA producer warp feeding K/V rings
// (mbarriers) and 2 consumer warpgroups x 64 rows with setmaxnreg 24 / 240, 128-key tiles, the
// softmax of tile t under the PV of tile t - 1 (FA3's structure):
//   ws        with ping-pong between the consumer warpgroups (named barriers) (the default)
//   wsi       without ping-pong (intra-warpgroup overlap only)
// Element types: bf16 for every variant; f16 for wgmma, ws and wsi.
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_H_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_H_

#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace sg::kernels::internal {

enum class FwdV4Variant {
  k4x32,
  k4x32j,
  k8x16q,
  k8x16,
  kWgmma,
  kWgmmaPipelined,
  kWgmmaPipelined64,
  kWgmmaTransposedV,
  kWarpSpecialized,
  kWarpSpecializedIntra
};
inline bool IsWgmma(FwdV4Variant v) { return v >= FwdV4Variant::kWgmma; }
// The warp-specialized variants (attention_fwd_v4_ws.cu), a subset of IsWgmma.
inline bool IsWarpSpecialized(FwdV4Variant v) {
  return v == FwdV4Variant::kWarpSpecialized || v == FwdV4Variant::kWarpSpecializedIntra;
}
// The variants that run f16 as well as bf16.
inline bool RunsF16(FwdV4Variant v) { return v == FwdV4Variant::kWgmma || IsWarpSpecialized(v); }

struct FwdV4VariantName {
  FwdV4Variant variant;
  const char* name;
};
constexpr FwdV4VariantName kFwdV4Variants[] = {{FwdV4Variant::k4x32, "4x32"},
                                               {FwdV4Variant::k4x32j, "4x32j"},
                                               {FwdV4Variant::k8x16q, "8x16q"},
                                               {FwdV4Variant::k8x16, "8x16"},
                                               {FwdV4Variant::kWgmma, "wgmma"},
                                               {FwdV4Variant::kWgmmaPipelined, "wgmmap"},
                                               {FwdV4Variant::kWgmmaPipelined64, "wgmmap64"},
                                               {FwdV4Variant::kWgmmaTransposedV, "wgmmat"},
                                               {FwdV4Variant::kWarpSpecialized, "ws"},
                                               {FwdV4Variant::kWarpSpecializedIntra, "wsi"}};

// The variant's SG_ATTN_FWD_VARIANT spelling.
inline const char* FwdV4VariantToName(FwdV4Variant variant) {
  for (const FwdV4VariantName& v : kFwdV4Variants) {
    if (v.variant == variant) return v.name;
  }
  return "?";
}

// SG_ATTN_FWD_VARIANT (unset or empty: ws, the fastest at every measured shape on H200 on
// 2026-11-30: B=8 S=2048 H=32 KV=8 causal 334.9 / 503.2 TFLOP/s at D=64 / 128 against wgmma's
// 274.5 / 370.5 and wsi's 288.2 / 457.4 in the same call); anything else is InvalidArgument.
inline absl::StatusOr<FwdV4Variant> FwdV4VariantFromEnv() {
  const char* s = std::getenv("SG_ATTN_FWD_VARIANT");
  if (s == nullptr || *s == '\0') return FwdV4Variant::kWarpSpecialized;
  std::string known;
  for (const FwdV4VariantName& v : kFwdV4Variants) {
    if (std::string(s) == v.name) return v.variant;
    absl::StrAppend(&known, known.empty() ? "" : ", ", v.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("SG_ATTN_FWD_VARIANT: expected one of ", known, " (or unset), found '", s, "'"));
}

}  // namespace sg::kernels::internal

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_H_
