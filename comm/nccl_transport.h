// NCCL transport for device memory: a communicator built from a unique id that rank 0 publishes in
// the rendezvous store; ncclSend / ncclRecv inside groups on this transport's own communication
// stream. Callers order it against compute with events (record on compute, Block the comm stream),
// never with device synchronization. Built only with SG_WITH_NCCL; Create() says so otherwise.
//
//   SG_ASSIGN_OR_RETURN(auto t, NcclTransport::Create(store, "world", rank, n, Device::Cuda(rank), dl));
//   SG_RETURN_IF_ERROR(t->GroupStart());
//   SG_ASSIGN_OR_RETURN(auto s, t->ISend(next, 0, src, bytes));
//   SG_ASSIGN_OR_RETURN(auto r, t->IRecv(prev, 0, dst, bytes));
//   SG_RETURN_IF_ERROR(t->GroupEnd());
//   SG_RETURN_IF_ERROR(r->Wait(deadline));   // polls the stream's event; aborts nothing by itself
//
// NCCL point-to-point has no tags: operations between a pair of ranks match in issue order, so the
// tag is only checked for range. A send or receive posted outside a group is held and started with
// the others held since, as one NCCL group, at the first Test/Wait, Flush, Progress or GroupStart:
// NCCL runs a lone receive as a kernel that blocks the stream until the peer's data arrives, so
// "Recv from peer; Send to peer; Wait both" issued as two launches would deadlock both ranks. The
// communicator is non-blocking (config.blocking = 0): init and every call are polled with a
// deadline, and Abort() tears it down so no rank hangs in NCCL. Teardown (Abort, the destructor)
// never blocks the caller for long: NCCL's own may wait forever (for CUDA graphs that captured the
// communicator's work to be destroyed), so it runs on a background thread with a deadline, and a
// communicator whose teardown does not finish is leaked.
#ifndef SGTRAIN_COMM_NCCL_TRANSPORT_H_
#define SGTRAIN_COMM_NCCL_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/store.h"
#include "comm/transport.h"
#include "kernels/core/stream.h"

namespace sg::comm {

class NcclTransport : public Transport {
 public:
  // Every rank of the group calls this with the same prefix; FailedPrecondition without NCCL/CUDA.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(StoreClient& store,
                                                               const std::string& prefix, int rank,
                                                               int world_size, Device device,
                                                               absl::Time deadline);
  ~NcclTransport() override;

  absl::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return device_; }
  absl::StatusOr<std::unique_ptr<TransportRequest>> ISend(int peer, uint64_t tag, const void* data,
                                                          size_t bytes) override;
  absl::StatusOr<std::unique_ptr<TransportRequest>> IRecv(int peer, uint64_t tag, void* data,
                                                          size_t bytes) override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status Progress() override;
  absl::Status Flush() override;
  const Stream* stream() const override;

  // The ncclComm_t (as void*, so this header needs no nccl.h), for NCCL's native collectives;
  // FailedPrecondition once the transport was aborted (the communicator is being torn down).
  absl::StatusOr<void*> comm() const;
  // Waits until NCCL reports the last call finished being issued (non-blocking communicators may
  // return ncclInProgress), or fails with NCCL's asynchronous error.
  absl::Status WaitIssued(absl::Time deadline, absl::string_view what);
  // Aborts the communicator (transport.h): sets NCCL's abort flag, so kernels waiting on a peer
  // return, and tears the communicator down with ncclCommAbort on a background thread, waiting
  // for it 2 s at most. NCCL 2.26+ finishes that teardown only once every CUDA graph that captured
  // this communicator's work has been destroyed (cudaGraphDestroy and cudaGraphExecDestroy).
  // Later calls fail with FailedPrecondition without touching NCCL.
  bool Abort() override;
  bool WaitAborted(absl::Time deadline) override;

  struct Impl;

 private:
  NcclTransport() = default;
  absl::StatusOr<std::unique_ptr<TransportRequest>> Post(bool is_send, int peer, void* data,
                                                         size_t bytes);
  int rank_ = 0;
  int world_size_ = 1;
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_NCCL_TRANSPORT_H_
