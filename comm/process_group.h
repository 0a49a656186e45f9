// A group of ranks that communicate: asynchronous tagged Send/Recv and the collectives (all-reduce,
// reduce-scatter, all-gather, broadcast, all-to-all, barrier), built as chunked, pipelined ring
// algorithms over a transport's point-to-point primitives (ring.h). Host tensors go over the host
// transport (UCX), device tensors over the device transport (NCCL); NCCL's own collectives are
// available as an alternative path to compare against.
//
//   SG_ASSIGN_OR_RETURN(auto world, ProcessGroup::Create(&rdzv->store(), ucx.get(), nccl.get(), "world"));
//   SG_RETURN_IF_ERROR(world->AllReduce(grads, ReduceOp::kAvg));
//   SG_ASSIGN_OR_RETURN(auto row, world->Subgroup({0, 1}, "row0"));   // members call it, others don't
//
// No hangs: every collective gets a sequence number and a deadline (options.timeout). Entering one,
// a rank writes "<group>/progress/<rank>" to the store; a failure or timeout becomes an error naming
// the operation, its sequence number, the rank it was waiting on and every rank's progress, and it
// sets "<group>/abort" so the other ranks stop within ~100 ms instead of waiting out their deadline.
// Device collectives are enqueued (ordered after, and before, the caller's stream by events) and
// return at once; SynchronizeDevice() waits for them with the deadline.
//
// CUDA graphs: the device path (ring engine, NCCL send/recv, and the Native* collectives) can be
// captured when the caller's stream is being captured: it only records and waits on events it
// created once (the transport's and the reduce stream fork from the caller's stream and join it
// again), issues NCCL calls, and neither synchronizes nor allocates once its buffers have grown to
// the sizes the same collectives needed eagerly (growing inside a capture is FailedPrecondition;
// a buffer that grows in a later eager collective is kept, not freed, since a graph may use it).
// Every rank must capture the same sequence of collectives. Sequence numbers, progress keys and
// deadlines are host-side: they advance when a collective is captured, not when it is replayed;
// WaitStream is the deadline for replayed work.
//
// Not thread-safe: one thread per process drives a group (and the groups sharing its transports).
#ifndef SGTRAIN_COMM_PROCESS_GROUP_H_
#define SGTRAIN_COMM_PROCESS_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/reduce.h"
#include "comm/store.h"
#include "comm/transport.h"
#include "kernels/core/tensor.h"

namespace sg::comm {

class NcclTransport;

namespace internal {
class IpcRing;
}

struct ProcessGroupOptions {
  absl::Duration timeout = absl::Seconds(300);  // per collective / Send / Recv wait
  int64_t host_chunk_bytes = 128 << 10;          // pipeline chunk on the host path
  int host_window = 16;                          // receives in flight per ring
  // Device path: a segment is split into about device_chunks chunks of device_chunk_bytes to
  // device_max_chunk_bytes each. Every chunk is one NCCL group (a kernel launch plus NCCL's
  // ramp-up: 8 MiB chunks ran at ~130 GB/s on H200 NVLink against 357 GB/s for large messages),
  // so chunks are large; several per segment let the reduction of one overlap the next transfer.
  int64_t device_chunk_bytes = 32 << 20;
  int64_t device_max_chunk_bytes = 128 << 20;
  int device_chunks = 8;
  int device_window = 3;                         // scratch chunks: receives ahead of reductions
  bool track_progress = true;                    // one store write per collective
  // Device all-reduce, reduce-scatter and all-gather over CUDA IPC (comm/ipc_ring.h: each rank
  // pulls its ring predecessor's segment over NVLink and reduces it in the same kernel) when every
  // member asks for it, the group has two members and their GPUs can reach each other; otherwise
  // the ring over NCCL send/recv. 1 / 0; -1 takes SG_COMM_IPC from the environment (0 = off;
  // default on). On 2 H200s it is 1.06-1.5x NCCL's all-reduce (benchmarks/README.md).
  int device_ipc = -1;
};

// A pending Send or Recv.
class Request {
 public:
  Request() = default;
  // Blocks until done; DeadlineExceeded naming the operation if the deadline passes first.
  absl::Status Wait(absl::Time deadline);
  absl::StatusOr<bool> Test();

