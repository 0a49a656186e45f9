// ProcessGroup's collectives: argument checks, then the ring engines of ring.h (host or device),
// and NCCL's native collectives as the comparison path.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/process_group.h"
#include "comm/nccl_transport.h"
#include "comm/process_group_state.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif
#ifdef SG_WITH_NCCL
#include <nccl.h>
#endif

namespace sg::comm {
namespace {

std::vector<int64_t> SplitEven(int64_t n, int parts) {
  std::vector<int64_t> counts(size_t(parts), n / parts);
  for (int i = 0; i < n % parts; ++i) ++counts[size_t(i)];
  return counts;
}

std::vector<internal::Segment> Segments(const std::vector<int64_t>& counts) {
  std::vector<internal::Segment> segs;
  int64_t off = 0;
  for (int64_t c : counts) {
    segs.push_back({off, c});
    off += c;
  }
  return segs;
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

internal::IpcCheck IpcCheck(ProcessGroup::OpState& op) {
  return [&op] { return op.CheckHostWait(); };
}

}  // namespace

#ifdef SG_WITH_CUDA
namespace {

cudaStream_t Native(const Stream& s) { return static_cast<cudaStream_t>(s.native()); }

absl::StatusOr<cudaEvent_t> NextEvent(internal::DeviceEvents& events) {
  SG_ASSIGN_OR_RETURN(void* e, events.Get());
  return static_cast<cudaEvent_t>(e);
}

}  // namespace
#endif

// True while `s` is being captured into a CUDA graph (it joined a capture through an event).
absl::StatusOr<bool> ProcessGroup::Capturing(const Stream* s) {
#ifdef SG_WITH_CUDA
  if (s == nullptr || s->native() == nullptr) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SG_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(Native(*s), &status));
  return status != cudaStreamCaptureStatusNone;
#else
  (void)s;
  return false;
#endif
}

// Device buffers grow (allocate, after a synchronization) only outside a CUDA graph capture: the
// same collectives run eagerly first (the executor's warm-up steps), so a capture finds them sized.
absl::Status ProcessGroup::CheckGrowable(Transport* t, absl::string_view what, int64_t from, int64_t to) {
  SG_ASSIGN_OR_RETURN(bool capturing, Capturing(t->stream()));
  if (!capturing) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      name_, ": the device ", what, " must grow from ", from, " to ", to,
      " bytes inside a CUDA graph capture (it cannot allocate or synchronize there); run the same collectives "
      "eagerly before capturing (warm-up steps)"));
}

// Places the transport's stream after the caller's work (device), so inputs are ready. Send/Recv
// requests the transport still holds are started first: they were posted before this collective.
// Starts a device collective: its events are reused from here on (ring.h's DeviceEvents).
absl::Status ProcessGroup::OrderBefore(Transport* t, const Stream& stream) {
  SG_RETURN_IF_ERROR(t->Flush());
  if (t->stream() == nullptr) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  DeviceState& ds = *device_state_;
  ds.events.Reset();
  if (!ds.captured) {
    SG_ASSIGN_OR_RETURN(const bool comm_capturing, Capturing(t->stream()));
    SG_ASSIGN_OR_RETURN(const bool caller_capturing, Capturing(&stream));
    ds.captured = comm_capturing || caller_capturing;
  }
  SG_ASSIGN_OR_RETURN(cudaEvent_t e, NextEvent(ds.events));
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, Native(stream.native() ? stream : *t->stream())));
  SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Native(*t->stream()), e, 0));
#endif
  return absl::OkStatus();
}

// Places the caller's stream after the collective (device) and remembers it for SynchronizeDevice
// (unless the comm stream is being captured: see DeviceState::last).
absl::Status ProcessGroup::OrderAfter(Transport* t, const Stream& stream) {
  if (t->stream() == nullptr) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  DeviceState& ds = *device_state_;
  SG_ASSIGN_OR_RETURN(bool capturing, Capturing(t->stream()));
  cudaEvent_t done = nullptr;
  if (capturing) {
    SG_ASSIGN_OR_RETURN(done, NextEvent(ds.events));
  } else {
    if (ds.last == nullptr) SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ds.last, cudaEventDisableTiming));
    done = ds.last;
  }
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, Native(*t->stream())));
  if (stream.native() != nullptr) SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Native(stream), done, 0));
#endif
  return absl::OkStatus();
}

// The reduce stream, and at least `scratch_bytes` of device scratch.
absl::Status ProcessGroup::EnsureDeviceState(Transport* t, int64_t scratch_bytes, absl::Time deadline) {
  DeviceState& ds = *device_state_;
  if (ds.reduce_stream == nullptr) {
    SG_RETURN_IF_ERROR(CheckGrowable(t, "reduce stream", 0, 0));
    SG_ASSIGN_OR_RETURN(Stream rs, Stream::Create(t->device()));
    ds.reduce_stream = std::make_unique<Stream>(std::move(rs));
  }
  if (scratch_bytes > 0 && (ds.scratch.view().raw() == nullptr || ds.scratch.nbytes() < scratch_bytes)) {
    SG_RETURN_IF_ERROR(CheckGrowable(t, "ring scratch", ds.scratch.view().raw() ? ds.scratch.nbytes() : 0,
                                     scratch_bytes));
    // The old scratch may still be read by queued reductions: let them finish before freeing it.
    SG_RETURN_IF_ERROR(DrainDeviceStream(*ds.reduce_stream, deadline));
    if (ds.captured) ds.retired.push_back(std::move(ds.scratch));
    SG_ASSIGN_OR_RETURN(ds.scratch, Tensor::Empty({(scratch_bytes + 3) / 4}, DType::kF32, t->device()));
  }
  return absl::OkStatus();
}

