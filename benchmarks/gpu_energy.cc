#include "benchmarks/gpu_energy.h"

#include <dlfcn.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sg::benchmarks {

// The few NVML entry points used, resolved from the driver's library (declared here: the CUDA
// toolkit on the build machine carries no nvml.h). nvmlReturn_t is an int enum, 0 = success;
// nvmlDevice_t an opaque pointer; clock type 1 = NVML_CLOCK_SM.
struct GpuEnergyMeter::Nvml {
  using Ret = int;
  Ret (*init)() = nullptr;
  const char* (*error_string)(Ret) = nullptr;
  Ret (*handle_by_pci)(const char*, void**) = nullptr;
  Ret (*energy)(void*, unsigned long long*) = nullptr;  // millijoules since the driver loaded
  Ret (*clock)(void*, int, unsigned*) = nullptr;        // MHz
  Ret (*temperature)(void*, int, unsigned*) = nullptr;  // deg C; sensor 0 = NVML_TEMPERATURE_GPU; optional

  std::string Error(Ret r) const { return absl::StrCat(error_string != nullptr ? error_string(r) : "error", " (", r, ")"); }
};

void SummarizeClocks(std::vector<unsigned> mhz, GpuEnergyReading* reading) {
  reading->samples = int(mhz.size());
  if (mhz.empty()) {
    reading->sm_clock_min_mhz = reading->sm_clock_median_mhz = reading->sm_clock_max_mhz = 0;
    return;
  }
  std::sort(mhz.begin(), mhz.end());
  reading->sm_clock_min_mhz = mhz.front();
  reading->sm_clock_median_mhz = mhz[mhz.size() / 2];
  reading->sm_clock_max_mhz = mhz.back();
}

namespace {

constexpr int kClockSm = 1;
constexpr int kTemperatureGpu = 0;

template <typename F>
absl::Status Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) return absl::UnavailableError(absl::StrCat("libnvidia-ml.so.1 has no symbol ", name));
  return absl::OkStatus();
}

// libnvidia-ml.so.1 opened and initialized once per process (never closed: NVML stays usable for
// every meter).
absl::StatusOr<std::shared_ptr<const GpuEnergyMeter::Nvml>> LoadNvml() {
  static const absl::StatusOr<std::shared_ptr<const GpuEnergyMeter::Nvml>>* loaded =
      new absl::StatusOr<std::shared_ptr<const GpuEnergyMeter::Nvml>>(
          []() -> absl::StatusOr<std::shared_ptr<const GpuEnergyMeter::Nvml>> {
            void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
            if (lib == nullptr) {
              const char* why = dlerror();
              return absl::UnavailableError(absl::StrCat("cannot open libnvidia-ml.so.1 (the NVIDIA driver's NVML): ",
                                                         why != nullptr ? why : "unknown reason"));
            }
            auto n = std::make_shared<GpuEnergyMeter::Nvml>();
            absl::Status st = Resolve(lib, "nvmlInit_v2", &n->init);
            st.Update(Resolve(lib, "nvmlErrorString", &n->error_string));
            st.Update(Resolve(lib, "nvmlDeviceGetHandleByPciBusId_v2", &n->handle_by_pci));
            st.Update(Resolve(lib, "nvmlDeviceGetTotalEnergyConsumption", &n->energy));
            st.Update(Resolve(lib, "nvmlDeviceGetClockInfo", &n->clock));
            if (!st.ok()) return st;
            // Deprecated in newer NVMLs but still exported; the readings go without it if not.
            n->temperature = reinterpret_cast<decltype(n->temperature)>(dlsym(lib, "nvmlDeviceGetTemperature"));
            if (const int r = n->init(); r != 0) {
              return absl::UnavailableError(absl::StrCat("nvmlInit_v2 failed: ", n->Error(r)));
            }
            return std::shared_ptr<const GpuEnergyMeter::Nvml>(std::move(n));
          }());
  return *loaded;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuEnergyMeter>> GpuEnergyMeter::Open(const std::string& pci_bus_id,
                                                                     absl::Duration sample_period) {
  if (sample_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuEnergyMeter: sample period > 0, found ", absl::FormatDuration(sample_period)));
  }
  absl::StatusOr<std::shared_ptr<const Nvml>> nvml = LoadNvml();
  if (!nvml.ok()) return nvml.status();
  void* device = nullptr;
  if (const int r = (*nvml)->handle_by_pci(pci_bus_id.c_str(), &device); r != 0) {
    return absl::NotFoundError(absl::StrCat("NVML knows no GPU at PCI bus id '", pci_bus_id, "': ", (*nvml)->Error(r)));
  }
  std::unique_ptr<GpuEnergyMeter> m(new GpuEnergyMeter(*std::move(nvml), device, sample_period));
  // A GPU without the energy counter (before Volta) is refused here, not at the first reading.
  if (absl::StatusOr<uint64_t> e = m->EnergyMillijoules(); !e.ok()) return e.status();
  return m;
}

GpuEnergyMeter::~GpuEnergyMeter() {
  if (started_) (void)Stop();
}

absl::StatusOr<uint64_t> GpuEnergyMeter::EnergyMillijoules() const {
  unsigned long long mj = 0;
  if (const int r = nvml_->energy(device_, &mj); r != 0) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetTotalEnergyConsumption: ", nvml_->Error(r)));
  }
  return uint64_t(mj);
}

void GpuEnergyMeter::Sample() {
  absl::MutexLock l(&mu_);
  while (true) {
    // Wakes at once on Stop, otherwise after one period.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
    if (stop_) return;
    unsigned mhz = 0;
    if (nvml_->clock(device_, kClockSm, &mhz) == 0) clocks_.push_back(mhz);
    unsigned c = 0;
    if (nvml_->temperature != nullptr && nvml_->temperature(device_, kTemperatureGpu, &c) == 0) temperatures_.push_back(c);
  }
}

absl::Status GpuEnergyMeter::Start() {
  if (started_) return absl::FailedPreconditionError("GpuEnergyMeter::Start: already started");
  absl::StatusOr<uint64_t> e = EnergyMillijoules();
  if (!e.ok()) return e.status();
  start_mj_ = *e;
  start_time_ = absl::Now();
  {
    absl::MutexLock l(&mu_);
    stop_ = false;
    clocks_.clear();
    temperatures_.clear();
  }
  sampler_ = std::thread([this] { Sample(); });
  started_ = true;
  return absl::OkStatus();
}

absl::StatusOr<GpuEnergyReading> GpuEnergyMeter::Stop() {
  if (!started_) return absl::FailedPreconditionError("GpuEnergyMeter::Stop: not started");
  absl::StatusOr<uint64_t> e = EnergyMillijoules();
  const absl::Time end = absl::Now();
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  sampler_.join();
  started_ = false;
  if (!e.ok()) return e.status();
  GpuEnergyReading r;
  r.seconds = absl::ToDoubleSeconds(end - start_time_);
  r.joules = double(*e - start_mj_) / 1e3;
  r.mean_watts = r.seconds > 0 ? r.joules / r.seconds : 0;
  absl::MutexLock l(&mu_);  // the sampler has ended: only for the annotation
  SummarizeClocks(std::move(clocks_), &r);
  clocks_.clear();
  if (!temperatures_.empty()) {
    const auto [lo, hi] = std::minmax_element(temperatures_.begin(), temperatures_.end());
    r.temperature_min_c = int(*lo);
    r.temperature_max_c = int(*hi);
  }
  temperatures_.clear();
  return r;
}

}  // namespace sg::benchmarks
