#include "kernels/core/stream.h"

#include <utility>

#include "kernels/core/status.h"

namespace sg {

#ifdef SG_WITH_CUDA
namespace {
absl::Status SetDevice(Device d) {
  SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(d.ordinal));
  return absl::OkStatus();
}
}  // namespace
#endif

absl::StatusOr<Stream> Stream::Create(Device device, int priority) {
  if (device.is_cpu()) return Cpu();
#ifdef SG_WITH_CUDA
  SG_RETURN_IF_ERROR(SetDevice(device));
  cudaStream_t s;
  SG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return Stream(device, s, true);
#else
  return absl::FailedPreconditionError("Stream::Create(cuda): built without CUDA");
#endif
}

Stream::Stream(Stream&& o) noexcept
    : device_(o.device_), stream_(std::exchange(o.stream_, nullptr)), owned_(std::exchange(o.owned_, false)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    this->~Stream();
    device_ = o.device_;
    stream_ = std::exchange(o.stream_, nullptr);
    owned_ = std::exchange(o.owned_, false);
  }
  return *this;
}

Stream::~Stream() {
#ifdef SG_WITH_CUDA
  if (owned_ && stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

absl::Status Stream::Synchronize() const {
  if (device_.is_cpu()) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
  return absl::OkStatus();
}

absl::StatusOr<Event> Event::Create(Device device, bool timing) {
  if (device.is_cpu()) return Event(device, nullptr);
#ifdef SG_WITH_CUDA
  SG_RETURN_IF_ERROR(SetDevice(device));
  cudaEvent_t e;
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(device, e);
#else
  return absl::FailedPreconditionError("Event::Create(cuda): built without CUDA");
#endif
}

Event::Event(Event&& o) noexcept : device_(o.device_), event_(std::exchange(o.event_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    this->~Event();
    device_ = o.device_;
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
#ifdef SG_WITH_CUDA
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

absl::Status Event::Record(const Stream& stream) {
  if (event_ == nullptr) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event_),
                                          static_cast<cudaStream_t>(stream.native())));
#endif
  return absl::OkStatus();
}

absl::Status Event::Block(const Stream& stream) const {
  if (event_ == nullptr) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()),
                                              static_cast<cudaEvent_t>(event_), 0));
#endif
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  if (event_ == nullptr) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
#endif
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Query() const {
  if (event_ == nullptr) return true;
#ifdef SG_WITH_CUDA
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    return false;
  }
  SG_CUDA_RETURN_IF_ERROR(err);
#endif
  return true;
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  if (event_ == nullptr || start.event_ == nullptr) {
    return absl::FailedPreconditionError("ElapsedMsSince: CPU events carry no time");
  }
  float ms = 0;
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                               static_cast<cudaEvent_t>(event_)));
#endif
  return ms;
}

}  // namespace sg
