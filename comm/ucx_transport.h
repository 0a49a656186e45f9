// UCX transport for host memory: one ucp worker per process, one endpoint per peer (itself included),
// created from worker addresses exchanged through the rendezvous store; tagged non-blocking send and
// receive. Works on CPU-only machines over shared memory and TCP.
//
//   SG_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> t,
//                       UcxTransport::Create(store, "world", rank, world_size, deadline));
//   SG_ASSIGN_OR_RETURN(auto r, t->IRecv(peer, tag, buf, bytes));
//   SG_RETURN_IF_ERROR(r->Wait(deadline));
//
// Transports: UCX's own selection, narrowed by UCX_TLS or, for this transport only, SG_UCX_TLS.
// Endpoints use peer error handling, so a peer that dies turns pending operations into errors.
#ifndef SGTRAIN_COMM_UCX_TRANSPORT_H_
#define SGTRAIN_COMM_UCX_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/store.h"
#include "comm/transport.h"

namespace sg::comm {

class UcxTransport : public Transport {
 public:
  // Creates the worker, publishes its address under "<prefix>/ucx/<rank>", waits for every peer's
  // and connects to each. Every rank of the group calls this with the same prefix.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(StoreClient& store,
                                                              const std::string& prefix, int rank,
                                                              int world_size, absl::Time deadline);
  ~UcxTransport() override;

  absl::string_view name() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return Device::Cpu(); }
  absl::StatusOr<std::unique_ptr<TransportRequest>> ISend(int peer, uint64_t tag, const void* data,
                                                          size_t bytes) override;
  absl::StatusOr<std::unique_ptr<TransportRequest>> IRecv(int peer, uint64_t tag, void* data,
                                                          size_t bytes) override;
  absl::Status Progress() override;

  // UCX's description of the endpoint to `peer` (the lanes and transports it selected): for logs.
  std::string Describe(int peer) const;

  struct Impl;  // ucp handles; public so the request type in the .cc can reach it

 private:
  UcxTransport() = default;
  int rank_ = 0;
  int world_size_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_UCX_TRANSPORT_H_
