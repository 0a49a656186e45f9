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
#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/autotune/tuning_table.h"

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

// One poll of the energy counter: host seconds (from any origin) and the counter's millijoules.
struct CounterReading {
  double seconds = 0;
  uint64_t millijoules = 0;
};

// The mean power between two updates of the counter. The driver updates it only every ~100 ms
// (benchmarks/README.md), so a window read at arbitrary ends is off by up to one update at each;
// between the first and the last update seen while polling, it is off only by the poll period.
struct EdgePower {
  double watts = 0;
  double seconds = 0;  // between the first and the last update
  int updates = 0;     // counter changes seen, the first included
  double sm_clock_median_mhz = 0;
};

// From polls in time order: the readings where the counter changed (the first poll is a baseline,
// not an update) and the power between the first and the last of them. FailedPrecondition naming
// the counts when fewer than `min_updates` (>= 2) changes were seen: the window was too short.
absl::StatusOr<EdgePower> PowerBetweenUpdates(const std::vector<CounterReading>& polls, int min_updates = 3);

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

  // The power while `busy` runs (it must keep the GPU busy and return when done, for at least a
  // few of the counter's update periods): the counter polled every `poll` by a thread from before
  // `busy` starts until it returns, then PowerBetweenUpdates, with the SM clock's median over the
  // same time. `busy`'s error is returned as is. FailedPrecondition while started.
  absl::StatusOr<EdgePower> PowerWhile(const std::function<absl::Status()>& busy,
                                       absl::Duration poll = absl::Milliseconds(1));

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

// Ranks GEMM algorithms (any autotune::CostMeter client) by joules a call at the GPU's power
// limit, where a training step's time follows its energy: each candidate runs back to back for
// `settle` (the power limiter's clock settles), then for `window` under PowerWhile; a call's joules
// are the window's power times the call's time in it. Install with Tuner::set_meter.
//   auto meter = EnergyCostMeter::Open(*CudaDevicePciBusId(0), absl::Milliseconds(1000));
//   kernels::autotune::Tuner::Global().set_meter(*std::move(meter));
class EnergyCostMeter : public kernels::autotune::CostMeter {
 public:
  // Errors as GpuEnergyMeter::Open; InvalidArgument for a window under 300 ms (three counter
  // updates) or a negative settle time. `log`, if given, gets one line per candidate measured.
  static absl::StatusOr<std::unique_ptr<EnergyCostMeter>> Open(const std::string& pci_bus_id, absl::Duration window,
                                                               absl::Duration settle = absl::Milliseconds(300),
                                                               std::ostream* log = nullptr);
  std::string unit() const override { return "J"; }
  absl::StatusOr<double> CostPerCall(const std::function<absl::StatusOr<double>(int64_t calls)>& run,
                                     double us_per_call) override;

 private:
  EnergyCostMeter(std::unique_ptr<GpuEnergyMeter> meter, absl::Duration window, absl::Duration settle, std::ostream* log)
      : meter_(std::move(meter)), window_(window), settle_(settle), log_(log) {}
  std::unique_ptr<GpuEnergyMeter> meter_;
  absl::Duration window_, settle_;
  std::ostream* log_;
};

}  // namespace sg::benchmarks

#endif  // SGTRAIN_BENCHMARKS_GPU_ENERGY_H_
