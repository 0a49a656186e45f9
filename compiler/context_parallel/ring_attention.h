// Ring attention (context parallelism): attention over a sequence sharded across the ranks of a
// context-parallel group. Each rank keeps its queries; key/value blocks travel around the ring
// (rank r sends to r+1, receives from r-1) while the rank computes attention on the block it holds,
// and the partial results are merged with their log-sum-exp statistics (AttentionMerge). The
// backward keeps dq local and sends a dK/dV accumulator around the ring behind the key/value
// block, so each block's gradient arrives back at its owner after cp hops.
//
//   RingAttentionOptions opt;  opt.causal = true;  opt.seq = 32768;
//   SG_RETURN_IF_ERROR(RingAttentionForward(q, k, v, opt, *cp_group, out, lse, stream));
//   SG_RETURN_IF_ERROR(RingAttentionBackward(q, k, v, out, dout, lse, opt, *cp_group, dq, dk, dv, stream));
//
// Sharding: every tensor holds this rank's rows of the load-balanced layout (cp_layout.h: chunks r
// and 2*cp-1-r of the global sequence, back to back), so with a causal mask each rank does the same
// work. q, out, dout, dq: [batch, local_seq, heads, head_dim]; k, v, dk, dv: [batch, local_seq,
// kv_heads, head_dim] (grouped-query attention as in kernels/attention); lse f32 [batch, heads,
// local_seq] with local_seq = CpLayout::LocalSeq(rank). Any global seq (uneven chunks, no padding).
// Dtypes and head dims are those of kernels/attention (CPU: f32/bf16; CUDA: bf16, 64 or 128).
//
// Overlap: the exchange of step j+1's block is started before step j's attention. On CUDA the
// exchange runs on the device transport's stream, ordered against `stream` by events
// (ProcessGroup::SendRecv / OrderAfterP2P), and the host never waits for the device. On the CPU
// the receive and send are posted (UCX) before computing and progressed between blocks.
//
// Collective over cp_group: every rank calls it with the same options and shapes (but its own
// rows). Errors: InvalidArgument naming the mismatched tensor; DeadlineExceeded naming the ring
// step and peer when a transfer does not complete within options.timeout (host tensors).
// Not for cp = 1 callers that want speed: it works (no transfers) but calls the kernels per chunk.
#ifndef SGTRAIN_COMPILER_CONTEXT_PARALLEL_RING_ATTENTION_H_
#define SGTRAIN_COMPILER_CONTEXT_PARALLEL_RING_ATTENTION_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

struct RingAttentionOptions {
  bool causal = false;
  std::optional<double> scale;  // 1/sqrt(head_dim) when unset
  int64_t seq = 0;              // the global sequence length (required)
  // Point-to-point tags [tag, tag + 2): key/value blocks use `tag`, dK/dV accumulators tag + 1.
  // Two ring attentions in flight on one group at once need different tags.
  uint64_t tag = 1 << 20;
  absl::Duration timeout = absl::Seconds(300);  // per transfer wait (host tensors)
  // Benchmarks only: every ring step computes on the block already held and nothing is sent, so
  // the call does the same kernel work with no transfer (its results are wrong for cp > 1). The
  // time a real call takes beyond it is the exposed (not hidden) part of the transfers.
  bool skip_exchanges = false;
};

// out and lse (overwritten) of attention of this rank's queries over every key of the sequence.
absl::Status RingAttentionForward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const RingAttentionOptions& options, comm::ProcessGroup& cp_group,
                                  const TensorView& out, const TensorView& lse, const Stream& stream);

// dq, dk, dv (overwritten) of this rank's rows, given the forward's out and lse (the merged, global
// ones RingAttentionForward returned) and dout.
absl::Status RingAttentionBackward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout, const TensorView& lse,
                                   const RingAttentionOptions& options, comm::ProcessGroup& cp_group,
                                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const Stream& stream);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_CONTEXT_PARALLEL_RING_ATTENTION_H_