std::string ProcessGroup::DeviceAlgorithm() const {
  const DeviceState& ds = *device_state_;
  if (!ds.ipc_decided) return "undecided";
  if (ds.ipc != nullptr) return "ipc";
  return absl::StrCat("ring (not IPC: ", ds.ipc_why_not, ")");
}

absl::StatusOr<internal::IpcRing*> ProcessGroup::EnsureIpc(Transport* t, const OpState& op) {
  DeviceState& ds = *device_state_;
  if (!ds.ipc_decided) {
    if (size() == 1 || t->stream() == nullptr) {
      ds.ipc_decided = true;
      ds.ipc_why_not = "one member or no device transport";
      return nullptr;
    }
    SG_RETURN_IF_ERROR(CheckGrowable(t, "IPC ring (made at the first device collective)", 0, 0));
    bool wanted = options_.device_ipc > 0;
    if (options_.device_ipc < 0) {
      const char* env = std::getenv("SG_COMM_IPC");
      wanted = env == nullptr || std::string(env) != "0";
    }
    internal::IpcConfig cfg;
    cfg.timeout = options_.timeout;
    if (const char* v = std::getenv("SG_COMM_IPC_BLOCKS")) cfg.blocks = std::atoi(v);
    if (const char* v = std::getenv("SG_COMM_IPC_COPY")) cfg.copy_engine = std::string(v) != "sm";
    if (const char* v = std::getenv("SG_COMM_IPC_COPY_SPLITS")) cfg.copy_splits = std::max(1, std::atoi(v));
    SG_ASSIGN_OR_RETURN(ds.ipc, internal::IpcRing::Create(*store_, name_ + "/ipc", rank_, size(), t->device(),
                                                          wanted, cfg, op.deadline, &ds.ipc_why_not));
    ds.ipc_decided = true;
  }
  return ds.ipc.get();
}

// Every host wait on device communication work goes through here, so none outlives its deadline:
// the event is polled, the abort flag read every 100 ms, and the transport's abort is bounded
// (Transport::Abort returns within ~2 s even when NCCL's teardown blocks).
absl::Status ProcessGroup::WaitDeviceEvent(void* event, absl::string_view what, absl::Time deadline) {
#ifdef SG_WITH_CUDA
  DeviceState& ds = *device_state_;
  OpState op;
  op.pg = this;
  op.op = std::string(what);
  op.seq = seq_;
  op.start = absl::Now();
  op.deadline = deadline;
  absl::Time next_abort_check = op.start + absl::Milliseconds(100);
  while (true) {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    // IPC waits end themselves on a timeout or abort, so the stream completes: check why first.
    absl::Status failed = ds.ipc != nullptr ? ds.ipc->Error() : absl::OkStatus();
    if (failed.ok() && e == cudaSuccess) return absl::OkStatus();
    if (e != cudaSuccess && e != cudaErrorNotReady) SG_CUDA_RETURN_IF_ERROR(e);
    const absl::Time now = absl::Now();
    if (!failed.ok()) {
      failed = absl::Status(failed.code(), absl::StrCat(name_, ": ", failed.message()));
    } else if (now >= deadline) {
      failed = absl::DeadlineExceededError(absl::StrCat(
          name_, ": ", what, " (collectives up to #", seq_, ", possibly replayed from a CUDA graph) not done after ",
          absl::FormatDuration(now - op.start), " on rank ", members_[size_t(rank_)], "; a peer is dead or stuck"));
    } else if (now >= next_abort_check) {
      next_abort_check = now + absl::Milliseconds(100);
      failed = CheckAbort(op);
    }
    if (failed.ok()) {
      std::this_thread::yield();
      continue;
    }
    // Kernels waiting on a dead peer never finish: aborting the transport (ncclCommAbort) makes
    // them return, so the streams drain and the step can be destroyed. Peers stop too.
    if (ds.ipc != nullptr) ds.ipc->Abort();  // its device waits return at once
    std::string outcome = ". Aborted the device transport";
    if (device_ != nullptr && !device_->Abort()) {
      device_abort_unfinished_ = true;
      absl::StrAppend(&outcome,
                      " (its teardown is still running after 2 s: NCCL finishes it only once every CUDA "
                      "graph that captured this group's collectives is destroyed; their device buffers "
                      "stay allocated)");
    }
    failed = absl::Status(failed.code(), absl::StrCat(failed.message(), outcome));
    (void)Abort(std::string(failed.message()));
    return failed;
  }
#else
  (void)event;
  (void)what;
  (void)deadline;
  return absl::OkStatus();
#endif
}

