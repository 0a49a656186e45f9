#include "comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/process_group_state.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::comm {

namespace {

uint64_t GroupId(const std::string& name) { return std::hash<std::string>{}(name) & 0x7f; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Requests

absl::Status Request::Wait(absl::Time deadline) {
  SG_CHECK_ARG(req_ != nullptr, "Request::Wait on an empty request");
  return req_->Wait(deadline);
}

absl::StatusOr<bool> Request::Test() {
  SG_CHECK_ARG(req_ != nullptr, "Request::Test on an empty request");
  return req_->Test();
}

// ---------------------------------------------------------------------------------------------
// Construction

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(StoreClient* store, Transport* host,
                                                                   Transport* device,
                                                                   std::string name,
                                                                   ProcessGroupOptions options) {
  SG_CHECK_ARG(store != nullptr && host != nullptr, "ProcessGroup::Create: store and host transport ",
               "are required");
  SG_CHECK_ARG(host->device().is_cpu(), "ProcessGroup::Create: host transport '", host->name(),
               "' moves ", host->device().ToString(), " memory, expected cpu");
  if (device != nullptr) {
    SG_CHECK_ARG(device->world_size() == host->world_size() && device->rank() == host->rank(),
                 "ProcessGroup::Create: device transport is rank ", device->rank(), " of ",
                 device->world_size(), ", host transport rank ", host->rank(), " of ",
                 host->world_size());
  }
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->store_ = store;
  pg->host_ = host;
  pg->device_ = device;
  pg->name_ = std::move(name);
  pg->group_id_ = GroupId(pg->name_);
  pg->options_ = options;
  for (int r = 0; r < host->world_size(); ++r) pg->members_.push_back(r);
  pg->rank_ = host->rank();
  pg->device_state_ = std::make_unique<DeviceState>();
  return pg;
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Subgroup(std::vector<int> ranks,
                                                                     std::string name) const {
  SG_CHECK_ARG(!ranks.empty(), "Subgroup '", name, "': expected at least one rank");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  SG_CHECK_ARG(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "Subgroup '", name,
               "': ranks must be distinct, found [", absl::StrJoin(ranks, ","), "]");
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->rank_ = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    SG_CHECK_ARG(ranks[i] >= 0 && ranks[i] < size(), "Subgroup '", name, "': ranks must be in [0, ",
                 size(), "), found ", ranks[i]);
    pg->members_.push_back(members_[size_t(ranks[i])]);
    if (ranks[i] == rank_) pg->rank_ = int(i);
  }
  SG_CHECK_ARG(pg->rank_ >= 0, "Subgroup '", name, "': rank ", rank_, " is not a member of [",
               absl::StrJoin(ranks, ","), "]; only members create a sub-group");
  pg->store_ = store_;
  pg->host_ = host_;
  pg->device_ = device_;
  pg->name_ = name_ + "/" + name;
  pg->group_id_ = GroupId(pg->name_);
  pg->options_ = options_;
  pg->device_state_ = std::make_unique<DeviceState>();
  return pg;
}

// After a device abort whose teardown had not finished, this group's device work (a kernel inside
// a replayed CUDA graph) may still read and write its scratch: the device state (scratch, work
// buffers, reduce stream, events) is leaked on purpose rather than handed back to the allocator,
// which would give the memory to someone else.
ProcessGroup::~ProcessGroup() {
  if (device_abort_unfinished_) (void)device_state_.release();
}

// ---------------------------------------------------------------------------------------------
// Checks, sequence numbers, diagnostics

absl::Status ProcessGroup::CheckTensor(const TensorView& t, absl::string_view op,
                                       absl::string_view what, bool reduce) const {
  SG_CHECK_ARG(t.is_contiguous(), name_, " ", op, ": ", what, " must be contiguous, found ",
               t.ToString());
  SG_CHECK_ARG(t.numel() == 0 || t.raw() != nullptr, name_, " ", op, ": ", what, " has no data");
  if (reduce) {
    SG_CHECK_ARG(IsReducibleDType(t.dtype()), name_, " ", op, ": ", what,
                 " must be f32 or bf16, found ", t.ToString());
  }
  return TransportFor(t, op).status();
}

absl::StatusOr<Transport*> ProcessGroup::TransportFor(const TensorView& t, absl::string_view op) const {
  if (t.device().is_cpu()) return host_;
  if (device_ != nullptr && device_->device() == t.device()) return device_;
  return absl::InvalidArgumentError(absl::StrCat(
      name_, " ", op, ": no transport for a tensor on ", t.device().ToString(), " (host transport: ",
      host_->name(), ", device transport: ",
      device_ ? absl::StrCat(device_->name(), " on ", device_->device().ToString()) : "none", ")"));
}

absl::StatusOr<ProcessGroup::OpState> ProcessGroup::Begin(absl::string_view op,
                                                          absl::Duration timeout) {
  OpState s;
  s.pg = this;
  s.op = std::string(op);
  s.seq = ++seq_;
  s.start = absl::Now();
  s.deadline = s.start + timeout;
  s.next_abort_check = s.start + absl::Milliseconds(100);
  // Device Send/Recv held by the transport start now: a peer may be waiting on them while this
  // rank waits in the collective (e.g. a device Send, then a host Barrier).
  if (device_ != nullptr) {
    absl::Status st = device_->Flush();
    if (!st.ok()) return Fail(s, st);
  }
  if (options_.track_progress) {
    absl::Status st = store_->Set(absl::StrCat(name_, "/progress/", members_[size_t(rank_)]),
                                  absl::StrCat(s.seq, " ", op), s.deadline);
    if (!st.ok()) return Fail(s, st);
  }
  return s;
}

absl::Status ProcessGroup::CheckAbort(const OpState& op) {
  absl::StatusOr<std::string> reason =
      store_->TryGet(name_ + "/abort", absl::Now() + absl::Seconds(2));
  if (reason.ok()) {
    return absl::AbortedError(absl::StrCat(name_, " ", op.op, " #", op.seq, " on rank ",
                                           members_[size_t(rank_)], ": group aborted: ", *reason));
  }
  if (absl::IsNotFound(reason.status())) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "store unreachable while checking for an abort (rank 0 hosts it; did it exit?): ",
      reason.status().message()));
}