 private:
  friend class ProcessGroup;
  std::unique_ptr<TransportRequest> req_;
};

class ProcessGroup {
 public:
  // The group of every rank of the transports. `device` may be null (host tensors only). `name`
  // keys this group in the store; all ranks pass the same.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Create(StoreClient* store, Transport* host,
                                                              Transport* device, std::string name,
                                                              ProcessGroupOptions options = {});
  // A group over `ranks` (ranks of this group, in the order that defines the sub-group's ranks),
  // e.g. a row or column of a device mesh. Only members call it, each with the same ranks and name.
  absl::StatusOr<std::unique_ptr<ProcessGroup>> Subgroup(std::vector<int> ranks, std::string name) const;
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return int(members_.size()); }
  const std::string& name() const { return name_; }
  // How device all-reduce / reduce-scatter / all-gather run: "ipc" (comm/ipc_ring.h), "ring (...)"
  // over the device transport's send/recv with the reason IPC is not used, or "undecided" before
  // the group's first device collective.
  std::string DeviceAlgorithm() const;
  // Sequence number of the last collective started.
  int64_t sequence() const { return seq_; }

  // Point to point (tensors contiguous, on the host or the device transport's device). Messages
  // between two ranks with the same tag match in order; tags are below 2^40. Independent requests
  // may be posted in any order before waiting: "Recv from p; Send to p; Wait both" on both ranks
  // works: device requests posted back to back are held and start together as one NCCL group at
  // the first Wait/Test, OrderAfterP2P, SynchronizeDevice, collective or host Send/Recv (so test a
  // request only after posting everything that must run with it). Device tensors are not ordered
  // after any stream: make the data ready first (or use SendRecv, which takes a stream).
  absl::StatusOr<Request> Send(const TensorView& t, int peer, uint64_t tag);
  absl::StatusOr<Request> Recv(const TensorView& t, int peer, uint64_t tag);
  // A send of `send` to `send_peer` and a receive into `recv` from `recv_peer`, started together:
  // one ring step's exchange (one NCCL group on the device path, so every rank sending first
  // cannot deadlock). In a 2-member group on the IPC path (device_ipc) it is a CUDA IPC exchange,
  // each rank pulling the other's send tensor by the copy engines: there a SendRecv pairs only
  // with the other member's SendRecv (not with a Recv), and both sizes must agree. Device tensors: the exchange runs after the work queued on `stream` so far
  // (it may read what that work wrote); OrderAfterP2P(stream) later makes `stream` wait for it.
  // Returns {send request, receive request}. Both tensors on the same device.
  absl::StatusOr<std::pair<Request, Request>> SendRecv(const TensorView& send, int send_peer,
                                                       const TensorView& recv, int recv_peer,
                                                       uint64_t tag, const Stream& stream = Stream::Cpu());
  // Device: the point-to-point operations posted after this call run after the work queued on
  // `stream` so far (Send/Recv of values that work produces, without a host sync). Requests still
  // held are started first. A no-op without a device transport or for a CPU stream.
  absl::Status OrderBeforeP2P(const Stream& stream);
  // Device: makes `stream` wait (on the device, the host does not block) for every point-to-point
  // operation issued so far on the device transport. A no-op without one or for a CPU stream
  // (host requests are waited with Request::Wait).
  absl::Status OrderAfterP2P(const Stream& stream);

  // In place over `t` (f32 or bf16; bf16 is reduced in f32 and rounded once per hop).
  absl::Status AllReduce(const TensorView& t, ReduceOp op, const Stream& stream = Stream::Cpu());
  // input has size() * output.numel() elements; rank r receives the reduction of block r. Input and
  // output share a dtype, or the input is bf16 and the output f32: the bf16 blocks are then reduced
  // in f32 into the f32 output (FSDP2's f32 reduction of bf16 gradients). On two GPUs over CUDA IPC
  // that reads bf16 over NVLink; the other paths widen the input to f32 first.
  absl::Status ReduceScatter(const TensorView& input, const TensorView& output, ReduceOp op,
                             const Stream& stream = Stream::Cpu());
  // output has size() * input.numel() elements; block r is rank r's input.
  absl::Status AllGather(const TensorView& input, const TensorView& output,
                         const Stream& stream = Stream::Cpu());
  absl::Status Broadcast(const TensorView& t, int root, const Stream& stream = Stream::Cpu());
  // input and output have size() equal blocks; block j of rank i's input becomes block i of rank
  // j's output. Pairwise exchange rather than a ring: each block crosses one link once.
  absl::Status AllToAll(const TensorView& input, const TensorView& output,
                        const Stream& stream = Stream::Cpu());
  absl::Status Barrier();

  // NCCL's own collectives on device tensors (full group only): the baseline the ring path is
  // measured against. FailedPrecondition without a NCCL device transport.
  absl::Status NativeAllReduce(const TensorView& t, ReduceOp op, const Stream& stream);
  absl::Status NativeReduceScatter(const TensorView& input, const TensorView& output, ReduceOp op,
                                   const Stream& stream);
  absl::Status NativeAllGather(const TensorView& input, const TensorView& output, const Stream& stream);

  // Waits (host) until the device collectives issued so far are done, like WaitStream (deadline,
  // abort flag, device transport aborted on failure). Collectives captured into a CUDA graph are
  // not covered (they run when the graph is launched): wait for the stream the graph was launched
  // on with WaitStream.
  absl::Status SynchronizeDevice(absl::Time deadline);
  // Waits (host) until the work queued on `stream` so far is done (e.g. a training step whose
  // collectives on this group were replayed from a CUDA graph), never forever: it polls an event,
  // and every 100 ms this group's abort flag (set by a failed peer or the health monitor,
  // comm/health.h). At `deadline` or on an abort it aborts the device transport (NCCL: the abort
  // flag makes kernels waiting on a dead peer return), sets the group's abort flag so the peers
  // stop too, and returns DeadlineExceeded / Aborted naming the group, this rank and the last
  // sequence number, within about 2 s of the deadline whatever NCCL does (Transport::Abort). The
  // message says when the transport's teardown had not finished by then: NCCL 2.26+ finishes it
  // only after every CUDA graph that captured its work is destroyed, so destroy the graphs (the
  // stream may hold a kernel until the abort flag reaches it: do not synchronize it blindly).
  // Later device collectives then fail with FailedPrecondition. A CPU stream returns at once.
  absl::Status WaitStream(const Stream& stream, absl::Time deadline);
  // Tells every rank of the group to stop: their current and next operations fail with `reason`.
  absl::Status Abort(const std::string& reason);

  struct OpState;  // the running collective: name, sequence number, deadline (process_group.cc)

 private:
  ProcessGroup() = default;
  // Argument checks shared by every operation: the tensor is contiguous, on a device a transport
  // serves, and of a reducible dtype when `reduce`.
  absl::Status CheckTensor(const TensorView& t, absl::string_view op, absl::string_view what,
                           bool reduce) const;
  absl::StatusOr<Transport*> TransportFor(const TensorView& t, absl::string_view op) const;
  absl::StatusOr<OpState> Begin(absl::string_view op, absl::Duration timeout);
  absl::Status Fail(const OpState& op, const absl::Status& cause);
  absl::Status CheckAbort(const OpState& op);
  // Ring reduce-scatter over `buf` split into size() segments of `seg_counts` elements: rank r ends
  // holding the reduction of segment r. Ring all-gather: every rank ends with every segment.
  // Device path only: `src` (indexed like buf) is read instead of buf for our own contribution,
  // and segment r's final reduction goes to `final_out`, scaled by `final_scale` (ring.h).
  absl::Status RingReduceScatter(OpState& op, Transport* t, char* buf, DType dtype,
                                 const std::vector<int64_t>& seg_counts, ReduceOp rop,
                                 const char* src = nullptr, char* final_out = nullptr,
                                 float final_scale = 1.0f);
  // Device path only: `send0` holds segment r (instead of buf).
  absl::Status RingAllGather(OpState& op, Transport* t, char* buf, DType dtype,
                             const std::vector<int64_t>& seg_counts, const char* send0 = nullptr);
  // The device paths of ReduceScatter and AllGather (no staging copies; collectives.cc).
  absl::Status DeviceReduceScatter(OpState& op, Transport* t, const TensorView& input,
                                   const TensorView& output, ReduceOp rop, const Stream& stream);
  absl::Status DeviceAllGather(OpState& op, Transport* t, const TensorView& input,
                               const TensorView& output, const Stream& stream);
  // Waits for every request (host transports), checking deadline and abort flag.
  absl::Status WaitAll(OpState& op, std::vector<std::unique_ptr<TransportRequest>>& reqs,
                       const std::vector<int>& peers);
  // Growing the scratch first waits for queued reductions, until `deadline` (DrainDeviceStream).
  absl::Status EnsureDeviceState(Transport* t, int64_t scratch_bytes, absl::Time deadline);
  // The one host wait on device communication work: polls `event` (a cudaEvent_t) until done; at
  // `deadline` or on a group abort, aborts the device transport and the group and returns the
  // error naming `what`, the group, this rank and the sequence number (see WaitStream).
  absl::Status WaitDeviceEvent(void* event, absl::string_view what, absl::Time deadline);
  // WaitDeviceEvent for the work queued on `stream` so far (before a device buffer is replaced).
  absl::Status DrainDeviceStream(const Stream& stream, absl::Time deadline,
                                 absl::string_view what = "device work queued before a buffer grows");
  // The group's IPC ring, created (collectively) at the first device collective; null when the
  // group does not use that path.
  absl::StatusOr<internal::IpcRing*> EnsureIpc(Transport* t, const OpState& op);
  // SendRecv on the IPC path (two members): each pulls the other's send tensor into its receive.
  absl::StatusOr<std::pair<Request, Request>> IpcSendRecv(internal::IpcRing* ipc, OpState& op,
                                                          const TensorView& send, const TensorView& recv,
                                                          const Stream& comm);
  // True while `s` (a transport's stream; null: false) is being captured into a CUDA graph.
  static absl::StatusOr<bool> Capturing(const Stream* s);
  // FailedPrecondition naming `what` when a device buffer would grow during a capture.
  absl::Status CheckGrowable(Transport* t, absl::string_view what, int64_t from, int64_t to);
  absl::Status OrderBefore(Transport* t, const Stream& stream);
  absl::Status OrderAfter(Transport* t, const Stream& stream);
  // The body every Native* collective shares (collectives.cc): `issue` gets the ncclComm_t and the
  // transport's cudaStream_t and returns the ncclResult_t of the call named `nccl_call`.
  absl::Status RunNative(NcclTransport* nt, absl::string_view op_name, absl::string_view nccl_call,
                         const std::function<int(void* comm, void* stream)>& issue, const Stream& stream);

  StoreClient* store_ = nullptr;
  Transport* host_ = nullptr;
  Transport* device_ = nullptr;
  std::string name_;
  uint64_t group_id_ = 0;           // 7 bits in message tags
  std::vector<int> members_;        // transport rank of each group rank
  int rank_ = 0;
  int64_t seq_ = 0;
  ProcessGroupOptions options_;
  struct DeviceState;
  friend struct OpState;
  std::unique_ptr<DeviceState> device_state_;  // reduce stream, scratch, last completion
  // A device abort of this group returned before its teardown finished: see ~ProcessGroup.
  bool device_abort_unfinished_ = false;
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_PROCESS_GROUP_H_
