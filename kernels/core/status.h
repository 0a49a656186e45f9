// Error handling for the whole project: library code returns absl::Status / absl::StatusOr<T>, and
// one macro family turns CUDA, cuBLAS, NCCL and UCX error codes into a Status that keeps the call,
// file:line and the library's own error string.
//
//   SG_RETURN_IF_ERROR(RmsNormForward(x, w, eps, y, rstd, stream));
//   SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, DType::kBF16, device));
//   SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
#ifndef SGTRAIN_KERNELS_CORE_STATUS_H_
#define SGTRAIN_KERNELS_CORE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define SG_STATUS_CONCAT_INNER(a, b) a##b
#define SG_STATUS_CONCAT(a, b) SG_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define SG_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::absl::Status sg_status_ = (expr);                \
    if (!sg_status_.ok()) return sg_status_;           \
  } while (0)

// `SG_ASSIGN_OR_RETURN(T v, Make())`: declares/assigns v from a StatusOr or returns its error.
#define SG_ASSIGN_OR_RETURN(lhs, expr) \
  SG_ASSIGN_OR_RETURN_IMPL(SG_STATUS_CONCAT(sg_statusor_, __LINE__), lhs, expr)
#define SG_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

// Returns InvalidArgument with the message when `cond` is false.
#define SG_CHECK_ARG(cond, ...)                                             \
  do {                                                                      \
    if (!(cond)) return ::absl::InvalidArgumentError(absl::StrCat(__VA_ARGS__)); \
  } while (0)

namespace sg {

// Builds the status for a failed library call: "<library> error <code> (<text>) in `<call>` at
// file:line". Used by the macros below; `code` is the library's own error code.
absl::Status LibraryError(absl::StatusCode status_code, const char* library, long long code,
                          const char* text, const char* call, const char* file, int line);

}  // namespace sg

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#define SG_CUDA_RETURN_IF_ERROR(call)                                                 \
  do {                                                                                \
    cudaError_t sg_err_ = (call);                                                     \
    if (sg_err_ != cudaSuccess)                                                       \
      return ::sg::LibraryError(absl::StatusCode::kInternal, "CUDA", sg_err_,         \
                                cudaGetErrorString(sg_err_), #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: reports launch-configuration errors without synchronizing.
#define SG_CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name) \
  SG_CUDA_RETURN_IF_ERROR(cudaGetLastError() /* launch of kernel_name */)
#endif

#endif  // SGTRAIN_KERNELS_CORE_STATUS_H_