absl::Status ProcessGroup::Fail(const OpState& op, const absl::Status& cause) {
  if (absl::IsAborted(cause)) return cause;  // another rank's abort, already fully described
  const int me = members_[size_t(rank_)];
  // Every member's last entered collective, from the store: who is behind did not arrive.
  std::vector<std::string> progress;
  absl::Time d = absl::Now() + absl::Seconds(2);
  for (int m : members_) {
    absl::StatusOr<std::string> p = store_->TryGet(absl::StrCat(name_, "/progress/", m), d);
    std::string entry = absl::StrCat("rank ", m, ": ");
    if (p.ok()) {
      int64_t their = std::atoll(p->c_str());
      absl::StrAppend(&entry, "#", *p, their < op.seq ? " (did not arrive)" : "");
    } else if (absl::IsNotFound(p.status())) {
      absl::StrAppend(&entry, "none (did not arrive)");
    } else {
      absl::StrAppend(&entry, "unknown (store unreachable)");
    }
    progress.push_back(entry);
  }
  std::string message = absl::StrCat(name_, " ", op.op, " #", op.seq, " on rank ", me, " (",
                                     rank_, " of ", size(), " in the group) failed: ",
                                     cause.message(), ". Last collective entered per rank: ",
                                     absl::StrJoin(progress, ", "));
  // The first failure's description becomes the group's abort reason.
  (void)store_->CompareAndSet(name_ + "/abort", "", message, d);
  return absl::Status(cause.code(), message);
}

absl::Status ProcessGroup::Abort(const std::string& reason) {
  // Device-side waits of the IPC path return at once (they would otherwise wait out the timeout).
  if (device_state_ != nullptr && device_state_->ipc != nullptr) device_state_->ipc->Abort();
  return store_->CompareAndSet(name_ + "/abort", "",
                               absl::StrCat("rank ", members_[size_t(rank_)], ": ", reason),
                               absl::Now() + absl::Seconds(10))
      .status();
}

