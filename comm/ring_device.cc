// The device ring engine: the same pipeline as RunRingHost, enqueued on streams instead of driven
// by the host. Transfers run on the transport's communication stream, reductions on a separate
// reduce stream, so reducing chunk c overlaps transferring chunk c+1.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/ring.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::comm::internal {

#ifdef SG_WITH_CUDA

DeviceEvents::~DeviceEvents() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

absl::StatusOr<void*> DeviceEvents::Get() {
  if (next_ == events_.size()) {
    cudaEvent_t e;
    SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  return events_[next_++];
}

namespace {

absl::StatusOr<cudaEvent_t> NextEvent(DeviceEvents& events) {
  SG_ASSIGN_OR_RETURN(void* e, events.Get());
  return static_cast<cudaEvent_t>(e);
}

}  // namespace

// Steps (enqueue order; the GPU runs each as soon as its events allow):
//  1. For each receive step s (and one extra step for the last forwards), for each chunk c:
//     a. comm stream waits for the reduce of (s-1, c) when that chunk is forwarded now, and for the
//        reduce that last used the scratch slot that (s, c) receives into;
//     b. one NCCL group: the step-0 send (send_first), the forward of (s-1, c), the receive (s, c);
//     c. when reducing: reduce stream waits for the group, then writes op(src, scratch) into the
//        buffer (or, at the last step, into final_out, scaled) and records "reduced (s, c)".
//     The comm stream never waits for the reduction of the chunk it just received, so chunk c+1
//     transfers while chunk c is reduced.
//  2. Comm stream waits for the reduce stream's last work, so callers need only the comm stream.
absl::Status RunRingDevice(const RingSpec& spec, const Stream& reduce_stream, void* scratch,
                           DeviceEvents& events) {
  Transport& t = *spec.transport;
  const Stream* comm = t.stream();
  SG_CHECK_ARG(comm != nullptr, "device ring: transport '", t.name(), "' has no stream");
  SG_CHECK_ARG(!spec.reduce || scratch != nullptr, "device ring: reducing needs scratch");
  cudaStream_t cs = static_cast<cudaStream_t>(comm->native());
  cudaStream_t rs = static_cast<cudaStream_t>(reduce_stream.native());
  const int64_t esize = SizeOf(spec.dtype);
  int64_t chunk_elems = 0;
  const int64_t C = ChunkCount(spec, &chunk_elems, 1u << 30);
  const int window = std::max(1, spec.window);
  const char* src = spec.src != nullptr ? spec.src : spec.buf;
  auto chunk_of = [&](int seg, int64_t c) {
    const Segment& s = spec.segments[seg];
    int64_t begin = std::min(s.count, c * chunk_elems);
    int64_t end = std::min(s.count, begin + chunk_elems);
    return Segment{s.offset + begin, end - begin};
  };
  std::vector<cudaEvent_t> reduced(size_t(C), nullptr);     // last reduce of chunk c
  std::vector<cudaEvent_t> slot_free(size_t(window), nullptr);  // last reduce reading slot k
  int64_t recv_counter = 0;
  std::vector<std::unique_ptr<TransportRequest>> keep;  // requests complete with the stream

  for (int s = 0; s <= spec.recv_steps; ++s) {
    for (int64_t c = 0; c < C; ++c) {
      Segment send0 = (s == 0 && spec.send_first) ? chunk_of(spec.send_segment0, c) : Segment{};
      Segment fwd = (s > 0 && spec.forward(s - 1)) ? chunk_of(spec.recv_segment(s - 1), c) : Segment{};
      Segment rcv = s < spec.recv_steps ? chunk_of(spec.recv_segment(s), c) : Segment{};
      if (send0.count == 0 && fwd.count == 0 && rcv.count == 0) continue;
      int slot = int(recv_counter % window);
      if (fwd.count > 0 && spec.reduce && reduced[c] != nullptr) {
        SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, reduced[c], 0));
      }
      if (rcv.count > 0 && spec.reduce && slot_free[slot] != nullptr) {
        SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, slot_free[slot], 0));
      }
      char* slot_ptr = spec.reduce ? static_cast<char*>(scratch) + size_t(slot) * chunk_elems * esize
                                   : nullptr;
      SG_RETURN_IF_ERROR(t.GroupStart());
      absl::Status posted = absl::OkStatus();
      auto post = [&](absl::StatusOr<std::unique_ptr<TransportRequest>> r) {
        if (!r.ok()) {
          posted = r.status();
          return;
        }
        keep.push_back(*std::move(r));
      };
      if (send0.count > 0) {
        const int64_t in_seg = send0.offset - spec.segments[spec.send_segment0].offset;
        const char* from = spec.send0_data != nullptr ? spec.send0_data + in_seg * esize
                                                      : src + send0.offset * esize;
        post(t.ISend(spec.next, 0, from, size_t(send0.count * esize)));
      }
      if (posted.ok() && fwd.count > 0) {
        post(t.ISend(spec.next, 0, spec.buf + fwd.offset * esize, size_t(fwd.count * esize)));
      }
      if (posted.ok() && rcv.count > 0) {
        char* dst = spec.reduce ? slot_ptr : spec.buf + rcv.offset * esize;
        post(t.IRecv(spec.prev, 0, dst, size_t(rcv.count * esize)));
      }
      // Close the group even after a failed post, so the transport is not left inside one.
      absl::Status ended = t.GroupEnd();
      SG_RETURN_IF_ERROR(posted);
      SG_RETURN_IF_ERROR(ended);
      if (rcv.count > 0 && spec.reduce) {
        const bool last = s == spec.recv_steps - 1;
        const int64_t in_seg = rcv.offset - spec.segments[spec.recv_segment(s)].offset;
        char* dst = (last && spec.final_out != nullptr) ? spec.final_out + in_seg * esize
                                                        : spec.buf + rcv.offset * esize;
        SG_ASSIGN_OR_RETURN(cudaEvent_t arrived, NextEvent(events));
        SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(arrived, cs));
        SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(rs, arrived, 0));
        SG_RETURN_IF_ERROR(ReduceDevice(spec.op, spec.dtype, dst, src + rcv.offset * esize, slot_ptr,
                                        rcv.count, last ? spec.final_scale : 1.0f, reduce_stream));
        SG_ASSIGN_OR_RETURN(cudaEvent_t done, NextEvent(events));
        SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, rs));
        reduced[c] = done;
        slot_free[slot] = done;
      }
      if (rcv.count > 0) ++recv_counter;
    }
  }
  if (spec.reduce) {
    SG_ASSIGN_OR_RETURN(cudaEvent_t all, NextEvent(events));
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(all, rs));
    SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, all, 0));
  }
  return absl::OkStatus();
}

#else

DeviceEvents::~DeviceEvents() = default;
absl::StatusOr<void*> DeviceEvents::Get() { return absl::FailedPreconditionError("device events: built without CUDA"); }

absl::Status RunRingDevice(const RingSpec&, const Stream&, void*, DeviceEvents&) {
  return absl::FailedPreconditionError("device ring: built without CUDA");
}

#endif

}  // namespace sg::comm::internal
