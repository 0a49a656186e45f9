#include "comm/nccl_transport.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

// NCCL failures as a status with the call, file:line and NCCL's error string (plus its last
// detailed message). ncclInProgress is not an error for a non-blocking communicator.
#define SG_NCCL_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                          \
    ncclResult_t sg_nccl_rc_ = (call);                                                          \
    if (sg_nccl_rc_ != ncclSuccess && sg_nccl_rc_ != ncclInProgress)                           \
      return ::sg::LibraryError(absl::StatusCode::kInternal, "NCCL", int(sg_nccl_rc_),          \
                                ncclGetErrorString(sg_nccl_rc_), #call, __FILE__, __LINE__);    \
  } while (0)
#endif

namespace sg::comm {

#ifdef SG_WITH_NCCL

namespace {

// Events no request holds any more, for the next completions; destroyed with the last owner.
struct FreeEvents {
  std::vector<cudaEvent_t> events;
  ~FreeEvents() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

// A completion event shared by the operations of one group (or one batch of ungrouped operations).
// Its event goes back to the transport's free list when the last request lets go of it: a group
// per ring chunk must not create and destroy an event each time (host time per step, and nothing
// but records may touch events inside a CUDA graph capture).
struct Completion {
  cudaEvent_t event = nullptr;
  bool recorded = false;
  std::shared_ptr<FreeEvents> free_list;
  ~Completion() {
    if (event != nullptr) free_list->events.push_back(event);
  }
};

// A send or receive posted outside a group, held until the batch is flushed.
struct DeferredOp {
  bool is_send;
  int peer;
  void* data;
  size_t bytes;
};

// How long Abort waits for ncclCommAbort before leaving it to its thread.
constexpr absl::Duration kAbortWait = absl::Seconds(2);

// Runs `teardown` (ncclCommAbort, or finalize + destroy) on a detached thread and returns what it
// notifies when it is done, so that the caller waits with a deadline. NCCL's teardown can block
// for good: since 2.26, commDestroySync (reached from ncclCommAbort and ncclCommDestroy) polls
// until every CUDA graph that captured the communicator's work has been destroyed, and the caller
// holding such a graph is the thread that would wait. The thread owns everything it uses (the
// communicator handle and the notification), so it may outlive the transport: a communicator
// whose teardown never finishes is leaked on purpose.
std::shared_ptr<absl::Notification> RunDetached(int device, std::function<void()> teardown) {
  auto done = std::make_shared<absl::Notification>();
  std::thread([device, teardown = std::move(teardown), done] {
    cudaSetDevice(device);
    teardown();
    done->Notify();
  }).detach();
  return done;
}

// True once every operation queued on `stream` so far finished; false at `deadline`.
bool Drained(cudaStream_t stream, absl::Time deadline) {
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaErrorNotReady) return e == cudaSuccess;
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

struct NcclTransport::Impl {
  std::shared_ptr<FreeEvents> free_events = std::make_shared<FreeEvents>();
  ncclComm_t comm = nullptr;
  std::unique_ptr<Stream> stream;
  int group_depth = 0;
  std::shared_ptr<Completion> group_completion;  // the open group's, recorded at GroupEnd
  // Ungrouped operations not yet issued, in posting order, and the completion they will share.
  std::vector<DeferredOp> deferred;
  std::shared_ptr<Completion> deferred_completion;
  // Set by Abort: from then on nothing touches `comm` (its teardown runs on another thread and
  // frees it), and `teardown_done` is notified when that teardown returned.
  bool aborted = false;
  std::shared_ptr<absl::Notification> teardown_done;
  int rank = 0;

  // The error of every call after an abort.
  absl::Status AbortedError(absl::string_view what) const {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the NCCL communicator of rank ", rank,
        " was aborted after an earlier failure (a timeout or a group abort); create a new transport"));
  }

  cudaStream_t native_stream() const { return static_cast<cudaStream_t>(stream->native()); }

