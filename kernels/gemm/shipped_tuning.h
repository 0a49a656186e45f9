// cuBLASLt algorithm choices measured once on a reference machine and shipped with the code, so a
// run on the same GPU model and cuBLASLt version starts from them instead of timing anything.
//
// kernels/gemm/tuned/nvidia_h200.json: the Llama-1B step's 17 GEMM problems on an H200
// (cuBLASLt 130100), ranked by joules a call at the 700 W power limit (llama_step_benchmark
// --autotune_energy_ms=600 --autotune_energy_within=1.3 --autotune_energy_candidates=8
// --autotune_energy_min_us=40, benchmarks/gpu_calls/gpu_call116.sh, 2026-12-04; the step 0.5-1.5%
// faster than with the few-call fastest choices, benchmarks/README.md "GEMM algorithms ranked by
// energy"). A table for another model or library version simply misses (autotune::TuningKey), and
// every choice is checked by cublasLtMatmulAlgoCheck before use (kernels/gemm/gemm_cublaslt.cc).
//
//   SG_ASSIGN_OR_RETURN(kernels::autotune::TuningTable t, kernels::ShippedGemmTuning());
//   kernels::autotune::Tuner::Global().Install(t);   // choices already recorded win
#ifndef SGTRAIN_KERNELS_GEMM_SHIPPED_TUNING_H_
#define SGTRAIN_KERNELS_GEMM_SHIPPED_TUNING_H_

#include "absl/status/statusor.h"
#include "kernels/autotune/tuning_table.h"

namespace sg::kernels {

// Every shipped table, merged. Internal if a shipped table does not parse (a build defect).
absl::StatusOr<autotune::TuningTable> ShippedGemmTuning();

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_GEMM_SHIPPED_TUNING_H_
