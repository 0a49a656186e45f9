#include "kernels/gemm/shipped_tuning.h"

#include "absl/strings/str_cat.h"

namespace sg::kernels {
namespace {

// The tables' text, embedded at build time (the genrule in kernels/gemm/BUILD.bazel).
constexpr const char* kShipped[] = {
#include "kernels/gemm/tuned/nvidia_h200.json.inc"
};

}  // namespace

absl::StatusOr<autotune::TuningTable> ShippedGemmTuning() {
  autotune::TuningTable all;
  for (const char* text : kShipped) {
    absl::StatusOr<autotune::TuningTable> t = autotune::TuningTable::Parse(text);
    if (!t.ok()) return absl::InternalError(absl::StrCat("shipped GEMM tuning table: ", t.status().message()));
    all.Merge(*t);
  }
  return all;
}

}  // namespace sg::kernels