absl::Status ProcessGroup::WaitStream(const Stream& stream, absl::Time deadline) {
  if (stream.native() == nullptr) return absl::OkStatus();
  if (device_ != nullptr) SG_RETURN_IF_ERROR(device_->Flush());
  return DrainDeviceStream(stream, deadline, "device work");
}

absl::Status ProcessGroup::DrainDeviceStream(const Stream& stream, absl::Time deadline, absl::string_view what) {
#ifdef SG_WITH_CUDA
  DeviceState& ds = *device_state_;
  if (ds.waited == nullptr) SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ds.waited, cudaEventDisableTiming));
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(ds.waited, Native(stream)));
  return WaitDeviceEvent(ds.waited, what, deadline);
#else
  (void)stream;
  (void)deadline;
  (void)what;
  return absl::OkStatus();
#endif
}

absl::Status ProcessGroup::SynchronizeDevice(absl::Time deadline) {
#ifdef SG_WITH_CUDA
  if (device_ != nullptr) SG_RETURN_IF_ERROR(device_->Flush());
  if (device_state_->last == nullptr) return absl::OkStatus();
  return WaitDeviceEvent(device_state_->last, "device collectives", deadline);
#else
  (void)deadline;
  return absl::OkStatus();
#endif
}

namespace {

// The ring specs of ring.h for rank r of n (see the table there).
internal::RingSpec RingBase(Transport* t, const std::vector<int>& members, int r, char* buf,
                            DType dtype, const std::vector<int64_t>& counts) {
  const int n = int(members.size());
  internal::RingSpec s;
  s.transport = t;
  s.prev = members[size_t(Mod(r - 1, n))];
  s.next = members[size_t(Mod(r + 1, n))];
  s.buf = buf;
  s.dtype = dtype;
  s.segments = Segments(counts);
  return s;
}

// Device chunk size in elements (ProcessGroupOptions). Identical on every rank: it depends only on
// the segment sizes, the dtype and `pipelined`. Unpipelined rings (n = 2 all-gather and broadcast:
// nothing is reduced or forwarded, so no chunk waits for another) move each segment as one chunk.
int64_t DeviceChunkElems(const ProcessGroupOptions& o, const std::vector<int64_t>& counts,
                         DType dtype, bool pipelined) {
  int64_t longest = 1;
  for (int64_t c : counts) longest = std::max(longest, c);
  if (!pipelined) return longest;
  const int64_t esize = SizeOf(dtype);
  const int64_t min_chunk = std::max<int64_t>(1, o.device_chunk_bytes / esize);
  const int64_t max_chunk = std::max(min_chunk, o.device_max_chunk_bytes / esize);
  const int64_t target = (longest + std::max(1, o.device_chunks) - 1) / std::max(1, o.device_chunks);
  // Never more than the longest segment: the scratch (window x chunk) stays small for small tensors.
  return std::min(longest, std::min(max_chunk, std::max(min_chunk, target)));
}

}  // namespace

absl::Status ProcessGroup::RingReduceScatter(OpState& op, Transport* t, char* buf, DType dtype,
                                             const std::vector<int64_t>& counts, ReduceOp rop,
                                             const char* src, char* final_out, float final_scale) {
  // Steps (rank r of n):
  //  1. send segment r-1 to the next rank;
  //  2. for s = 0 .. n-2: receive segment r-s-2 from the previous rank, reduce it into ours, and
  //     (for s < n-2) pass it on; chunk by chunk, so all steps overlap;
  //  3. segment r now holds the reduction over all ranks.
  const int n = size(), r = rank_;
  internal::RingSpec s = RingBase(t, members_, r, buf, dtype, counts);
  s.send_first = true;
  s.send_segment0 = Mod(r - 1, n);
  s.recv_steps = n - 1;
  s.recv_segment = [=](int step) { return Mod(r - step - 2, n); };
  s.forward = [=](int step) { return step < n - 2; };
  s.reduce = true;
  s.op = rop;
  if (t->stream() == nullptr) {
    s.chunk_elems = std::max<int64_t>(1, options_.host_chunk_bytes / SizeOf(dtype));
    s.window = options_.host_window;
    return internal::RunRingHost(s, op);
  }
  s.chunk_elems = DeviceChunkElems(options_, counts, dtype, /*pipelined=*/true);
  s.window = std::max(2, options_.device_window);
  s.src = src;
  s.final_out = final_out;
  s.final_scale = final_scale;
  int64_t chunk_elems = 0;
  internal::ChunkCount(s, &chunk_elems, 1u << 30);
  SG_RETURN_IF_ERROR(EnsureDeviceState(t, chunk_elems * s.window * SizeOf(dtype), op.deadline));
  return internal::RunRingDevice(s, *device_state_->reduce_stream, device_state_->scratch.view().raw(),
                                 device_state_->events);
}

