// The energy one GPU draws over a window, and its SM clock meanwhile, read through NVML. At the
// H200's 700 W limit a training step's tokens/s follows its energy per token (benchmarks/README.md,
// "Power"), so the step benchmark reports joules per token beside tokens/s.
//
//   SG_ASSIGN_OR_RETURN(auto meter, GpuEnergyMeter::Open(*CudaDevicePciBusId(0)));
//   SG_RETURN_IF_ERROR(meter->Start());
//   ...  // the work, synchronized at both ends
//   SG_ASSIGN_OR_RETURN(GpuEnergyReading r, meter->Stop());   // r.joules, r.sm_clock_median_mhz
//
// NVML (libnvidia-ml.so.1, the driver's) is opened at run time, so nothing links against it and a
// machine without the driver gets Unavailable naming the library. Energy is the driver's
// cumulative counter (millijoules, Volta and later) read at Start and Stop; the SM clock and the
// temperature are sampled every `sample_period` by a thread between them.
#ifndef SGTRAIN_BENCHMARKS_GPU_ENERGY_H_
#define SGTRAIN_BENCHMARKS_GPU_ENERGY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sg::benchmarks {

struct GpuEnergyReading {
  double seconds = 0;  // host wall time between Start and Stop
  double joules = 0;   // the energy counter's difference
  double mean_watts = 0;
  int samples = 0;  // SM clock samples taken (0 when the window was shorter than one period)
  double sm_clock_min_mhz = 0, sm_clock_median_mhz = 0, sm_clock_max_mhz = 0;
  // The GPU's temperature (deg C) over the samples: leakage power grows with it, so a hot GPU at the
  // power limit clocks lower for the same work. 0 without samples or without NVML's reading.
  int temperature_min_c = 0, temperature_max_c = 0;
};

// The reading's clock fields from its samples (MHz, any order): min, median (the upper middle of
// an even count) and max; all 0 for no samples.
void SummarizeClocks(std::vector<unsigned> mhz, GpuEnergyReading* reading);

class GpuEnergyMeter {
 public:
  // The GPU at `pci_bus_id` (kernels/core/device.h: CudaDevicePciBusId). Unavailable without
  // libnvidia-ml.so.1 or a symbol of it; NotFound / the NVML error for a bus id NVML does not know.
  static absl::StatusOr<std::unique_ptr<GpuEnergyMeter>> Open(const std::string& pci_bus_id,
                                                              absl::Duration sample_period = absl::Milliseconds(50));
  ~GpuEnergyMeter();
  GpuEnergyMeter(const GpuEnergyMeter&) = delete;
  GpuEnergyMeter& operator=(const GpuEnergyMeter&) = delete;

  // Reads the counter and starts sampling. FailedPrecondition while already started.
  absl::Status Start();
  // Stops sampling and reads the counter. FailedPrecondition when not started.
  absl::StatusOr<GpuEnergyReading> Stop();

  struct Nvml;  // NVML's entry points (gpu_energy.cc)

 private:
  GpuEnergyMeter(std::shared_ptr<const Nvml> nvml, void* device, absl::Duration period)
      : nvml_(std::move(nvml)), device_(device), period_(period) {}
  absl::StatusOr<uint64_t> EnergyMillijoules() const;
  void Sample();

  std::shared_ptr<const Nvml> nvml_;
  void* device_;  // nvmlDevice_t
  absl::Duration period_;
  bool started_ = false;
  uint64_t start_mj_ = 0;
  absl::Time start_time_;
  std::thread sampler_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<unsigned> clocks_ ABSL_GUARDED_BY(mu_);
  std::vector<unsigned> temperatures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sg::benchmarks

#endif  // SGTRAIN_BENCHMARKS_GPU_ENERGY_H_
