// Element-wise reductions used by the collectives: dst[i] = op(dst[i], src[i]), accumulating in f32
// for 16-bit types (one rounding per call), and the final scaling of an average. The CPU versions run
// on the calling thread; the CUDA versions (reduce_kernels.cu) are enqueued on a stream.
//
//   SG_RETURN_IF_ERROR(ReduceInto(ReduceOp::kSum, DType::kBF16, acc_ptr, recv_ptr, n));
//   SG_RETURN_IF_ERROR(ScaleInPlace(DType::kBF16, acc_ptr, n, 1.0f / world_size));
#ifndef SGTRAIN_COMM_REDUCE_H_
#define SGTRAIN_COMM_REDUCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/core/dtype.h"
#include "kernels/core/stream.h"

namespace sg::comm {

// kAvg reduces as a sum; the collective scales by 1/size once at the end.
enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

// "sum", "avg", "max".
absl::string_view ReduceOpName(ReduceOp op);

// True for the dtypes the collectives reduce: f32 and bf16.
constexpr bool IsReducibleDType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// Host: dst[i] = op(dst[i], src[i]) for i < n. InvalidArgument for other dtypes.
absl::Status ReduceInto(ReduceOp op, DType dtype, void* dst, const void* src, int64_t n);
// Host: x[i] *= scale, computed in f32.
absl::Status ScaleInPlace(DType dtype, void* x, int64_t n, float scale);

// Host: dst[i] = src[i] for i < n, bf16 widened to f32 (exact).
void WidenBf16(const void* src, float* dst, int64_t n);

// Device versions, ordered on `stream` (a CUDA stream). FailedPrecondition without CUDA.
absl::Status ReduceIntoDevice(ReduceOp op, DType dtype, void* dst, const void* src, int64_t n,
                              const Stream& stream);
// Device, out of place and fused with a scale: dst[i] = op(a[i], b[i]) * scale (computed in f32,
// rounded once). dst may alias a or b. The grid is capped at half the SMs, so a communication
// kernel launched while it runs still finds free SMs (the ring overlaps the two).
absl::Status ReduceDevice(ReduceOp op, DType dtype, void* dst, const void* a, const void* b,
                          int64_t n, float scale, const Stream& stream);
absl::Status ScaleInPlaceDevice(DType dtype, void* x, int64_t n, float scale, const Stream& stream);
// Device: dst[i] = src[i] * scale for i < n, bf16 read, f32 written (exact when scale is 1).
absl::Status WidenBf16Device(const void* src, float* dst, int64_t n, float scale, const Stream& stream);

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_REDUCE_H_
