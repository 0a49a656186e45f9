// Internal to comm/ipc_ring.cc: the kernels of the CUDA IPC collectives (ipc_kernels.cu).
//
// Synchronization between GPUs is by monotonic 64-bit counters in device memory that peers write
// through their IPC mapping: to signal peer p on slot k, a rank increments its local count of
// signals sent to (p, k) and stores the new value, with release semantics at system scope, into
// p's flag for (sender, k); to wait on p, a rank increments its local count of waits on (p, k) and
// spins until its flag for (p, k) reaches that count. Both counts live on the device, so a CUDA
// graph that captured the kernels stays in step at every replay. A wait gives up when the host sets
// the abort word or after `timeout_ns`: it then records why in the error words (host-mapped) and
// sets the abort word itself, so every later wait of the group returns at once instead of hanging.
#ifndef SGTRAIN_COMM_IPC_KERNELS_H_
#define SGTRAIN_COMM_IPC_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "comm/reduce.h"
#include "kernels/core/dtype.h"

namespace sg::comm::ipc {

inline constexpr int kMaxSyncs = 4;

// Error words (host-mapped int64[4]): [0] code, [1] collective sequence number, [2] peer, [3] slot.
enum ErrorCode : int64_t { kNoError = 0, kTimedOut = 1, kAborted = 2 };

struct SyncArgs {
  int nsignal = 0, nwait = 0;
  uint64_t* signal_remote[kMaxSyncs] = {};  // the peer's flag for (me, slot), through the mapping
  uint64_t* signal_count[kMaxSyncs] = {};   // local: signals sent to (peer, slot)
  const uint64_t* wait_flag[kMaxSyncs] = {};  // local: written by the peer
  uint64_t* wait_count[kMaxSyncs] = {};       // local: waits done on (peer, slot)
  int wait_peer[kMaxSyncs] = {}, wait_slot[kMaxSyncs] = {};
  volatile int* abort = nullptr;   // host-mapped, device pointer
  int64_t* error = nullptr;        // host-mapped, device pointer
  int64_t seq = 0;
  int64_t timeout_ns = 0;
};

// One tiny kernel: every signal, then every wait. `stream` is a cudaStream_t.
absl::Status LaunchSync(const SyncArgs& args, void* stream);

// out[i] = op(mine[i], theirs[i]) * scale (f32 accumulation, one rounding), where `theirs` is a
// peer's memory read over NVLink. out may alias mine. `blocks` = 0: one wave of the kernel.
absl::Status LaunchPullReduce(DType dtype, ReduceOp op, void* out, const void* mine, const void* theirs,
                              int64_t n, float scale, int blocks, void* stream);
// The same with bf16 `mine` and `theirs` and an f32 `out` (summed in f32, one rounding to f32).
absl::Status LaunchPullReduceWiden(ReduceOp op, float* out, const void* mine, const void* theirs, int64_t n,
                                   float scale, int blocks, void* stream);
// out[0, bytes) = theirs[0, bytes): a copy from a peer's memory by SM loads (or, with
// `copy_engine`, by cudaMemcpyAsync, which leaves the SMs free).
absl::Status LaunchPullCopy(void* out, const void* theirs, int64_t bytes, int blocks, bool copy_engine,
                            void* stream);

}  // namespace sg::comm::ipc

#endif  // SGTRAIN_COMM_IPC_KERNELS_H_