  absl::StatusOr<std::shared_ptr<Completion>> NewCompletion() {
    auto c = std::make_shared<Completion>();
    c->free_list = free_events;
    if (!free_events->events.empty()) {
      c->event = free_events->events.back();
      free_events->events.pop_back();
    } else {
      SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&c->event, cudaEventDisableTiming));
    }
    return c;
  }
  absl::Status Record(Completion& c) {
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(c.event, native_stream()));
    c.recorded = true;
    return absl::OkStatus();
  }

  absl::Status WaitIssued(absl::Time deadline, absl::string_view what) {
    if (aborted) return AbortedError(what);
    while (true) {
      ncclResult_t state = ncclSuccess;
      SG_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return absl::InternalError(absl::StrCat(what, ": NCCL error ", int(state), " (",
                                                ncclGetErrorString(state), "): ",
                                                ncclGetLastError(comm)));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL still in progress at the deadline"));
      }
      std::this_thread::yield();
    }
  }

  absl::Status Issue(const DeferredOp& op) {
    if (op.is_send) {
      SG_NCCL_RETURN_IF_ERROR(ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm, native_stream()));
    } else {
      SG_NCCL_RETURN_IF_ERROR(ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm, native_stream()));
    }
    return absl::OkStatus();
  }

  // Issues the held operations as one NCCL group, so a rank's receives and sends between the same
  // pair of ranks progress together however they were posted. Inside an open group nothing is held.
  absl::Status Flush() {
    if (deferred.empty() || group_depth > 0) return absl::OkStatus();
    if (aborted) return AbortedError("nccl transport: flush");
    std::vector<DeferredOp> ops;
    ops.swap(deferred);
    std::shared_ptr<Completion> done = std::move(deferred_completion);
    SG_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    absl::Status issued = absl::OkStatus();
    for (const DeferredOp& op : ops) {
      issued = Issue(op);
      if (!issued.ok()) break;
    }
    // The group is always closed, so a failed call does not leave NCCL inside a group.
    ncclResult_t end = ncclGroupEnd();
    SG_RETURN_IF_ERROR(issued);
    SG_NCCL_RETURN_IF_ERROR(end);
    SG_RETURN_IF_ERROR(WaitIssued(absl::Now() + absl::Seconds(60),
                                  absl::StrCat("ncclGroupEnd (", ops.size(), " batched send/recv)")));
    return Record(*done);
  }
};

namespace {

class NcclRequest : public TransportRequest {
 public:
  NcclRequest(NcclTransport::Impl* impl, std::shared_ptr<Completion> done, bool is_send, int peer,
              size_t bytes)
      : impl_(impl), done_(std::move(done)), is_send_(is_send), peer_(peer), bytes_(bytes) {}

  absl::StatusOr<bool> Test() override {
    if (impl_->aborted) return impl_->AbortedError(Describe());
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      return absl::InternalError(absl::StrCat(Describe(), ": NCCL asynchronous error ", int(async),
                                              " (", ncclGetErrorString(async), ")"));
    }
    if (!done_->recorded) {
      // Held in the ungrouped batch (start it now), or its explicit group has not ended yet.
      SG_RETURN_IF_ERROR(impl_->Flush());
      if (!done_->recorded) return false;
    }
    cudaError_t e = cudaEventQuery(done_->event);
    if (e == cudaErrorNotReady) return false;
    SG_CUDA_RETURN_IF_ERROR(e);
    return true;
  }
  std::string Describe() const override {
    return absl::StrFormat("nccl %s %d B %s rank %d", is_send_ ? "send" : "recv", bytes_,
                           is_send_ ? "to" : "from", peer_);
  }

