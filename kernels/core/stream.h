// Streams and events: the ordering primitives. Kernels take a Stream; communication runs on its own
// stream ordered against compute by Events, never by device synchronization.
//
//   SG_ASSIGN_OR_RETURN(sg::Stream s, sg::Stream::Create(sg::Device::Cuda(0)));
//   SG_ASSIGN_OR_RETURN(sg::Event e, sg::Event::Create(s.device()));
//   SG_RETURN_IF_ERROR(e.Record(s)); SG_RETURN_IF_ERROR(e.Block(comm_stream));
#ifndef SGTRAIN_KERNELS_CORE_STREAM_H_
#define SGTRAIN_KERNELS_CORE_STREAM_H_

#include "absl/status/statusor.h"
#include "kernels/core/device.h"

namespace sg {

// A queue of device work. On the CPU it is a synchronous stand-in: work runs when it is issued, so
// Synchronize() and events are no-ops. Move-only; owns the CUDA stream it created.
class Stream {
 public:
  static Stream Cpu() { return Stream(Device::Cpu(), nullptr, false); }
  // A new non-blocking CUDA stream on `device` (the CPU stand-in for a CPU device).
  static absl::StatusOr<Stream> Create(Device device, int priority = 0);
  // Wraps a stream owned by someone else (e.g. a framework's); not destroyed by this object.
  static Stream Wrap(Device device, void* cuda_stream) { return Stream(device, cuda_stream, false); }

  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  Device device() const { return device_; }
  // The cudaStream_t, or nullptr on the CPU.
  void* native() const { return stream_; }
  // Blocks the host until queued work is done.
  absl::Status Synchronize() const;

 private:
  Stream(Device d, void* s, bool owned) : device_(d), stream_(s), owned_(owned) {}
  Device device_;
  void* stream_ = nullptr;
  bool owned_ = false;
};

// A point in a stream's work: record it on one stream, make another wait for it, or time between two.
class Event {
 public:
  // `timing` events can measure elapsed time; others are cheaper for ordering only.
  static absl::StatusOr<Event> Create(Device device, bool timing = false);
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  absl::Status Record(const Stream& stream);
  // Makes `stream` wait (on the device) until this event's work is done. The host does not block.
  absl::Status Block(const Stream& stream) const;
  // Blocks the host until the recorded work is done.
  absl::Status Synchronize() const;
  // Whether the recorded work is done, without blocking (always true for CPU events).
  absl::StatusOr<bool> Query() const;
  // Milliseconds from `start` to this event; both must be timing events, recorded and complete.
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;

 private:
  Event(Device d, void* e) : device_(d), event_(e) {}
  Device device_;
  void* event_ = nullptr;
};

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_STREAM_H_
