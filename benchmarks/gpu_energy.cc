#include "benchmarks/gpu_energy.h"

#include <dlfcn.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/status.h"

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

absl::StatusOr<EdgePower> PowerBetweenUpdates(const std::vector<CounterReading>& polls, int min_updates) {
  if (min_updates < 2) {
    return absl::InvalidArgumentError(absl::StrCat("PowerBetweenUpdates: min_updates >= 2, found ", min_updates));
  }
  const CounterReading* first = nullptr;
  const CounterReading* last = nullptr;
  int updates = 0;
  for (size_t i = 1; i < polls.size(); ++i) {
    if (polls[i].millijoules == polls[i - 1].millijoules) continue;
    if (first == nullptr) first = &polls[i];
    last = &polls[i];
    ++updates;
  }
  if (updates < min_updates || last->seconds <= first->seconds) {
    return absl::FailedPreconditionError(
        absl::StrCat("energy counter: expected >= ", min_updates, " updates in the window, found ", updates, " in ",
                     polls.size(), " polls over ",
                     polls.empty() ? 0.0 : polls.back().seconds - polls.front().seconds, " s"));
  }
  EdgePower p;
  p.updates = updates;
  p.seconds = last->seconds - first->seconds;
  p.watts = double(last->millijoules - first->millijoules) / 1e3 / p.seconds;
  return p;
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

absl::StatusOr<EdgePower> GpuEnergyMeter::PowerWhile(const std::function<absl::Status()>& busy, absl::Duration poll) {
  if (started_) return absl::FailedPreconditionError("GpuEnergyMeter::PowerWhile: the meter is started");
  std::vector<CounterReading> polls;
  absl::Status poll_error;
  absl::Mutex mu;
  bool done = false;
  const absl::Time origin = absl::Now();
  SG_RETURN_IF_ERROR(Start());
  std::thread poller([&] {
    absl::MutexLock l(&mu);
    while (true) {
      absl::StatusOr<uint64_t> mj = EnergyMillijoules();
      if (!mj.ok()) {
        poll_error = mj.status();
        return;
      }
      polls.push_back({absl::ToDoubleSeconds(absl::Now() - origin), *mj});
      if (mu.AwaitWithTimeout(absl::Condition(&done), poll)) return;
    }
  });
  const absl::Status work = busy();
  {
    absl::MutexLock l(&mu);
    done = true;
  }
  poller.join();
  absl::StatusOr<GpuEnergyReading> window = Stop();
  SG_RETURN_IF_ERROR(work);
  SG_RETURN_IF_ERROR(poll_error);
  SG_RETURN_IF_ERROR(window.status());
  SG_ASSIGN_OR_RETURN(EdgePower p, PowerBetweenUpdates(polls));
  p.sm_clock_median_mhz = window->sm_clock_median_mhz;
  return p;
}

absl::StatusOr<std::unique_ptr<EnergyCostMeter>> EnergyCostMeter::Open(const std::string& pci_bus_id,
                                                                       absl::Duration window, absl::Duration settle,
                                                                       std::ostream* log) {
  if (window < absl::Milliseconds(300)) {
    return absl::InvalidArgumentError(absl::StrCat("EnergyCostMeter: expected a window >= 300 ms (three counter updates), found ",
                                                   absl::FormatDuration(window)));
  }
  if (settle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnergyCostMeter: expected a settle time >= 0, found ", absl::FormatDuration(settle)));
  }
  SG_ASSIGN_OR_RETURN(std::unique_ptr<GpuEnergyMeter> m, GpuEnergyMeter::Open(pci_bus_id, absl::Milliseconds(20)));
  return std::unique_ptr<EnergyCostMeter>(new EnergyCostMeter(std::move(m), window, settle, log));
}

absl::StatusOr<double> EnergyCostMeter::CostPerCall(const std::function<absl::StatusOr<double>(int64_t calls)>& run,
                                                    double us_per_call) {
  if (!(us_per_call > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("EnergyCostMeter: expected a time per call > 0 us, found ", us_per_call));
  }
  auto calls_for = [&](absl::Duration d) {
    return std::max<int64_t>(1, int64_t(absl::ToDoubleMicroseconds(d) / us_per_call));
  };
  if (settle_ > absl::ZeroDuration()) SG_RETURN_IF_ERROR(run(calls_for(settle_)).status());
  const int64_t calls = calls_for(window_);
  double ms = 0;
  SG_ASSIGN_OR_RETURN(EdgePower p, meter_->PowerWhile([&]() -> absl::Status {
    SG_ASSIGN_OR_RETURN(ms, run(calls));
    return absl::OkStatus();
  }));
  const double sustained_us = ms * 1e3 / double(calls);
  const double joules = p.watts * sustained_us * 1e-6;
  if (log_ != nullptr) {
    *log_ << absl::StrFormat("energy tune: %.1f us a call (%.1f us back to back over %d calls, %.0f MHz), %.0f W: %.4f J\n",
                             us_per_call, sustained_us, calls, p.sm_clock_median_mhz, p.watts, joules);
  }
  return joules;
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
