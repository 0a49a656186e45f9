// Where a tensor lives: the CPU, or a CUDA device by ordinal.
//
//   sg::Device d = sg::CudaAvailable() ? sg::Device::Cuda(0) : sg::Device::Cpu();
//   std::cout << d.ToString();  // "cpu" or "cuda:0"
#ifndef SGTRAIN_KERNELS_CORE_DEVICE_H_
#define SGTRAIN_KERNELS_CORE_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sg {

struct Device {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;

  static constexpr Device Cpu() { return Device{Kind::kCpu, 0}; }
  static constexpr Device Cuda(int ordinal) { return Device{Kind::kCuda, ordinal}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && (a.kind == Kind::kCpu || a.ordinal == b.ordinal);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Number of usable CUDA devices: 0 when built without CUDA, or when the driver finds none.
int CudaDeviceCount();

// The global memory of CUDA device `ordinal` in bytes (its total, not what is free).
// FailedPrecondition in a build without CUDA or without a device; InvalidArgument for an ordinal
// out of range.
absl::StatusOr<int64_t> CudaDeviceMemoryBytes(int ordinal);

// The PCI bus id of CUDA device `ordinal` ("0000:19:00.0"), which names the same GPU to NVML and
// nvidia-smi whatever CUDA_VISIBLE_DEVICES renumbers. Errors as CudaDeviceMemoryBytes's.
absl::StatusOr<std::string> CudaDevicePciBusId(int ordinal);

// True when at least one CUDA device can be used.
inline bool CudaAvailable() { return CudaDeviceCount() > 0; }

// Why CUDA is not available ("built without CUDA", "no CUDA device: <driver's message>"), or "".
std::string CudaUnavailableReason();

// OK when the current CUDA device is sm_90 (Hopper: wgmma, TMA), for kernels built only for
// sm_90a; otherwise Unimplemented "<what>: needs an sm_90 GPU, found compute capability X.Y" (so
// the caller can fall back), and FailedPrecondition in a build without CUDA. The capability is
// read once per device.
absl::Status RequireSm90(const std::string& what);

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_DEVICE_H_
