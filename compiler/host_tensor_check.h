// The check every distributed step's Write and Read make of a caller's host tensor for a whole
// (unsharded) parameter or state: f32 with the full tensor's element count, or InvalidArgument
// naming the tensor, what was expected and what was found. Private to //compiler.
#ifndef SGTRAIN_COMPILER_HOST_TENSOR_CHECK_H_
#define SGTRAIN_COMPILER_HOST_TENSOR_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

inline absl::Status CheckFullF32(const std::string& name, int64_t numel, const TensorView& host) {
  if (host.dtype() != DType::kF32 || host.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "': expected f32 with ", numel,
                                                   " elements (the full tensor), found ", host.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_HOST_TENSOR_CHECK_H_
