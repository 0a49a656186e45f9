#include "compiler/input_staging.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::compiler {

absl::StatusOr<InputStaging> InputStaging::Create(Device device, const std::map<std::string, TensorView>& inputs) {
  InputStaging s;
#ifdef SG_WITH_CUDA
  if (device.is_cuda()) {
    for (const auto& [name, dst] : inputs) {
      Slot& slot = s.slots_[name];
      for (int k = 0; k < 2; ++k) {
        void* p = nullptr;
        SG_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, size_t(std::max<int64_t>(dst.nbytes(), 1)), cudaHostAllocDefault));
        slot.pinned[k] = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
        SG_ASSIGN_OR_RETURN(Event e, Event::Create(device));
        slot.done[k] = std::make_unique<Event>(std::move(e));
      }
    }
  }
#endif
  return s;
}

absl::Status InputStaging::Stage(const std::string& name, const TensorView& src, const TensorView& dst,
                                 const Stream& stream) {
  auto slot_it = slots_.find(name);
  if (slot_it == slots_.end() || !src.device().is_cpu()) return CopyTensor(src, dst, stream);
  if (src.dtype() != dst.dtype() || src.numel() != dst.numel() || !src.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("InputStaging '", name, "': expected ", dst.ToString(),
                                                   " (contiguous), found ", src.ToString()));
  }
  Slot& slot = slot_it->second;
  const int k = slot.next;
  slot.next ^= 1;
  if (slot.used[k]) SG_RETURN_IF_ERROR(slot.done[k]->Synchronize());
  std::memcpy(slot.pinned[k].get(), src.raw(), size_t(src.nbytes()));
#ifdef SG_WITH_CUDA
  // Not CopyTensor: it synchronizes the stream after any copy with a host side (pageable memory).
  // The pinned buffer is not refilled before done[k] has passed, so the copy may stay queued.
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.raw(), slot.pinned[k].get(), size_t(src.nbytes()),
                                          cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream.native())));
#endif
  SG_RETURN_IF_ERROR(slot.done[k]->Record(stream));
  slot.used[k] = true;
  return absl::OkStatus();
}

}  // namespace sg::compiler