absl::Status ProcessGroup::WaitAll(OpState& op, std::vector<std::unique_ptr<TransportRequest>>& reqs,
                                   const std::vector<int>& peers) {
  int64_t idle = 0;
  while (true) {
    bool all = true;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      SG_ASSIGN_OR_RETURN(bool done, reqs[i]->Test());
      if (done) {
        reqs[i].reset();
        idle = 0;
      } else {
        all = false;
      }
    }
    if (all) return absl::OkStatus();
    if (++idle > 64) std::this_thread::yield();
    if (idle % 256 == 0) {
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (reqs[i] != nullptr) {
          SG_RETURN_IF_ERROR(op.Check(*reqs[i], peers[i]));
          break;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Point to point

absl::StatusOr<Request> ProcessGroup::Send(const TensorView& t, int peer, uint64_t tag) {
  SG_RETURN_IF_ERROR(CheckTensor(t, "send", "tensor", false));
  SG_CHECK_ARG(peer >= 0 && peer < size(), name_, " send: peer must be in [0, ", size(), "), found ", peer);
  SG_CHECK_ARG(tag <= kMaxUserTag, name_, " send: tag must be below 2^40, found ", tag);
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(t, "send"));
  if (tr != device_ && device_ != nullptr) SG_RETURN_IF_ERROR(device_->Flush());  // see Begin
  Request r;
  SG_ASSIGN_OR_RETURN(r.req_, tr->ISend(members_[size_t(peer)], (group_id_ << kGroupShift) | tag,
                                        t.raw(), size_t(t.nbytes())));
  return r;
}

absl::StatusOr<Request> ProcessGroup::Recv(const TensorView& t, int peer, uint64_t tag) {
  SG_RETURN_IF_ERROR(CheckTensor(t, "recv", "tensor", false));
  SG_CHECK_ARG(peer >= 0 && peer < size(), name_, " recv: peer must be in [0, ", size(), "), found ", peer);
  SG_CHECK_ARG(tag <= kMaxUserTag, name_, " recv: tag must be below 2^40, found ", tag);
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(t, "recv"));
  if (tr != device_ && device_ != nullptr) SG_RETURN_IF_ERROR(device_->Flush());  // see Begin
  Request r;
  SG_ASSIGN_OR_RETURN(r.req_, tr->IRecv(members_[size_t(peer)], (group_id_ << kGroupShift) | tag,
                                        t.raw(), size_t(t.nbytes())));
  return r;
}

#ifdef SG_WITH_CUDA
namespace {

// A request that completes with the comm-stream work before an event (the IPC SendRecv's), or
// fails with the IPC ring's recorded error.
class IpcRequest final : public TransportRequest {
 public:
  IpcRequest(std::shared_ptr<CUevent_st> done, internal::IpcRing* ring, std::string what)
      : done_(std::move(done)), ring_(ring), what_(std::move(what)) {}
  absl::StatusOr<bool> Test() override {
    SG_RETURN_IF_ERROR(ring_->Error());
    const cudaError_t e = cudaEventQuery(done_.get());
    if (e == cudaErrorNotReady) return false;
    SG_CUDA_RETURN_IF_ERROR(e);
    return true;
  }
  std::string Describe() const override { return what_; }

 private:
  std::shared_ptr<CUevent_st> done_;
  internal::IpcRing* ring_;
  std::string what_;
};

}  // namespace

absl::StatusOr<std::pair<Request, Request>> ProcessGroup::IpcSendRecv(internal::IpcRing* ipc, OpState& op,
                                                                      const TensorView& send, const TensorView& recv,
                                                                      const Stream& comm) {
  DeviceState& ds = *device_state_;
  const int64_t seq = ds.ipc_exchanges++;
  SG_RETURN_IF_ERROR(ipc->Exchange(static_cast<const char*>(send.raw()), send.nbytes(), static_cast<char*>(recv.raw()),
                                   recv.nbytes(), seq, comm, [&op] { return op.CheckHostWait(); }));
  cudaEvent_t e = nullptr;
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::shared_ptr<CUevent_st> done(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, static_cast<cudaStream_t>(comm.native())));
  const int peer = members_[size_t(1 - rank_)];
  std::pair<Request, Request> r;
  r.first.req_ = std::make_unique<IpcRequest>(done, ipc, absl::StrCat("ipc send ", send.nbytes(), " B to rank ", peer));
  r.second.req_ =
      std::make_unique<IpcRequest>(done, ipc, absl::StrCat("ipc receive ", recv.nbytes(), " B from rank ", peer));
  return r;
}
#endif