absl::Status ProcessGroup::RingAllGather(OpState& op, Transport* t, char* buf, DType dtype,
                                         const std::vector<int64_t>& counts, const char* send0) {
  // Steps (rank r of n), segment r already in place:
  //  1. send segment r to the next rank;
  //  2. for s = 0 .. n-2: receive segment r-s-1 from the previous rank in place and (for s < n-2)
  //     pass each chunk on as soon as it lands.
  const int n = size(), r = rank_;
  internal::RingSpec s = RingBase(t, members_, r, buf, dtype, counts);
  s.send_first = true;
  s.send_segment0 = r;
  s.recv_steps = n - 1;
  s.recv_segment = [=](int step) { return Mod(r - step - 1, n); };
  s.forward = [=](int step) { return step < n - 2; };
  if (t->stream() == nullptr) {
    s.chunk_elems = std::max<int64_t>(1, options_.host_chunk_bytes / SizeOf(dtype));
    s.window = 1 << 20;  // receives land in place: no scratch limits them
    return internal::RunRingHost(s, op);
  }
  s.chunk_elems = DeviceChunkElems(options_, counts, dtype, /*pipelined=*/n > 2);
  s.window = options_.device_window;
  s.send0_data = send0;
  SG_RETURN_IF_ERROR(EnsureDeviceState(t, 0, op.deadline));
  return internal::RunRingDevice(s, *device_state_->reduce_stream, nullptr, device_state_->events);
}

// ---------------------------------------------------------------------------------------------
// The collectives. Each: argument checks, Begin (sequence number, progress key), the algorithm,
// and Fail on error (diagnostics + group abort).

absl::Status ProcessGroup::AllReduce(const TensorView& t, ReduceOp rop, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(t, "all_reduce", "tensor", true));
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(t, "all_reduce"));
  SG_ASSIGN_OR_RETURN(OpState op, Begin("all_reduce", options_.timeout));
  const int n = size();
  if (n == 1 || t.numel() == 0) return absl::OkStatus();
  // Steps: ring reduce-scatter over size() near-equal segments (sizes need not divide evenly);
  // for avg, the owner scales its segment once; ring all-gather of the segments.
  std::vector<int64_t> counts = SplitEven(t.numel(), n);
  char* buf = static_cast<char*>(t.raw());
  // On the device the avg scaling is fused into the last reduction of our segment.
  const bool device = tr->stream() != nullptr;
  const float final_scale = (device && rop == ReduceOp::kAvg) ? 1.0f / float(n) : 1.0f;
  if (device) {
    absl::StatusOr<internal::IpcRing*> ipc = EnsureIpc(tr, op);
    if (!ipc.ok()) return Fail(op, ipc.status());
    if (*ipc != nullptr) {
      absl::Status s = OrderBefore(tr, stream);
      if (s.ok()) s = (*ipc)->AllReduce(buf, t.dtype(), counts, rop, final_scale, op.seq, *tr->stream(), IpcCheck(op));
      if (s.ok()) s = OrderAfter(tr, stream);
      return s.ok() ? s : Fail(op, s);
    }
  }
  absl::Status s = OrderBefore(tr, stream);
  if (s.ok()) s = RingReduceScatter(op, tr, buf, t.dtype(), counts, rop, nullptr, nullptr, final_scale);
  if (s.ok() && rop == ReduceOp::kAvg && !device) {
    int64_t off = 0;
    for (int i = 0; i < rank_; ++i) off += counts[size_t(i)];
    void* mine = buf + off * SizeOf(t.dtype());
    s = ScaleInPlace(t.dtype(), mine, counts[size_t(rank_)], 1.0f / float(n));
  }
  if (s.ok()) s = RingAllGather(op, tr, buf, t.dtype(), counts);
  if (s.ok()) s = OrderAfter(tr, stream);
  return s.ok() ? s : Fail(op, s);
}

