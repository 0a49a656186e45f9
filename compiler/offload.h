// Activation offloading for the lowering (LowerOptions::offload_activations): forward values the
// backward reads after a long gap are copied to host memory once produced, their arena slot freed
// after the forward's last reader, and copied back into a second slot some nodes before the
// backward's first reader. The copies run on the executor's copy stream (Step::stream 2), ordered
// against compute by events, so a captured CUDA graph holds them too.
//
//   std::vector<ActivationOffload> o = ChooseOffloads(graph, root, bytes, offloadable, 20, kOffloadLead);
//   // slot A: [o.producer, o.wait_at], slot B: [o.reload_at, last reader]
#ifndef SGTRAIN_COMPILER_OFFLOAD_H_
#define SGTRAIN_COMPILER_OFFLOAD_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

// Nodes between a copy's issue and the compute wait for it (about a transformer layer's forward;
// half a layer's recomputed backward): the copies of 64 MiB take ~1.3 ms over PCIe 5.
inline constexpr int kOffloadLead = 24;
// The copy stream's modeled progress, for big copies or many of them (no recompute: the 1b's
// [8,2048,8192] bf16 FFN activations, 256 MiB, ~5 ms at ~50 GB/s): bytes a node over PCIe while
// a forward node (~0.12 ms in the 1b's step without recompute) or a backward node (~0.27 ms) runs,
// with some margin. The 7b's 64 MiB residual sums under full recompute stay within `lead`.
inline constexpr int64_t kOffloadForwardBytesPerNode = int64_t(4) << 20;
inline constexpr int64_t kOffloadBackwardBytesPerNode = int64_t(8) << 20;

struct ActivationOffload {
  int root = -1;       // the value (alias root) offloaded
  int producer = -1;   // the last forward node writing it (the copy to the host follows it)
  int fwd_last = -1;   // its last forward reader
  int bwd_first = -1;  // its first backward reader (or in-place writer)
  int wait_at = -1;    // compute waits for the copy to host before node wait_at + 1
  int reload_at = -1;  // the copy back is issued before this node
  int64_t bytes = 0;
  int64_t host_offset = 0;  // in the program's host buffer
};

// The first `count` (in producer order) arena buffers that forward nodes write and read, and only
// backward nodes read or write again after at least 2 * lead + 2 nodes (under full recompute: the
// residual sums kept at the layer boundaries, from the embedding's output on), of at least a quarter
// of the largest such buffer's bytes.
// `root[v]` is v's alias root (an in-place output's is the buffer it overwrites); `offloadable(r)`
// says whether root r may move (an arena value, not a graph output).
std::vector<ActivationOffload> ChooseOffloads(const graph::Graph& g, const std::vector<int>& root,
                                              const std::function<int64_t(int)>& bytes,
                                              const std::function<bool(int)>& offloadable, int count, int lead);

// Host memory for the copies: pinned on a CUDA device (asynchronous, capturable copies), plain
// host memory on the CPU.
absl::StatusOr<std::shared_ptr<void>> AllocateOffloadHost(Device device, int64_t bytes);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_OFFLOAD_H_
