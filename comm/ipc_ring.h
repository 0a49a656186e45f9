// Internal to the process group: the device collectives over CUDA IPC, for groups whose members
// share a host and whose neighbouring GPUs can reach each other's memory (NVLink on the H200s).
//
// The same ring as ring.h, with one difference in the primitive: instead of a receive into scratch
// followed by a separate reduction kernel (three passes over each chunk in HBM), a rank *pulls*:
// one kernel loads its ring predecessor's segment straight from that GPU's memory, adds its own and
// writes the sum, so each chunk is read once over NVLink and once locally, and written once, which
// is the traffic NCCL's fused kernels have. All-gather steps pull copies the same way. Buffers are
// the callers' tensors themselves, no staging: before each collective the members exchange their
// buffers' IPC handles (allocation handle + offset) through a shared-memory mailbox on the host,
// microseconds, and each rank maps a peer allocation once (cached by handle).
//
// Ordering between GPUs uses device-side counters (ipc_kernels.h), so the enqueued work needs no
// host synchronization and can be captured into a CUDA graph and replayed. A wait that outlives the
// group's timeout, or the host's Abort(), ends in the device and is reported by Error(): a peer that
// dies or never launches its part cannot hang this rank's stream.
//
//   std::string why_not;
//   SG_ASSIGN_OR_RETURN(auto ring, IpcRing::Create(store, "grp/ipc", rank, n, dev, true, cfg, dl, &why_not));
//   if (ring) SG_RETURN_IF_ERROR(ring->AllReduce(buf, DType::kF32, counts, ReduceOp::kSum, 1.0f, seq,
//                                                 comm_stream, check));
#ifndef SGTRAIN_COMM_IPC_RING_H_
#define SGTRAIN_COMM_IPC_RING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/reduce.h"
#include "comm/store.h"
#include "kernels/core/device.h"
#include "kernels/core/stream.h"

namespace sg::comm::internal {

struct IpcConfig {
  absl::Duration timeout = absl::Seconds(300);  // a device-side wait gives up after this
  // The reduction kernels' grid (0 = one full wave). 32 blocks reach the same bandwidth as a full
  // wave on 2 H200s (2026-11-30, benchmarks/README.md) and leave the other SMs to the compute the
  // collective overlaps with.
  int blocks = 32;
  // Copies (all-gather steps) by the copy engines (cudaMemcpyAsync from the peer's memory): faster
  // than SM loads there (616 vs 568 GB/s all-gather at 1 GiB) and no SM at all.
  bool copy_engine = true;
  // A copy-engine copy of at least 16 MiB is split into this many pieces issued on as many streams
  // (forked from and joined to the collective's stream), so several copy engines pull at once.
  // 2 and 4 were no faster than 1 on 2 H200s (2026-11-30: one pull already fills the link).
  int copy_splits = 1;
  // Groups larger than this keep the NCCL ring (Create says why): the n-member ring runs on
  // 2-GPU machines only as ipc_ring_test's several processes per GPU, so the process group
  // uses it for 2 members until a machine with more GPUs has run it.
  int max_members = 2;
};

// Called now and then while the host waits for a peer's mailbox entry: an error (deadline passed,
// group aborted) ends the wait with that error.
using IpcCheck = std::function<absl::Status()>;

class IpcRing {
 public:
  // Collective: every member of the group calls it, with the same `key` (a store prefix unique to
  // the group). `wanted`: this rank asks for the IPC path. Returns nullptr, with the reason in
  // *why_not, when the group cannot use it (a member did not ask, members on different hosts, no
  // peer access between ring neighbours, built without CUDA); every member gets the same answer.
  static absl::StatusOr<std::unique_ptr<IpcRing>> Create(StoreClient& store, const std::string& key, int rank,
                                                         int size, Device device, bool wanted, IpcConfig config,
                                                         absl::Time deadline, std::string* why_not);
  ~IpcRing();
  IpcRing(const IpcRing&) = delete;
  IpcRing& operator=(const IpcRing&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Each enqueues the collective on `stream` and returns; `seq` is the group's sequence number of
  // the collective (the same on every member). `check` bounds the host-side handle exchange.
  //
  // In place over `buf`, split into size() segments of counts[i] elements; the last reduction of
  // our segment is multiplied by final_scale (avg).
  absl::Status AllReduce(char* buf, DType dtype, const std::vector<int64_t>& counts, ReduceOp op,
                         float final_scale, int64_t seq, const Stream& stream, const IpcCheck& check);
  // Two members only: out (count elements) = op(input block rank, the peer's input block rank) *
  // scale. The input is not modified. `out_dtype` f32 with a bf16 `dtype`: the bf16 blocks summed
  // in f32 into an f32 out (bf16 on the wire); otherwise it must equal `dtype`.
  absl::Status ReduceScatter(const char* input, char* out, DType dtype, int64_t count, ReduceOp op, float scale,
                             int64_t seq, const Stream& stream, const IpcCheck& check, DType out_dtype);
  // out block r (block_bytes each) = member r's input. With copy_own false the caller copies our
  // own block (e.g. on a side stream, overlapping the pulls).
  absl::Status AllGather(const char* input, char* out, int64_t block_bytes, int64_t seq, const Stream& stream,
                         const IpcCheck& check, bool copy_own = true);
  // Two members only: sends `send` to the other member and receives its send into `recv` (each
  // pulls the other's buffer by the copy engines); `seq` numbers the exchanges of this group
  // (separately from the collectives). InvalidArgument when the sizes differ.
  absl::Status Exchange(const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes, int64_t seq,
                        const Stream& stream, const IpcCheck& check);

  // The first failure a device-side wait recorded (timeout or abort), naming the collective's
  // sequence number and the member waited on; OK when none.
  absl::Status Error() const;
  // Makes every device-side wait of this group, queued or running, return at once (marked as
  // aborted): the host's way out when a peer is gone.
  void Abort();

  struct Impl;

 private:
  IpcRing() = default;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sg::comm::internal

#endif  // SGTRAIN_COMM_IPC_RING_H_
