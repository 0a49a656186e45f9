// ShardedDataParallelStep's collectives on its communication stream: the per-unit all-gathers of
// the parameters (f32, or cast to the compute dtype rank by rank) and the reduce-scatters of the
// gradients into this rank's shards (bucketed per unit, or per parameter).
#include <algorithm>
#include <utility>
#include <vector>

#include "compiler/fsdp.h"
#include "compiler/fsdp_internal.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"
#include "sharding/placement.h"

namespace sg::compiler {

absl::Status ShardedDataParallelStep::Gather(const Unit& u, bool backward, const Stream& s) {
  if ((backward ? u.bwd_dtype : u.fwd_dtype) != DType::kF32) return GatherCast(u, backward, s);
  const int P = shard_size_;
  if (Direct(u)) {
    // Rank k's rows are rows [k n/P, (k+1) n/P) of each full tensor: gather into it in place.
    for (int i : u.params) {
      const Param& p = *params_[i];
      const TensorView& full = backward ? p.full_bwd : p.full_fwd;
      if (full.raw() == nullptr) continue;
      SG_RETURN_IF_ERROR(layout_.shard == nullptr ? CopyTensor(p.shard, Flat(full, 0, p.shard.numel()), s)
                                                  : layout_.shard->AllGather(p.shard, Flat(full, 0, full.numel()), s));
    }
    return absl::OkStatus();
  }
  bool padded = false;
  for (int i : u.params) padded = padded || params_[i]->mine.length < params_[i]->chunk;
  if (padded) SG_RETURN_IF_ERROR(ZeroTensor(Flat(block_, 0, u.block), s));
  for (int i : u.params) {
    const Param& p = *params_[i];
    if (p.mine.length > 0) SG_RETURN_IF_ERROR(CopyTensor(p.shard, Flat(block_, p.pack_offset, p.shard.numel()), s));
  }
  if (layout_.shard != nullptr) {
    SG_RETURN_IF_ERROR(layout_.shard->AllGather(Flat(block_, 0, u.block), Flat(packed_, 0, u.block * P), s));
  } else {
    SG_RETURN_IF_ERROR(CopyTensor(Flat(block_, 0, u.block), Flat(packed_, 0, u.block), s));
  }
  return Unpack(u, backward, packed_, s);
}

// The unit's rank-major gathered bucket `packed` into its full parameter buffers.
absl::Status ShardedDataParallelStep::Unpack(const Unit& u, bool backward, const TensorView& packed,
                                             const Stream& s) {
  const int P = shard_size_;
  for (int k = 0; k < P; ++k) {
    for (int i : u.params) {
      const Param& p = *params_[i];
      const TensorView& full = backward ? p.full_bwd : p.full_fwd;
      const sharding::ChunkRange r = sharding::Chunk(p.rows, P, k);
      if (full.raw() == nullptr || r.length == 0) continue;
      SG_RETURN_IF_ERROR(CopyTensor(Flat(packed, k * u.block + p.pack_offset, r.length * p.row),
                                    Flat(full, r.offset * p.row, r.length * p.row), s));
    }
  }
  return absl::OkStatus();
}

// Gather in the compute dtype: this rank's f32 rows are cast straight into its own block of the
// all-gather's output (the full buffer of a Direct unit, else the packed bucket viewed as 16-bit),
// which is then gathered in place: no staging copy, half the bytes on the wire.
absl::Status ShardedDataParallelStep::GatherCast(const Unit& u, bool backward, const Stream& s) {
  const int P = shard_size_, me = shard_rank_;
  const DType t = backward ? u.bwd_dtype : u.fwd_dtype;
  if (layout_.shard == nullptr) {  // one rank: the shards are the full tensors
    for (int i : u.params) {
      const Param& p = *params_[i];
      const TensorView& full = backward ? p.full_bwd : p.full_fwd;
      if (full.raw() != nullptr) SG_RETURN_IF_ERROR(kernels::Cast(p.shard, Flat(full, 0, p.shard.numel()), s));
    }
    return absl::OkStatus();
  }
  if (Direct(u)) {
    for (int i : u.params) {
      const Param& p = *params_[i];
      const TensorView& full = backward ? p.full_bwd : p.full_fwd;
      if (full.raw() == nullptr) continue;
      const TensorView mine = Flat(full, me * p.shard.numel(), p.shard.numel());
      SG_RETURN_IF_ERROR(kernels::Cast(p.shard, mine, s));
      SG_RETURN_IF_ERROR(layout_.shard->AllGather(mine, Flat(full, 0, full.numel()), s));
    }
    return absl::OkStatus();
  }
  const TensorView packed(packed_.raw(), t, {u.block * P}, packed_.device());
  const TensorView mine = Flat(packed, me * u.block, u.block);
  bool padded = false;
  for (int i : u.params) padded = padded || params_[i]->mine.length < params_[i]->chunk;
  if (padded) SG_RETURN_IF_ERROR(ZeroTensor(mine, s));
  for (int i : u.params) {
    const Param& p = *params_[i];
    if (p.mine.length > 0) SG_RETURN_IF_ERROR(kernels::Cast(p.shard, Flat(mine, p.pack_offset, p.shard.numel()), s));
  }
  SG_RETURN_IF_ERROR(layout_.shard->AllGather(mine, packed, s));
  return Unpack(u, backward, packed, s);
}

// sum = this rank's block of `input` (shard_size_ blocks of sum.numel()) summed over the shard group
// (reduce-scatter; one rank: its only block copied), then over the replicate group (HSDP).
absl::Status ShardedDataParallelStep::ReduceBlock(const TensorView& input, const TensorView& sum, const Stream& s) {
  if (layout_.shard != nullptr) {
    SG_RETURN_IF_ERROR(layout_.shard->ReduceScatter(input, sum, comm::ReduceOp::kSum, s));
  } else if (input.dtype() != sum.dtype()) {  // bf16 gradients into f32 shards
    SG_RETURN_IF_ERROR(kernels::Cast(Flat(input, 0, sum.numel()), sum, s));
  } else {
    SG_RETURN_IF_ERROR(CopyTensor(Flat(input, 0, sum.numel()), sum, s));
  }
  if (layout_.replicate != nullptr) {
    SG_RETURN_IF_ERROR(layout_.replicate->AllReduce(sum, comm::ReduceOp::kSum, s));
  }
  return absl::OkStatus();
}

// One parameter's full gradient (rank k's rows are its block k) into its gradient shard.
absl::Status ShardedDataParallelStep::ReduceScatterParam(const Param& p, bool accumulate, const Stream& s) {
  const int64_t block = p.chunk * p.row;
  const TensorView sum = accumulate ? Flat(block_, 0, block) : p.grad;
  SG_RETURN_IF_ERROR(ReduceBlock(Flat(p.grad_full, 0, block * shard_size_), sum, s));
  return accumulate ? kernels::Add(p.grad, sum, p.grad, s) : absl::OkStatus();
}

absl::Status ShardedDataParallelStep::ReduceScatter(const Unit& u, bool accumulate, const Stream& s) {
  if (Direct(u)) {  // one parameter on the unit's schedule (not PerParameter)
    for (int i : u.params) SG_RETURN_IF_ERROR(ReduceScatterParam(*params_[size_t(i)], accumulate, s));
    return absl::OkStatus();
  }
  const int P = shard_size_;
  // The sum of this rank's block: straight into the gradient shards when nothing is added to them.
  const bool into_shards = !accumulate && ScatterIntoShards(u);
  const Param& first = *params_[u.params[0]];
  const TensorView sum = !into_shards ? Flat(block_, 0, u.block)
                                      : TensorView(static_cast<char*>(first.grad.raw()) - first.pack_offset * 4,
                                                   DType::kF32, {u.block}, first.grad.device());
  // The bucket: f32, or bf16 under bf16 gradients (half its bytes used), where an f32 gradient (a
  // norm weight's, the embedding's) is rounded in.
  const TensorView bucket(packed_.raw(), bf16_gradients_ ? DType::kBF16 : DType::kF32, {packed_.numel()},
                          packed_.device());
  const TensorView input = Flat(bucket, 0, u.block * P);
  // Each rank's block: the parameters' chunks, then zeros in what they leave (alignment padding, a
  // short last chunk), which the reduction sums too. When the chunks tile the blocks there is
  // nothing to zero (the 1b and 7b layers): 4 bytes a parameter less to write.
  for (int k = 0; k < P; ++k) {
    std::vector<std::pair<int64_t, int64_t>> copied;  // [begin, end) in the block
    for (int i : u.params) {
      const Param& p = *params_[i];
      const sharding::ChunkRange r = sharding::Chunk(p.rows, P, k);
      if (r.length == 0) continue;
      const TensorView from = Flat(p.grad_full, r.offset * p.row, r.length * p.row);
      const TensorView to = Flat(bucket, k * u.block + p.pack_offset, r.length * p.row);
      SG_RETURN_IF_ERROR(from.dtype() == to.dtype() ? CopyTensor(from, to, s) : kernels::Cast(from, to, s));
      copied.emplace_back(p.pack_offset, p.pack_offset + r.length * p.row);
    }
    std::sort(copied.begin(), copied.end());
    copied.emplace_back(u.block, u.block);
    int64_t at = 0;
    for (const auto& [begin, end] : copied) {
      if (begin > at) SG_RETURN_IF_ERROR(ZeroTensor(Flat(bucket, k * u.block + at, begin - at), s));
      at = std::max(at, end);
    }
  }
  // The full gradients are free from here (compute waits for this at packed_at).
  SG_RETURN_IF_ERROR(u.packed->Record(s));
  SG_RETURN_IF_ERROR(ReduceBlock(input, sum, s));
  if (into_shards) return absl::OkStatus();
  for (int i : u.params) {
    const Param& p = *params_[i];
    if (p.mine.length == 0) continue;
    const TensorView summed = Flat(block_, p.pack_offset, p.grad.numel());
    SG_RETURN_IF_ERROR(accumulate ? kernels::Add(p.grad, summed, p.grad, s) : CopyTensor(summed, p.grad, s));
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler
