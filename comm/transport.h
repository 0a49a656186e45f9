// The point-to-point transport interface that the process group's algorithms are written against:
// tagged, non-blocking send and receive of contiguous bytes between ranks, plus progress. Each
// backend lives in its own file (ucx_transport.h for host memory, nccl_transport.h for device
// memory) and is created connected, with addresses exchanged through the rendezvous store.
//
//   SG_ASSIGN_OR_RETURN(auto t, UcxTransport::Create(store, "world", rank, world_size, deadline));
//   SG_ASSIGN_OR_RETURN(auto send, t->ISend(peer, /*tag=*/7, buf, bytes));
//   SG_RETURN_IF_ERROR(send->Wait(deadline));
//
// Matching: a receive from `peer` with tag T matches that peer's sends with tag T, in the order they
// were sent. Tags are below 2^kTransportTagBits. Transports are not thread-safe: one thread issues,
// tests and waits (the process group's calling thread).
#ifndef SGTRAIN_COMM_TRANSPORT_H_
#define SGTRAIN_COMM_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/core/device.h"
#include "kernels/core/stream.h"

namespace sg::comm {

inline constexpr int kTransportTagBits = 48;
inline constexpr uint64_t kMaxTransportTag = (uint64_t(1) << kTransportTagBits) - 1;

// One pending send or receive. Destroying a request that has not completed cancels it.
class TransportRequest {
 public:
  virtual ~TransportRequest() = default;
  // Advances the transport and reports: true when the operation is done, false while pending, an
  // error when it failed (peer gone, message of the wrong size, cancelled).
  virtual absl::StatusOr<bool> Test() = 0;
  // Polls Test() until done; DeadlineExceeded when the deadline passes first (the request stays
  // pending and may be waited on again or destroyed).
  absl::Status Wait(absl::Time deadline);
  // "send 1024 B to rank 3 tag 0x12": for error messages.
  virtual std::string Describe() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // "ucx", "nccl".
  virtual absl::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where the buffers it moves live: Device::Cpu() for UCX, the CUDA device for NCCL.
  virtual Device device() const = 0;

  // Starts sending `bytes` from `data` to `peer`. `data` must stay valid until the request is done.
  virtual absl::StatusOr<std::unique_ptr<TransportRequest>> ISend(int peer, uint64_t tag,
                                                                  const void* data, size_t bytes) = 0;
  // Starts receiving exactly `bytes` into `data` from `peer`; a message of another size is an error.
  virtual absl::StatusOr<std::unique_ptr<TransportRequest>> IRecv(int peer, uint64_t tag, void* data,
                                                                  size_t bytes) = 0;
  // Operations issued between GroupStart and GroupEnd are started together and may progress in any
  // order; NCCL needs this so a rank's send and receive in one ring step do not deadlock. A no-op
  // for transports whose operations are independent already (UCX).
  virtual absl::Status GroupStart() { return absl::OkStatus(); }
  virtual absl::Status GroupEnd() { return absl::OkStatus(); }
  // Makes progress on every pending operation without blocking.
  virtual absl::Status Progress() = 0;
  // Starts every operation the transport is holding back. A device transport may batch operations
  // posted outside a group and start them together at the first Flush, Test/Wait, Progress or
  // GroupStart (NCCL: a receive started alone would block the same stream's later send to that
  // peer). Callers that order a stream after the transport's work call this first.
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // For device transports, the communication stream their operations run on (requests complete
  // when that stream's work does); nullptr for host transports, whose requests complete on the host.
  virtual const Stream* stream() const { return nullptr; }
  // Device transports: drops pending work so that kernels waiting on a dead peer return and the
  // streams drain (NCCL: ncclCommAbort); later calls fail with FailedPrecondition and never touch
  // the library again. Returns within about 2 s whatever the library does: true when the teardown
  // finished, false when it goes on in the background (NCCL >= 2.26 does not return from an abort
  // while a CUDA graph that captured the communicator's work still exists). Until it finishes,
  // device work that used the transport may still run: its buffers must not be reused. Safe to
  // call again (it then waits up to 2 s more). Host transports: nothing, true.
  virtual bool Abort() { return true; }
  // After Abort: waits until its teardown finished or `deadline` passed; true when it finished.
  // True when nothing was torn down.
  virtual bool WaitAborted(absl::Time deadline) {
    (void)deadline;
    return true;
  }
};

// Checks peer and tag against the transport; the error names the operation.
absl::Status CheckPeerAndTag(const Transport& t, absl::string_view op, int peer, uint64_t tag);

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_TRANSPORT_H_
