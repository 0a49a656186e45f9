// Device memory allocators. Every benchmark's memory figure is PeakBytes() of the CUDA allocator.
//
//   SG_ASSIGN_OR_RETURN(sg::Allocator* a, sg::AllocatorFor(sg::Device::Cuda(0)));
//   SG_ASSIGN_OR_RETURN(void* p, a->Allocate(1 << 20));
//   a->Free(p);  // back to the cache; a->PeakBytes() still counts it
#ifndef SGTRAIN_KERNELS_CORE_ALLOCATOR_H_
#define SGTRAIN_KERNELS_CORE_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/device.h"

namespace sg {

class Allocator {
 public:
  virtual ~Allocator() = default;

  // Returns `bytes` of memory aligned to at least 256 bytes (nullptr for 0 bytes).
  // ResourceExhausted when the device is out of memory, naming the size and the bytes in use.
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  // Returns memory from Allocate. Device work using it must be ordered before its next reuse: the
  // caching allocator hands blocks back out in stream order of a single compute stream.
  virtual void Free(void* ptr) = 0;

  virtual Device device() const = 0;
  // Bytes handed out and not yet freed, and the highest value it reached since ResetPeak().
  virtual int64_t CurrentBytes() const = 0;
  virtual int64_t PeakBytes() const = 0;
  // Bytes obtained from the device (in use plus cached).
  virtual int64_t ReservedBytes() const = 0;
  virtual void ResetPeak() = 0;
  // Returns cached, unused blocks to the device.
  virtual void ReleaseCache() = 0;

  // CUDA graph capture: kernels captured in a graph keep using the addresses they were given, at
  // every replay, even after their scratch is "freed". Blocks freed between BeginHoldingFrees()
  // and EndHoldingFrees() may be reused inside the capture (stream order holds there), and the ones
  // still free at the end are held (counted in use, never handed out again) until ReleaseHeld(),
  // when the graph is destroyed. No cudaMalloc may happen during a capture: warm up eagerly first.
  virtual void BeginHoldingFrees() {}
  virtual std::vector<void*> EndHoldingFrees() { return {}; }
  virtual void ReleaseHeld(const std::vector<void*>& blocks) {
    for (void* p : blocks) Free(p);
  }
};

// The process-wide allocator for a device: CPU (64-byte aligned heap) or a caching CUDA allocator
// per ordinal. FailedPrecondition for a CUDA device when CUDA is unavailable.
absl::StatusOr<Allocator*> AllocatorFor(Device device);

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_ALLOCATOR_H_