 private:
  NcclTransport::Impl* impl_;
  std::shared_ptr<Completion> done_;
  bool is_send_;
  int peer_;
  size_t bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(StoreClient& store,
                                                                     const std::string& prefix,
                                                                     int rank, int world_size,
                                                                     Device device,
                                                                     absl::Time deadline) {
  SG_CHECK_ARG(device.is_cuda(), "nccl transport: expected a CUDA device, found ", device.ToString());
  SG_CHECK_ARG(rank >= 0 && rank < world_size, "nccl transport: rank must be in [0, ", world_size,
               "), found ", rank);
  std::unique_ptr<NcclTransport> t(new NcclTransport());
  t->rank_ = rank;
  t->world_size_ = world_size;
  t->device_ = device;
  t->impl_ = std::make_unique<Impl>();
  t->impl_->rank = rank;
  SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.ordinal));
  SG_ASSIGN_OR_RETURN(Stream s, Stream::Create(device));
  t->impl_->stream = std::make_unique<Stream>(std::move(s));

  const std::string key = prefix + "/nccl/unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    SG_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    SG_RETURN_IF_ERROR(store.Set(key, std::string(id.internal, sizeof(id.internal)), deadline));
  } else {
    SG_ASSIGN_OR_RETURN(std::string got, store.Get(key, deadline));
    if (got.size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("nccl transport: unique id in the store has ",
                                              got.size(), " bytes, expected ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, got.data(), sizeof(id.internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  SG_NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&t->impl_->comm, world_size, id, rank, &config));
  absl::Status s_init = t->WaitIssued(deadline, absl::StrCat("ncclCommInitRank (", world_size, " ranks)"));
  if (!s_init.ok()) {
    (void)t->Abort();
    return s_init;
  }
  return t;
}

// Neither waits forever: the stream drain and the communicator's teardown have deadlines, and a
// teardown that misses its deadline is left running on its thread (RunDetached), the communicator
// leaked. That happens when a CUDA graph that captured this communicator's work outlives the
// transport (destroy graphs first), or when a kernel waits on a peer that never comes.
NcclTransport::~NcclTransport() {
  if (impl_ == nullptr || impl_->comm == nullptr) return;
  // An abort that has not finished yet is waiting for a graph (or a stuck kernel): no point in
  // waiting long for it here.
  absl::Duration wait = kAbortWait;
  if (!impl_->aborted) {
    wait = absl::Seconds(12);
    // Held operations were never waited on: nobody can observe them, so they are dropped.
    impl_->deferred.clear();
    // Drain our stream first so destroying the communicator does not race queued work; work that
    // does not drain waits on a peer, and only an abort ends it.
    if (!Drained(impl_->native_stream(), absl::Now() + absl::Seconds(10))) {
      (void)Abort();
      wait = kAbortWait;
    } else {
      impl_->aborted = true;
      ncclComm_t comm = impl_->comm;
      impl_->teardown_done = RunDetached(device_.ordinal, [comm] {
        ncclCommFinalize(comm);
        ncclResult_t state = ncclInProgress;
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        while (state == ncclInProgress && absl::Now() < deadline) ncclCommGetAsyncError(comm, &state);
        if (state == ncclSuccess) {
          ncclCommDestroy(comm);
        } else {
          ncclCommAbort(comm);
        }
      });
    }
  }
  if (!impl_->teardown_done->WaitForNotificationWithTimeout(wait)) {
    // A destructor cannot return a status; one line says where the communicator went.
    std::fprintf(stderr,
                 "nccl transport (rank %d): the communicator's teardown did not finish within its "
                 "deadline (a CUDA graph that captured its work still exists, or a kernel is stuck); "
                 "left running in the background, the communicator leaked\n",
                 rank_);
  }
}

absl::Status NcclTransport::WaitIssued(absl::Time deadline, absl::string_view what) {
  return impl_->WaitIssued(deadline, what);
}

// ncclCommAbort sets the abort flag that NCCL's kernels poll (so a kernel waiting on a dead peer
// returns) before it tears anything down; the teardown may then block (see RunDetached), so it
// runs on its own thread and this waits kAbortWait at most.
bool NcclTransport::Abort() {
  if (impl_ == nullptr || impl_->comm == nullptr) return true;
  if (!impl_->aborted) {
    impl_->aborted = true;
    impl_->deferred.clear();
    ncclComm_t comm = impl_->comm;
    impl_->teardown_done = RunDetached(device_.ordinal, [comm] { ncclCommAbort(comm); });
  }
  return impl_->teardown_done->WaitForNotificationWithTimeout(kAbortWait);
}

bool NcclTransport::WaitAborted(absl::Time deadline) {
  if (impl_ == nullptr || impl_->teardown_done == nullptr) return true;
  return impl_->teardown_done->WaitForNotificationWithDeadline(deadline);
}

absl::StatusOr<void*> NcclTransport::comm() const {
  if (impl_->aborted) return impl_->AbortedError("nccl transport: native collective");
  return static_cast<void*>(impl_->comm);
}
const Stream* NcclTransport::stream() const { return impl_->stream.get(); }

absl::Status NcclTransport::GroupStart() {
  if (impl_->aborted) return impl_->AbortedError("nccl transport: group start");
  if (impl_->group_depth == 0) {
    // Held operations go first, in their own group: posting order is matching order.
    SG_RETURN_IF_ERROR(impl_->Flush());
    SG_ASSIGN_OR_RETURN(impl_->group_completion, impl_->NewCompletion());
  }
  SG_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  ++impl_->group_depth;
  return absl::OkStatus();
}

absl::Status NcclTransport::GroupEnd() {
  SG_CHECK_ARG(impl_->group_depth > 0, "nccl transport: GroupEnd without GroupStart");
  --impl_->group_depth;
  if (impl_->aborted) return impl_->AbortedError("nccl transport: group end");
  SG_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  if (impl_->group_depth == 0) {
    SG_RETURN_IF_ERROR(WaitIssued(absl::Now() + absl::Seconds(60), "ncclGroupEnd"));
    SG_RETURN_IF_ERROR(impl_->Record(*impl_->group_completion));
    impl_->group_completion.reset();
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Flush() { return impl_->Flush(); }

// Inside a group the operation is issued at once; outside one it joins the held batch (see Flush).
absl::StatusOr<std::unique_ptr<TransportRequest>> NcclTransport::Post(bool is_send, int peer,
                                                                      void* data, size_t bytes) {
  if (impl_->aborted) return impl_->AbortedError(absl::StrCat("nccl transport: ", is_send ? "send" : "recv"));
  DeferredOp op{is_send, peer, data, bytes};
  std::shared_ptr<Completion> done;
  if (impl_->group_depth > 0) {
    SG_RETURN_IF_ERROR(impl_->Issue(op));
    done = impl_->group_completion;
  } else {
    if (impl_->deferred_completion == nullptr) {
      SG_ASSIGN_OR_RETURN(impl_->deferred_completion, impl_->NewCompletion());
    }
    impl_->deferred.push_back(op);
    done = impl_->deferred_completion;
  }
  return std::unique_ptr<TransportRequest>(new NcclRequest(impl_.get(), std::move(done), is_send,
                                                           peer, bytes));
}

absl::StatusOr<std::unique_ptr<TransportRequest>> NcclTransport::ISend(int peer, uint64_t tag,
                                                                       const void* data,
                                                                       size_t bytes) {
  SG_RETURN_IF_ERROR(CheckPeerAndTag(*this, "send", peer, tag));
  return Post(true, peer, const_cast<void*>(data), bytes);
}

absl::StatusOr<std::unique_ptr<TransportRequest>> NcclTransport::IRecv(int peer, uint64_t tag,
                                                                       void* data, size_t bytes) {
  SG_RETURN_IF_ERROR(CheckPeerAndTag(*this, "recv", peer, tag));
  return Post(false, peer, data, bytes);
}

absl::Status NcclTransport::Progress() { return impl_->Flush(); }

#else  // !SG_WITH_NCCL

struct NcclTransport::Impl {};

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(StoreClient&, const std::string&,
                                                                     int, int, Device, absl::Time) {
  return absl::FailedPreconditionError("nccl transport: built without NCCL (SG_WITH_NCCL unset)");
}
NcclTransport::~NcclTransport() = default;
absl::StatusOr<std::unique_ptr<TransportRequest>> NcclTransport::ISend(int, uint64_t, const void*, size_t) {
  return absl::FailedPreconditionError("nccl transport: built without NCCL");
}
absl::StatusOr<std::unique_ptr<TransportRequest>> NcclTransport::IRecv(int, uint64_t, void*, size_t) {
  return absl::FailedPreconditionError("nccl transport: built without NCCL");
}
absl::Status NcclTransport::GroupStart() { return absl::FailedPreconditionError("built without NCCL"); }
absl::Status NcclTransport::GroupEnd() { return absl::FailedPreconditionError("built without NCCL"); }
absl::Status NcclTransport::Flush() { return absl::OkStatus(); }
absl::StatusOr<std::unique_ptr<TransportRequest>> NcclTransport::Post(bool, int, void*, size_t) {
  return absl::FailedPreconditionError("nccl transport: built without NCCL");
}
absl::Status NcclTransport::Progress() { return absl::OkStatus(); }
const Stream* NcclTransport::stream() const { return nullptr; }
absl::StatusOr<void*> NcclTransport::comm() const {
  return absl::FailedPreconditionError("built without NCCL");
}
absl::Status NcclTransport::WaitIssued(absl::Time, absl::string_view) {
  return absl::FailedPreconditionError("built without NCCL");
}
bool NcclTransport::Abort() { return true; }
bool NcclTransport::WaitAborted(absl::Time) { return true; }

#endif  // SG_WITH_NCCL

}  // namespace sg::comm
