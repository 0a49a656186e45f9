// A probe of how a replayed CUDA graph overlaps a chain of host-to-device copies with compute, in
// the shape of the FSDP deferred optimizer's copies back (compiler/fsdp.cc, AddDeferredUpdates):
// a compute stream runs `compute_kernels` kernels of `kernel_us` microseconds each (every SM busy);
// a copy stream copies `copies` blocks of `copy_bytes` from pinned host memory into two device
// slots in turn; with `update_kernels`, a short kernel on a third stream reads each block once it
// lands, and the copy into a slot waits for the kernel that read it before (as the copies back
// wait for the AdamW of the unit two before). Compute kernel 4 + 3 j waits for block j (as a
// unit's gather waits for its update). Returns the milliseconds from the first compute kernel's
// start to the end of all the work, on the compute stream's events; replayed from a graph captured
// from the same calls when `graph`, with the third stream at the device's greatest priority and
// node priorities kept when `priority`.
#ifndef SGTRAIN_BENCHMARKS_GRAPH_OVERLAP_GRAPH_OVERLAP_H_
#define SGTRAIN_BENCHMARKS_GRAPH_OVERLAP_GRAPH_OVERLAP_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace sg::benchmarks {

struct OverlapProbe {
  int compute_kernels = 48;
  int kernel_us = 400;
  int copies = 10;
  int64_t copy_bytes = int64_t(64) << 20;
  bool update_kernels = true;
  bool graph = false;
  bool priority = false;
  // Variants: the short kernels on the copy stream itself (no third stream), and device slots
  // (the copy into a slot waits for the kernel that read it `slots` blocks before).
  bool kernels_on_copy_stream = false;
  int slots = 2;
  // With `graph`: the copy chain enqueued eagerly before each launch of a graph that holds only the
  // compute, whose waits for the blocks are external event-wait nodes (cudaEventWaitExternal).
  bool chain_outside_graph = false;
};

// Milliseconds of one run (after one untimed run; a graph is captured and replayed once untimed
// first). FailedPrecondition without a CUDA device.
absl::StatusOr<double> RunOverlapProbe(const OverlapProbe& p);

}  // namespace sg::benchmarks

#endif  // SGTRAIN_BENCHMARKS_GRAPH_OVERLAP_GRAPH_OVERLAP_H_
