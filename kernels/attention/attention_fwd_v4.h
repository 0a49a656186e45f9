// Internal to kernels/attention: the forward variants of kernel family v4 (also the forward of the
// default family v5; SG_ATTENTION_KERNEL=v3 selects the older one; v4's backward is v3's).
// SG_ATTN_FWD_VARIANT picks the forward at each call, so one binary can compare them
// (attention_benchmark's forward_v4 sets both variables itself and runs every variant):
//
//   SG_ATTN_FWD_VARIANT=wgmma llama ...   # any program calling attention
//
// Both are Hopper warpgroup MMA (wgmma), 2 x 64 query rows per block, 128-key tiles, one block per SM:
//   ws     (the default) FA3's structure (attention_fwd_v4_ws.cu): a TMA producer warp feeding K/V
//          rings (mbarriers), 2 consumer warpgroups at setmaxnreg 240, the softmax of tile t under
//          the PV of tile t - 1, ping-pong between the consumers (named barriers)
//   wgmma  QK^T, softmax and PV in turn, K/V in a 2-stage cp.async ring (attention_fwd_v4_wgmma.cu);
//          what ws falls back to for tensors TMA cannot address
// Both run bf16 and f16. Deleted after losing on the H200 (benchmarks/README.md): "wsi" (ws without
// the ping-pong; 288.2 / 457.4 TFLOP/s causal at D64 / D128 against ws's 334.9 / 503.2), the
// wgmma variants "wgmmap", "wgmmap64", "wgmmat" and the mma.sync variants "4x32", "4x32j", "8x16q",
// "8x16" (each slower than "wgmma").
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_H_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_H_

#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace sg::kernels::internal {

enum class FwdV4Variant { kWgmma, kWarpSpecialized };

struct FwdV4VariantName {
  FwdV4Variant variant;
  const char* name;
};
constexpr FwdV4VariantName kFwdV4Variants[] = {{FwdV4Variant::kWgmma, "wgmma"},
                                               {FwdV4Variant::kWarpSpecialized, "ws"}};

// The variant's SG_ATTN_FWD_VARIANT spelling.
inline const char* FwdV4VariantToName(FwdV4Variant variant) {
  for (const FwdV4VariantName& v : kFwdV4Variants) {
    if (v.variant == variant) return v.name;
  }
  return "?";
}

// SG_ATTN_FWD_VARIANT (unset or empty: ws, the fastest at every measured shape on H200 on
// 2026-11-30: B=8 S=2048 H=32 KV=8 causal 334.9 / 503.2 TFLOP/s at D=64 / 128 against wgmma's
// 274.5 / 370.5 in the same call); anything else is InvalidArgument.
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
