// Internal to the process group: the pipelined ring engines that every collective is built from.
//
// A ring pipeline moves segments of one buffer around a ring (or down a chain) of ranks in chunks.
// At receive step s (0 <= s < recv_steps) a rank receives segment recv_segment(s) from `prev`,
// chunk by chunk; each chunk is reduced into the buffer (reduce) or written in place, and then, if
// forward(s), sent on to `next` right away: chunk c of step s+1 leaves as soon as chunk c of step s
// has arrived, without waiting for the rest of the segment. That per-chunk forwarding is the
// pipeline. When send_first, segment send_segment0 is sent from the buffer before anything arrives.
//
//   ring reduce-scatter (n ranks, rank r):  send_first, send seg r-1; recv_steps = n-1;
//        recv_segment(s) = r-s-2 (mod n), reduce, forward(s) = s < n-2  -> rank r ends owning seg r
//   ring all-gather: send_first, send seg r; recv_segment(s) = r-s-1, forward(s) = s < n-2
//   chain broadcast from root (position p = r - root): send_first only at p = 0; recv_steps = 1 for
//        p > 0 (the whole buffer as one segment); forward(0) = p < n-1
#ifndef SGTRAIN_COMM_RING_H_
#define SGTRAIN_COMM_RING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/reduce.h"
#include "comm/transport.h"
#include "kernels/core/stream.h"

namespace sg::comm::internal {

struct Segment {
  int64_t offset = 0;  // elements
  int64_t count = 0;
};

// What the engines need from the collective that runs them: message tags and a periodic check
// (deadline, abort flag) while waiting.
class OpContext {
 public:
  virtual ~OpContext() = default;
  // The transport tag of message `index` of this operation (unique within it).
  virtual uint64_t Tag(uint32_t index) const = 0;
  // Called while waiting on a message from/to `peer` (a transport rank); an error ends the operation.
  virtual absl::Status Check(const TransportRequest& waiting_on, int peer) = 0;
};

struct RingSpec {
  Transport* transport = nullptr;
  int prev = -1, next = -1;  // transport ranks
  char* buf = nullptr;
  DType dtype = DType::kF32;
  std::vector<Segment> segments;  // by segment id
  bool send_first = false;
  int send_segment0 = 0;
  int recv_steps = 0;
  std::function<int(int)> recv_segment;
  std::function<bool(int)> forward;
  // Chain: a forwarded chunk keeps its tag (each link carries each chunk once). Ring: it takes the
  // next step's tag, since one link carries a chunk position once per step.
  bool chain = false;
  bool reduce = false;
  ReduceOp op = ReduceOp::kSum;
  int64_t chunk_elems = 1;
  int window = 8;  // receives in flight (each needs a scratch chunk when reducing)

  // Device engine only; the defaults mean "everything in buf".
  // Our own contribution, indexed like buf: the step-0 send reads it and each reduction reads it as
  // its left operand, while partial sums and received chunks go to buf. Reduce-scatter points it
  // at its input, which is then never copied nor modified.
  const char* src = nullptr;
  // Where the step-0 send reads segment send_segment0 instead (all-gather's input tensor, so the
  // output's own block can be filled by a copy that overlaps the transfers).
  const char* send0_data = nullptr;
  // When reducing: the last receive step's result (our fully reduced segment) is written here,
  // indexed from the segment's start, and multiplied by final_scale (avg), instead of into buf.
  char* final_out = nullptr;
  float final_scale = 1.0f;
};

// Host memory over a host transport; returns when every send and receive is done.
absl::Status RunRingHost(const RingSpec& spec, OpContext& ctx);

// CUDA events for the device engine (cudaEvent_t as void*, ordering only), created on first use
// and reused by every later collective: the collective calls Reset() when it starts, then each
// Get() returns an event no other Get() of that collective returned. Reuse is safe because a
// cudaStreamWaitEvent waits for the record that precedes it when it is issued, not for later ones;
// it keeps event creation off the per-step host path, and inside a CUDA graph capture every event
// is only recorded and waited on (no create, destroy, query or synchronize). Without CUDA: empty.
class DeviceEvents {
 public:
  DeviceEvents() = default;
  DeviceEvents(const DeviceEvents&) = delete;
  DeviceEvents& operator=(const DeviceEvents&) = delete;
  ~DeviceEvents();
  void Reset() { next_ = 0; }
  absl::StatusOr<void*> Get();

 private:
  std::vector<void*> events_;
  size_t next_ = 0;
};

// Device memory over a device transport: enqueues the whole pipeline on the transport's stream
// (transfers) and `reduce_stream` (reductions), ordered by events from `events`, and returns
// without waiting. No host synchronization, allocation or event creation (after the first use of
// `events`) anywhere in it, so it can be captured into a CUDA graph: the reduce stream forks from
// the transport's stream and joins it again. When it returns, the transport's stream is ordered
// after all of it. `scratch` holds `window` chunks. Every chunk is one NCCL group, so chunks should
// be large (tens of MiB): each group pays a kernel launch and NCCL's per-operation ramp-up.
absl::Status RunRingDevice(const RingSpec& spec, const Stream& reduce_stream, void* scratch, DeviceEvents& events);

// The number of chunks per segment and the chunk size actually used (grown so that message indices
// fit in `max_index`).
int64_t ChunkCount(const RingSpec& spec, int64_t* chunk_elems, uint32_t max_index);

}  // namespace sg::comm::internal

#endif  // SGTRAIN_COMM_RING_H_
