// Matrix multiplication: one entry point, Gemm(), over cuBLASLt on CUDA and Eigen on the CPU, plus the
// three products a Linear layer needs (MatmulForward / MatmulBackward).
//
//   // y[M,N] = x[M,K] @ w[N,K]^T + bias[N]   (bf16 in, f32 accumulation, bf16 out)
//   sg::kernels::GemmArgs g;
//   g.a = x; g.b = w; g.trans_b = true; g.d = y; g.bias = bias;
//   SG_RETURN_IF_ERROR(sg::kernels::Gemm(g, stream));
//
// Matrices are row-major in the project's sense: the last dimension is contiguous (stride 1) and
// the row stride (leading dimension) may exceed the row length, so a column slice of a bigger
// matrix can be passed directly. A rank-3 operand is a strided batch [batch, rows, cols] with any
// batch stride; a rank-2 `b` next to a rank-3 `a` is shared by every batch entry. Accumulation is
// f32 everywhere (no TF32 for f32 inputs, so f32 results are exact-rounding f32 GEMMs).
#ifndef SGTRAIN_KERNELS_GEMM_GEMM_H_
#define SGTRAIN_KERNELS_GEMM_GEMM_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// How the CUDA path picks its cuBLASLt algorithm (ignored on the CPU).
//  kDefault:   autotuned when the process's Tuner is enabled (kernels/autotune; the compiler enables
//              it for steps compiled with CompileOptions::autotune), else cuBLASLt's heuristic.
//  kHeuristic: the first algorithm of cuBLASLt's heuristic (what an untuned GEMM runs).
//  kTuned:     the top algorithms of the heuristic are timed on this problem once per (problem,
//              device model, cuBLASLt version) and the fastest is kept in the Tuner's table (or a
//              choice recorded there, e.g. read from the compile cache, is reused without timing).
// Tuning runs the candidates on the call's own operands (d is written by each and then by the
// call itself; a problem accumulating into d in place is timed on a scratch copy instead) and
// synchronizes the stream: do it in a warm-up step. Inside a CUDA graph capture an untuned problem
// gets the heuristic's algorithm instead.
enum class GemmAlgo : uint8_t { kDefault, kHeuristic, kTuned };

// d = alpha * row_scale[:,None] * (op(a) @ op(b)) + beta * c + bias[None,:]
//
// Shapes (per batch entry): op(a) is [M,K] (a is [K,M] when trans_a), op(b) is [K,N] (b is [N,K]
// when trans_b), d and c are [M,N], bias is [N], row_scale is [M].
// Dtypes: a and b both f32, both bf16 or both f16; d is f32 or the inputs' dtype; c and bias have d's
// dtype; row_scale is f32. All tensors on one device.
struct GemmArgs {
  TensorView a;
  TensorView b;
  TensorView d;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  // With beta != 0 and no `c`, d is read and updated in place (gradient accumulation).
  float beta = 0.0f;
  // The residual added with weight beta; when given it must not overlap d.
  std::optional<TensorView> c;
  // Broadcast over rows (a Linear bias); cuBLASLt's BIAS epilogue on CUDA.
  std::optional<TensorView> bias;
  // A per-row f32 factor on the product, e.g. the 1/rms of an RMSNorm folded into the next GEMM
  // (kernels/gemm_rmsnorm). Requires beta == 0 and no bias.
  std::optional<TensorView> row_scale;
  // CUDA only: false forces the row scale into a separate pass over d instead of cuBLASLt's
  // per-row alpha vector, so benchmarks and tests can compare the two. Ignored on the CPU.
  bool row_scale_in_epilogue = true;
  GemmAlgo algo = GemmAlgo::kDefault;
  // CUDA: the number of SMs cuBLASLt should plan for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), e.g.
  // fewer than the device has when another stream's kernels run alongside; 0: all of them, or
  // SG_GEMM_SMS from the environment when set (an experiment knob for every such GEMM). Ignored on
  // the CPU.
  int sm_count = 0;
};

// InvalidArgument naming the offending operand on any shape/dtype/device/stride mismatch;
// FailedPrecondition for CUDA tensors in a build without CUDA; Unimplemented when cuBLASLt has no
// algorithm for the problem; Internal with cuBLASLt's status string when the library fails.
// CUDA: the first call per problem shape and stream allocates a 32 MiB workspace and runs
// cuBLASLt's heuristic, or the autotuning (see GemmAlgo; all cached for the process); issue it once
// before capturing a CUDA graph.
absl::Status Gemm(const GemmArgs& args, const Stream& stream);

// Forgets the process's cached cuBLASLt algorithm per problem (not the autotune Tuner's table), so
// the next call per problem looks it up again, e.g. from a freshly installed table: for tests and
// benchmarks comparing choices. Not while another thread runs GEMMs.
void ResetGemmAlgorithmCache();

// A tuned cuBLASLt choice's configuration in words ("algo 66 tile 24 cluster 5 option 7 stages 35
// splitk 1", cuBLASLt's enum values), from the variant bytes the Tuner records for kernel
// "gemm.cublaslt"; "" for bytes that are not an algorithm, or without CUDA.
std::string DescribeCublasLtChoice(const std::string& variant);

// Linear forward, PyTorch layout: y[M,N] = x[M,K] @ w[N,K]^T (+ bias[N]). x and y may carry leading
// dimensions (flattened into M).
absl::Status MatmulForward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& bias,
                           const TensorView& y, const Stream& stream);

// Linear backward: dx = dy @ w (x's dtype and shape; skipped when dx is nullopt) and
// dw = dy^T @ x ([N,K], f32 or x's dtype), overwritten, or added to dw's contents when accumulate_dw (beta = 1,
// for micro-batch gradient accumulation into f32 master gradients).
absl::Status MatmulBackward(const TensorView& dy, const TensorView& x, const TensorView& w,
                            const std::optional<TensorView>& dx, const TensorView& dw, bool accumulate_dw,
                            const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_GEMM_GEMM_H_