absl::Status ProcessGroup::ReduceScatter(const TensorView& input, const TensorView& output,
                                         ReduceOp rop, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(input, "reduce_scatter", "input", true));
  SG_RETURN_IF_ERROR(CheckTensor(output, "reduce_scatter", "output", true));
  // bf16 in, f32 out: the contributions summed in f32 (widening); otherwise one dtype.
  const bool widen = input.dtype() == DType::kBF16 && output.dtype() == DType::kF32;
  SG_CHECK_ARG((input.dtype() == output.dtype() || widen) && input.device() == output.device(), name_,
               " reduce_scatter: input ", input.ToString(), " and output ", output.ToString(),
               " must share dtype (or be bf16 and f32) and device");
  SG_CHECK_ARG(input.numel() == output.numel() * size(), name_, " reduce_scatter: input must have ",
               size(), " x output's ", output.numel(), " elements, found ", input.numel());
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(input, "reduce_scatter"));
  SG_ASSIGN_OR_RETURN(OpState op, Begin("reduce_scatter", options_.timeout));
  if (tr->stream() != nullptr) {
    absl::Status s = DeviceReduceScatter(op, tr, input, output, rop, stream);
    return s.ok() ? s : Fail(op, s);
  }
  const int n = size();
  // The ring runs in the output's dtype: a widening reduce-scatter widens the input into it.
  const DType wt = output.dtype();
  const int64_t esize = SizeOf(wt);
  // Steps (host): copy the input to a work buffer (the input is not modified), ring reduce-scatter
  // with equal segments, scale for avg, copy our segment out.
  absl::Status s = OrderBefore(tr, stream);
  Tensor host_work;
  Tensor* work = tr->stream() ? &device_state_->work : &host_work;
  const int64_t work_bytes = input.numel() * esize;
  // (A default Tensor reports the nbytes of a scalar with no memory behind it: check raw() too.)
  if (s.ok() && (work->view().raw() == nullptr || work->nbytes() < work_bytes)) {
    // Growing the device buffer: let queued work on the old one finish first.
    if (tr->stream() != nullptr) s = DrainDeviceStream(*tr->stream(), op.deadline);
    absl::StatusOr<Tensor> w = Tensor::Empty({input.numel()}, wt, input.device());
    if (s.ok()) s = w.status();
    if (s.ok()) *work = *std::move(w);
  }
  const Stream& copy_stream = tr->stream() ? *tr->stream() : stream;
  if (s.ok() && widen) {
    WidenBf16(input.raw(), static_cast<float*>(work->view().raw()), input.numel());
  } else if (s.ok()) {
    s = CopyTensor(input, TensorView(work->view().raw(), input.dtype(), {input.numel()}, input.device()),
                   copy_stream);
  }
  std::vector<int64_t> counts(size_t(n), output.numel());
  char* buf = static_cast<char*>(work->view().raw());
  if (s.ok() && n > 1 && output.numel() > 0) {
    s = RingReduceScatter(op, tr, buf, wt, counts, rop);
  }
  char* mine = buf + rank_ * output.numel() * esize;
  if (s.ok() && rop == ReduceOp::kAvg) {
    s = tr->stream() == nullptr
            ? ScaleInPlace(wt, mine, output.numel(), 1.0f / float(n))
            : ScaleInPlaceDevice(wt, mine, output.numel(), 1.0f / float(n), *tr->stream());
  }
  if (s.ok()) {
    s = CopyTensor(TensorView(mine, wt, {output.numel()}, input.device()),
                   TensorView(output.raw(), output.dtype(), {output.numel()}, output.device()),
                   copy_stream);
  }
  if (s.ok()) s = OrderAfter(tr, stream);
  return s.ok() ? s : Fail(op, s);
}

// Steps (device): ring reduce-scatter reading the input in place (sends and reductions take our
// contribution from it) and writing segment r's final sum, scaled for avg, straight into the
// output: no copy of the input, no copy out. Partial sums that are passed on (n > 2) go to a work
// buffer kept across calls.
absl::Status ProcessGroup::DeviceReduceScatter(OpState& op, Transport* tr, const TensorView& input,
                                               const TensorView& output, ReduceOp rop,
                                               const Stream& stream) {
  const int n = size();
  const bool widen = input.dtype() != output.dtype();  // bf16 in, f32 out (checked by the caller)
  SG_RETURN_IF_ERROR(OrderBefore(tr, stream));
  if (output.numel() == 0) return OrderAfter(tr, stream);
  if (n == 1) {
    if (widen) {
      SG_RETURN_IF_ERROR(WidenBf16Device(input.raw(), static_cast<float*>(output.raw()), output.numel(), 1.0f,
                                         *tr->stream()));
    } else {
      SG_RETURN_IF_ERROR(CopyTensor(TensorView(input.raw(), input.dtype(), {input.numel()}, input.device()),
                                    TensorView(output.raw(), output.dtype(), {output.numel()}, output.device()),
                                    *tr->stream()));
    }
    return OrderAfter(tr, stream);
  }
  if (n == 2) {
    SG_ASSIGN_OR_RETURN(internal::IpcRing * ipc, EnsureIpc(tr, op));
    if (ipc != nullptr) {
      SG_RETURN_IF_ERROR(ipc->ReduceScatter(static_cast<const char*>(input.raw()), static_cast<char*>(output.raw()),
                                            input.dtype(), output.numel(), rop,
                                            rop == ReduceOp::kAvg ? 0.5f : 1.0f, op.seq, *tr->stream(), IpcCheck(op),
                                            output.dtype()));
      return OrderAfter(tr, stream);
    }
  }
  // The ring engine reduces one dtype: a widening reduce-scatter first widens the whole input into
  // the work buffer (f32) and runs the ring over it in place (no separate source); only the IPC path
  // above keeps bf16 on the wire. Otherwise partial sums that are passed on (n > 2) go to the work
  // buffer, and n = 2 has no intermediate step: the engine never writes buf (only final_out) and
  // reads our contribution through `src`.
  const DType wt = output.dtype();
  char* work = static_cast<char*>(const_cast<void*>(input.raw()));
  const char* src = work;
  if (widen || n > 2) {
    Tensor& w = device_state_->work;
    const int64_t bytes = input.numel() * int64_t(SizeOf(wt));
    if (w.view().raw() == nullptr || w.nbytes() < bytes) {
      SG_RETURN_IF_ERROR(CheckGrowable(tr, "reduce-scatter work buffer", w.view().raw() ? w.nbytes() : 0, bytes));
      // Growing the buffer: queued work on the old one must finish before it is freed.
      SG_RETURN_IF_ERROR(DrainDeviceStream(*tr->stream(), op.deadline));
      if (device_state_->captured) device_state_->retired.push_back(std::move(w));
      SG_ASSIGN_OR_RETURN(w, Tensor::Empty({input.numel()}, wt, input.device()));
    }
    work = static_cast<char*>(w.view().raw());
  }
  if (widen) {
    SG_RETURN_IF_ERROR(WidenBf16Device(input.raw(), reinterpret_cast<float*>(work), input.numel(), 1.0f, *tr->stream()));
    src = nullptr;
  }
  std::vector<int64_t> counts(size_t(n), output.numel());
  const float final_scale = rop == ReduceOp::kAvg ? 1.0f / float(n) : 1.0f;
  SG_RETURN_IF_ERROR(RingReduceScatter(op, tr, work, wt, counts, rop, src, static_cast<char*>(output.raw()),
                                       final_scale));
  return OrderAfter(tr, stream);
}