absl::StatusOr<std::pair<Request, Request>> ProcessGroup::SendRecv(const TensorView& send, int send_peer,
                                                                   const TensorView& recv, int recv_peer,
                                                                   uint64_t tag, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(send, "sendrecv", "send tensor", false));
  SG_RETURN_IF_ERROR(CheckTensor(recv, "sendrecv", "receive tensor", false));
  SG_CHECK_ARG(send.device() == recv.device(), name_, " sendrecv: send and receive tensors must share a device, found ",
               send.device().ToString(), " and ", recv.device().ToString());
  SG_CHECK_ARG(send_peer >= 0 && send_peer < size() && recv_peer >= 0 && recv_peer < size(), name_,
               " sendrecv: peers must be in [0, ", size(), "), found ", send_peer, " and ", recv_peer);
  SG_CHECK_ARG(tag <= kMaxUserTag, name_, " sendrecv: tag must be below 2^40, found ", tag);
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(send, "sendrecv"));
  SG_RETURN_IF_ERROR(OrderBefore(tr, stream));
#ifdef SG_WITH_CUDA
  if (tr->stream() != nullptr && size() == 2 && send_peer != rank_ && recv_peer != rank_) {
    OpState op;
    op.pg = this;
    op.op = "sendrecv";
    op.seq = seq_;
    op.start = absl::Now();
    op.deadline = op.start + options_.timeout;
    op.next_abort_check = op.start + absl::Milliseconds(100);
    SG_ASSIGN_OR_RETURN(internal::IpcRing * ipc, EnsureIpc(tr, op));
    if (ipc != nullptr) return IpcSendRecv(ipc, op, send, recv, *tr->stream());
  }
#endif
  const uint64_t full_tag = (group_id_ << kGroupShift) | tag;
  std::pair<Request, Request> r;
  SG_RETURN_IF_ERROR(tr->GroupStart());
  auto s = tr->ISend(members_[size_t(send_peer)], full_tag, send.raw(), size_t(send.nbytes()));
  auto v = s.ok() ? tr->IRecv(members_[size_t(recv_peer)], full_tag, recv.raw(), size_t(recv.nbytes()))
                  : absl::StatusOr<std::unique_ptr<TransportRequest>>(s.status());
  absl::Status end = tr->GroupEnd();
  SG_RETURN_IF_ERROR(s.status());
  SG_RETURN_IF_ERROR(v.status());
  SG_RETURN_IF_ERROR(end);
  r.first.req_ = std::move(*s);
  r.second.req_ = std::move(*v);
  return r;
}

absl::Status ProcessGroup::OrderBeforeP2P(const Stream& stream) {
  if (device_ == nullptr || device_->stream() == nullptr || stream.native() == nullptr) {
    return absl::OkStatus();
  }
  return OrderBefore(device_, stream);
}

absl::Status ProcessGroup::OrderAfterP2P(const Stream& stream) {
  if (device_ == nullptr || device_->stream() == nullptr || stream.native() == nullptr) {
    return absl::OkStatus();
  }
  SG_RETURN_IF_ERROR(device_->Flush());  // held Send/Recv must be on the stream before the event
  SG_ASSIGN_OR_RETURN(Event e, Event::Create(device_->device()));
  SG_RETURN_IF_ERROR(e.Record(*device_->stream()));
  return e.Block(stream);
}

}  // namespace sg::comm
