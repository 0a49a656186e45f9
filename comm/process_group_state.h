// Internal to the process group: the state of a running collective (the ring engines' OpContext)
// and the per-group device resources. Shared by process_group.cc and collectives.cc.
#ifndef SGTRAIN_COMM_PROCESS_GROUP_STATE_H_
#define SGTRAIN_COMM_PROCESS_GROUP_STATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/ipc_ring.h"
#include "comm/process_group.h"
#include "comm/ring.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::comm {

// Message tags (48 bits): bit 47 marks collective traffic; bits 40-46 the group; for collectives
// bits 20-39 the sequence number (mod 2^20) and bits 0-19 the message within the collective; for
// Send/Recv bits 0-39 the user's tag.
inline constexpr uint64_t kCollectiveBit = uint64_t(1) << 47;
inline constexpr int kGroupShift = 40;
inline constexpr uint64_t kMaxUserTag = (uint64_t(1) << kGroupShift) - 1;

struct ProcessGroup::OpState : internal::OpContext {
  ProcessGroup* pg = nullptr;
  std::string op;
  int64_t seq = 0;
  absl::Time start, deadline;
  absl::Time next_abort_check;

  uint64_t Tag(uint32_t index) const override {
    return kCollectiveBit | (pg->group_id_ << kGroupShift) | ((uint64_t(seq) & 0xfffff) << 20) |
           (index & 0xfffff);
  }
  // The host-side wait of the IPC path (a peer's buffers in the mailbox): deadline, then abort.
  absl::Status CheckHostWait() {
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", absl::FormatDuration(now - start), " waiting for a peer's buffers (IPC mailbox)"));
    }
    if (now >= next_abort_check) {
      next_abort_check = now + absl::Milliseconds(100);
      return pg->CheckAbort(*this);
    }
    return absl::OkStatus();
  }
  absl::Status Check(const TransportRequest& waiting_on, int peer) override {
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", absl::FormatDuration(now - start), " waiting for rank ", peer,
          " (", waiting_on.Describe(), ")"));
    }
    if (now >= next_abort_check) {
      next_abort_check = now + absl::Milliseconds(100);
      return pg->CheckAbort(*this);
    }
    return absl::OkStatus();
  }
};

struct ProcessGroup::DeviceState {
  std::unique_ptr<Stream> reduce_stream;
  Tensor scratch;
  // Reduce-scatter's device work buffer, kept across calls: queued comm-stream work may still use
  // it when the call returns, so it must not go back to the allocator then.
  Tensor work;
  // Once a collective of this group has been captured into a CUDA graph, a buffer that grows is
  // kept here instead of freed: the graph may still read or write the old one at every replay.
  bool captured = false;
  std::vector<Tensor> retired;
  // Every event the device collectives record and wait on, reused (ring.h): no event is created
  // or destroyed per collective, and a CUDA graph capture only records and waits.
  internal::DeviceEvents events;
  // The CUDA IPC path (ipc_ring.h), decided at the group's first device collective: null when the
  // group does not use it (ipc_why_not says why).
  bool ipc_decided = false;
  std::unique_ptr<internal::IpcRing> ipc;
  std::string ipc_why_not;
  int64_t ipc_exchanges = 0;  // SendRecv's over the IPC path so far (their mailbox numbering)
#ifdef SG_WITH_CUDA
  // The last eagerly issued device collective's completion on the comm stream (SynchronizeDevice).
  // Not recorded while the comm stream is being captured: an event last recorded in a capture
  // cannot be queried (cudaErrorCapturedEvent).
  cudaEvent_t last = nullptr;
  cudaEvent_t waited = nullptr;  // WaitStream's
  ~DeviceState() {
    if (last != nullptr) cudaEventDestroy(last);
    if (waited != nullptr) cudaEventDestroy(waited);
  }
#endif
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_PROCESS_GROUP_STATE_H_