absl::Status ProcessGroup::AllGather(const TensorView& input, const TensorView& output,
                                     const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(input, "all_gather", "input", false));
  SG_RETURN_IF_ERROR(CheckTensor(output, "all_gather", "output", false));
  SG_CHECK_ARG(input.dtype() == output.dtype() && input.device() == output.device(), name_,
               " all_gather: input ", input.ToString(), " and output ", output.ToString(),
               " must share dtype and device");
  SG_CHECK_ARG(output.numel() == input.numel() * size(), name_, " all_gather: output must have ",
               size(), " x input's ", input.numel(), " elements, found ", output.numel());
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(input, "all_gather"));
  SG_ASSIGN_OR_RETURN(OpState op, Begin("all_gather", options_.timeout));
  // Steps: put our input in block `rank` of the output, then ring all-gather the blocks. On the
  // device the copy runs on a side stream while the transfers send our block from the input.
  const int64_t esize = SizeOf(input.dtype());
  char* buf = static_cast<char*>(output.raw());
  if (tr->stream() != nullptr && size() > 1 && input.numel() > 0) {
    absl::Status s = DeviceAllGather(op, tr, input, output, stream);
    return s.ok() ? s : Fail(op, s);
  }
  absl::Status s = OrderBefore(tr, stream);
  const Stream& copy_stream = tr->stream() ? *tr->stream() : stream;
  if (s.ok()) {
    s = CopyTensor(TensorView(input.raw(), input.dtype(), {input.numel()}, input.device()),
                   TensorView(buf + rank_ * input.numel() * esize, input.dtype(), {input.numel()},
                              input.device()),
                   copy_stream);
  }
  std::vector<int64_t> counts(size_t(size()), input.numel());
  if (s.ok() && size() > 1 && input.numel() > 0) {
    s = RingAllGather(op, tr, buf, input.dtype(), counts);
  }
  if (s.ok()) s = OrderAfter(tr, stream);
  return s.ok() ? s : Fail(op, s);
}

absl::Status ProcessGroup::DeviceAllGather(OpState& op, Transport* tr, const TensorView& input,
                                           const TensorView& output, const Stream& stream) {
  const int64_t block = input.numel() * SizeOf(input.dtype());
  char* buf = static_cast<char*>(output.raw());
  char* mine = buf + rank_ * block;
  SG_RETURN_IF_ERROR(OrderBefore(tr, stream));
  SG_ASSIGN_OR_RETURN(internal::IpcRing * ipc, EnsureIpc(tr, op));
  SG_RETURN_IF_ERROR(EnsureDeviceState(tr, 0, op.deadline));
  const Stream& side = *device_state_->reduce_stream;
  const bool copy = input.raw() != mine;  // in-place callers already hold their block there
#ifdef SG_WITH_CUDA
  cudaEvent_t copied = nullptr;
  if (copy) {
    // Fork the side stream from the comm stream and join it back below (capture-safe).
    SG_ASSIGN_OR_RETURN(cudaEvent_t fork, NextEvent(device_state_->events));
    SG_ASSIGN_OR_RETURN(copied, NextEvent(device_state_->events));
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork, Native(*tr->stream())));
    SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Native(side), fork, 0));
    SG_RETURN_IF_ERROR(CopyTensor(TensorView(input.raw(), input.dtype(), {input.numel()}, input.device()),
                                  TensorView(mine, input.dtype(), {input.numel()}, input.device()), side));
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied, Native(side)));
  }
#else
  (void)side;
  (void)copy;
#endif
  if (ipc != nullptr) {  // our block is the side stream's copy, overlapping the pulls
    SG_RETURN_IF_ERROR(ipc->AllGather(static_cast<const char*>(input.raw()), buf, block, op.seq, *tr->stream(),
                                      IpcCheck(op), /*copy_own=*/false));
  } else {
    std::vector<int64_t> counts(size_t(size()), input.numel());
    SG_RETURN_IF_ERROR(RingAllGather(op, tr, buf, input.dtype(), counts, static_cast<const char*>(input.raw())));
  }
#ifdef SG_WITH_CUDA
  if (copy) SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Native(*tr->stream()), copied, 0));
#endif
  return OrderAfter(tr, stream);
}

