// Batch inputs into a step's static input buffers without stalling the host on pageable memory.
//
//   SG_ASSIGN_OR_RETURN(InputStaging staging, InputStaging::Create(device, {{"tokens", dst}}));
//   SG_RETURN_IF_ERROR(staging.Stage("tokens", host_tokens, dst, stream));   // async H2D, no device sync
//
// A host tensor is copied into one of two pinned host buffers per input (alternating every step),
// then copied to the device asynchronously on `stream`; before a pinned buffer is refilled the host
// waits for the copy issued from it two steps earlier (already done unless the host runs two steps
// ahead of the device: that wait is the back-pressure, not a device synchronization). A tensor
// already on the step's device is copied device-to-device on `stream`. On the CPU, or without
// CUDA, Stage is a plain CopyTensor.
#ifndef SGTRAIN_COMPILER_INPUT_STAGING_H_
#define SGTRAIN_COMPILER_INPUT_STAGING_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

class InputStaging {
 public:
  // `inputs`: the step's device input buffers by name. Allocates 2 pinned buffers per input on a
  // CUDA device (Internal on failure).
  static absl::StatusOr<InputStaging> Create(Device device, const std::map<std::string, TensorView>& inputs);
  InputStaging() = default;
  InputStaging(InputStaging&&) noexcept = default;
  InputStaging& operator=(InputStaging&&) noexcept = default;

  // Copies `src` into `dst` (input `name`'s buffer: same dtype and element count), ordered on
  // `stream`; through the pinned buffers when `name` has them and `src` is on the host, else a
  // plain CopyTensor.
  absl::Status Stage(const std::string& name, const TensorView& src, const TensorView& dst, const Stream& stream);

 private:
  struct Slot {
    std::shared_ptr<void> pinned[2];  // cudaFreeHost on release
    std::unique_ptr<Event> done[2];   // recorded after the copy out of pinned[k]
    bool used[2] = {false, false};
    int next = 0;
  };
  std::map<std::string, Slot> slots_;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_INPUT_STAGING_H_