absl::Status ProcessGroup::Broadcast(const TensorView& t, int root, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(t, "broadcast", "tensor", false));
  SG_CHECK_ARG(root >= 0 && root < size(), name_, " broadcast: root must be in [0, ", size(),
               "), found ", root);
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(t, "broadcast"));
  SG_ASSIGN_OR_RETURN(OpState op, Begin("broadcast", options_.timeout));
  const int n = size();
  if (n == 1 || t.numel() == 0) return absl::OkStatus();
  // Steps: a chain root -> root+1 -> ... -> root-1; each rank forwards every chunk as soon as it
  // arrives, so the chain is pipelined (time ~ size/bandwidth + (n-2) chunk latencies).
  const int p = Mod(rank_ - root, n);
  internal::RingSpec s = RingBase(tr, members_, rank_, static_cast<char*>(t.raw()), t.dtype(),
                                  {t.numel()});
  s.chain = true;
  s.send_first = p == 0;
  s.send_segment0 = 0;
  s.recv_steps = p > 0 ? 1 : 0;
  s.recv_segment = [](int) { return 0; };
  s.forward = [=](int) { return p < n - 1; };
  absl::Status st = OrderBefore(tr, stream);
  if (st.ok() && tr->stream() == nullptr) {
    s.chunk_elems = std::max<int64_t>(1, options_.host_chunk_bytes / SizeOf(t.dtype()));
    s.window = 1 << 20;
    st = internal::RunRingHost(s, op);
  } else if (st.ok()) {
    s.chunk_elems = DeviceChunkElems(options_, {t.numel()}, t.dtype(), /*pipelined=*/n > 2);
    s.window = options_.device_window;
    st = EnsureDeviceState(tr, 0, op.deadline);
    if (st.ok()) st = internal::RunRingDevice(s, *device_state_->reduce_stream, nullptr, device_state_->events);
  }
  if (st.ok()) st = OrderAfter(tr, stream);
  return st.ok() ? st : Fail(op, st);
}

absl::Status ProcessGroup::AllToAll(const TensorView& input, const TensorView& output,
                                    const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(input, "all_to_all", "input", false));
  SG_RETURN_IF_ERROR(CheckTensor(output, "all_to_all", "output", false));
  SG_CHECK_ARG(input.dtype() == output.dtype() && input.device() == output.device() &&
                   input.numel() == output.numel(),
               name_, " all_to_all: input ", input.ToString(), " and output ", output.ToString(),
               " must share dtype, device and element count");
  SG_CHECK_ARG(input.numel() % size() == 0, name_, " all_to_all: element count must be a multiple ",
               "of the group size ", size(), ", found ", input.numel());
  SG_ASSIGN_OR_RETURN(Transport * tr, TransportFor(input, "all_to_all"));
  SG_ASSIGN_OR_RETURN(OpState op, Begin("all_to_all", options_.timeout));
  const int n = size();
  const int64_t block = input.numel() / n * SizeOf(input.dtype());
  const char* in = static_cast<const char*>(input.raw());
  char* out = static_cast<char*>(output.raw());
  // Steps: copy our own block; then, in one batch, receive block i from every rank i and send block
  // j to every rank j, pairing step k's send to rank+k with the receive from rank-k.
  absl::Status s = OrderBefore(tr, stream);
  const Stream& copy_stream = tr->stream() ? *tr->stream() : stream;
  auto bytes_view = [&](const char* p) {
    return TensorView(const_cast<char*>(p), DType::kF32, {block / 4}, input.device());
  };
  if (s.ok() && block > 0) {
    if (block % 4 == 0) {
      s = CopyTensor(bytes_view(in + rank_ * block), bytes_view(out + rank_ * block), copy_stream);
    } else {
      TensorView src(const_cast<char*>(in + rank_ * block), input.dtype(),
                     {input.numel() / n}, input.device());
      TensorView dst(out + rank_ * block, input.dtype(), {input.numel() / n}, input.device());
      s = CopyTensor(src, dst, copy_stream);
    }
  }
  std::vector<std::unique_ptr<TransportRequest>> reqs;
  std::vector<int> peers;
  if (s.ok() && n > 1 && block > 0) s = tr->GroupStart();
  for (int k = 1; s.ok() && k < n && block > 0; ++k) {
    int to = Mod(rank_ + k, n), from = Mod(rank_ - k, n);
    absl::StatusOr<std::unique_ptr<TransportRequest>> r =
        tr->IRecv(members_[size_t(from)], op.Tag(0), out + from * block, size_t(block));
    s = r.status();
    if (!s.ok()) break;
    reqs.push_back(*std::move(r));
    peers.push_back(members_[size_t(from)]);
    r = tr->ISend(members_[size_t(to)], op.Tag(0), in + to * block, size_t(block));
    s = r.status();
    if (!s.ok()) break;
    reqs.push_back(*std::move(r));
    peers.push_back(members_[size_t(to)]);
  }
  if (s.ok() && n > 1 && block > 0) s = tr->GroupEnd();
  // Host transports complete on the host; device requests complete with the comm stream.
  if (s.ok() && tr->stream() == nullptr) s = WaitAll(op, reqs, peers);
  if (s.ok()) s = OrderAfter(tr, stream);
  return s.ok() ? s : Fail(op, s);
}

absl::Status ProcessGroup::Barrier() {
  // An all-reduce of one element over the host transport: nobody leaves before everyone arrived.
  float one = 1.0f;
  return AllReduce(TensorView(&one, DType::kF32, {1}, Device::Cpu()), ReduceOp::kSum);
}

// ---------------------------------------------------------------------------------------------
// NCCL's native collectives.

#ifdef SG_WITH_NCCL
namespace {

absl::StatusOr<ncclDataType_t> NcclType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("NCCL collective: unsupported dtype ", DTypeName(t)));
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

}  // namespace
#endif

namespace {

absl::StatusOr<NcclTransport*> NativeTransport(Transport* device, const TensorView& t,
                                               int group_size, const std::string& name,
                                               absl::string_view op) {
  SG_CHECK_ARG(device != nullptr && device->name() == "nccl" && device->device() == t.device(),
               name, " ", op, ": needs an NCCL transport on ", t.device().ToString());
  SG_CHECK_ARG(group_size == device->world_size(), name, " ", op,
               ": NCCL native collectives run on the full group only (", device->world_size(),
               " ranks), this group has ", group_size);
  return static_cast<NcclTransport*>(device);
}

}  // namespace

// The one body of the Native* collectives: begun with the group's deadline, issued by `issue`
// (given the ncclComm_t and the transport's cudaStream_t, returning its ncclResult_t) between
// OrderBefore and OrderAfter of `stream`, and any failure reported through Fail.
absl::Status ProcessGroup::RunNative(NcclTransport* nt, absl::string_view op_name, absl::string_view nccl_call,
                                     const std::function<int(void* comm, void* stream)>& issue,
                                     const Stream& stream) {
#ifdef SG_WITH_NCCL
  SG_ASSIGN_OR_RETURN(OpState op, Begin(op_name, options_.timeout));
  const absl::StatusOr<void*> comm = nt->comm();
  absl::Status s = comm.ok() ? OrderBefore(nt, stream) : comm.status();
  if (s.ok()) {
    const auto rc = static_cast<ncclResult_t>(issue(*comm, nt->stream()->native()));
    if (rc != ncclSuccess && rc != ncclInProgress) {
      s = absl::InternalError(absl::StrCat(nccl_call, ": ", ncclGetErrorString(rc)));
    }
  }
  if (s.ok()) s = nt->WaitIssued(op.deadline, nccl_call);
  if (s.ok()) s = OrderAfter(nt, stream);
  return s.ok() ? s : Fail(op, s);
#else
  (void)nt, (void)op_name, (void)nccl_call, (void)issue, (void)stream;
  return absl::FailedPreconditionError("built without NCCL");
#endif
}

absl::Status ProcessGroup::NativeAllReduce(const TensorView& t, ReduceOp rop, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(t, "nccl_all_reduce", "tensor", true));
  SG_ASSIGN_OR_RETURN(NcclTransport * nt, NativeTransport(device_, t, size(), name_, "nccl_all_reduce"));
#ifdef SG_WITH_NCCL
  SG_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t.dtype()));
  auto issue = [&](void* comm, void* s) {
    return int(ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), type, NcclOp(rop), static_cast<ncclComm_t>(comm),
                             static_cast<cudaStream_t>(s)));
  };
#else
  std::function<int(void*, void*)> issue;
#endif
  return RunNative(nt, "nccl_all_reduce", "ncclAllReduce", issue, stream);
}

absl::Status ProcessGroup::NativeReduceScatter(const TensorView& input, const TensorView& output,
                                               ReduceOp rop, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(input, "nccl_reduce_scatter", "input", true));
  SG_CHECK_ARG(input.numel() == output.numel() * size() && input.dtype() == output.dtype(), name_,
               " nccl_reduce_scatter: input ", input.ToString(), " must be ", size(),
               " x output ", output.ToString());
  SG_ASSIGN_OR_RETURN(NcclTransport * nt,
                      NativeTransport(device_, input, size(), name_, "nccl_reduce_scatter"));
#ifdef SG_WITH_NCCL
  SG_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(input.dtype()));
  auto issue = [&](void* comm, void* s) {
    return int(ncclReduceScatter(input.raw(), output.raw(), size_t(output.numel()), type, NcclOp(rop),
                                 static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(s)));
  };
#else
  std::function<int(void*, void*)> issue;
#endif
  return RunNative(nt, "nccl_reduce_scatter", "ncclReduceScatter", issue, stream);
}

absl::Status ProcessGroup::NativeAllGather(const TensorView& input, const TensorView& output,
                                           const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckTensor(input, "nccl_all_gather", "input", false));
  SG_CHECK_ARG(output.numel() == input.numel() * size() && input.dtype() == output.dtype(), name_,
               " nccl_all_gather: output ", output.ToString(), " must be ", size(), " x input ",
               input.ToString());
  SG_ASSIGN_OR_RETURN(NcclTransport * nt,
                      NativeTransport(device_, input, size(), name_, "nccl_all_gather"));
#ifdef SG_WITH_NCCL
  auto issue = [&](void* comm, void* s) {
    return int(ncclAllGather(input.raw(), output.raw(), size_t(input.nbytes()), ncclUint8,
                             static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(s)));
  };
#else
  std::function<int(void*, void*)> issue;
#endif
  return RunNative(nt, "nccl_all_gather", "ncclAllGather", issue, stream);
}

}  // namespace sg::comm
