// Tensors sharded by dim-0 rows over a process group (torch.chunk: rank k of P keeps rows
// sharding::Chunk(n, P, k), uneven and empty chunks allowed), gathered and reduce-scattered the
// way the FSDP runtime does it (compiler/fsdp.h), as a piece of its own for runtimes that keep
// parameters sharded outside that runtime's schedule (the pipeline's stages, pp_step.h).
//
//   SG_ASSIGN_OR_RETURN(ShardBucket b, ShardBucket::Create({{8, 4}, {4}}, dp_group, device));
//   SG_RETURN_IF_ERROR(b.Gather(shards, fulls, stream));            // every full tensor, f32
//   SG_RETURN_IF_ERROR(b.ReduceScatter(full_grads, grad_shards, stream));  // summed over the group
//
// A tensor whose rows split evenly is gathered straight into the full tensor (rank r's rows are its
// block r) and reduce-scattered straight from it: one collective each, no staging. The others are
// packed rank-major into one bucket, one collective for all of them: each rank's block holds, per
// such tensor, MaxChunk(rows, P) rows, zero padded past its own; the bucket is P blocks. So the
// staging memory is (P + 1) blocks of the unevenly split tensors only.
// Collectives run on `stream`'s order (device tensors: the process group's device path, ordered by
// events; host tensors: synchronously). A null group is this rank alone (copies only).
// Tensors are f32 and contiguous; a rank-0 tensor counts as one row.
#ifndef SGTRAIN_COMPILER_SHARD_BUCKET_H_
#define SGTRAIN_COMPILER_SHARD_BUCKET_H_

#include <vector>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"
#include "sharding/placement.h"

namespace sg::compiler {

class ShardBucket {
 public:
  // `shapes`: the full tensors' shapes. Allocates the bucket (P + 1 blocks of f32) on `device`.
  static absl::StatusOr<ShardBucket> Create(const std::vector<Shape>& shapes, comm::ProcessGroup* group,
                                            Device device);

  int size() const { return size_; }    // P
  int count() const { return int(entries_.size()); }
  // This rank's rows of tensor i, and its shard's element count.
  sharding::ChunkRange rows(int i) const { return entries_[size_t(i)].mine; }
  int64_t shard_numel(int i) const { return entries_[size_t(i)].mine.length * entries_[size_t(i)].row; }
  // This rank's rows of a full tensor i (any device; a view into `full`).
  TensorView MineOf(int i, const TensorView& full) const;

  // full[i] (numel of tensor i) from every rank's shards[i] (shard_numel(i)), for the tensors in
  // `which` (empty: all; views of the others are ignored and may be empty). Collective over the
  // group: every rank passes the same `which`.
  absl::Status Gather(const std::vector<TensorView>& shards, const std::vector<TensorView>& full, const Stream& stream,
                      const std::vector<int>& which = {});
  // shards[i] = the sum over the group of every rank's full[i] rows this rank owns (all tensors).
  // Collective over the group.
  absl::Status ReduceScatter(const std::vector<TensorView>& full, const std::vector<TensorView>& shards,
                             const Stream& stream);

 private:
  struct Entry {
    int64_t rows = 0, row = 0, chunk = 0;  // dim-0 extent, elements per row, MaxChunk(rows, P)
    sharding::ChunkRange mine;
    bool direct = false;  // rows split evenly: no packing
    int64_t offset = 0;   // in a rank's block, elements (packed tensors)
  };
  // The views of the tensors in `ids` match their entries (others are not read or written).
  absl::Status CheckViews(const std::vector<TensorView>& shards, const std::vector<TensorView>& full,
                          const char* op, const std::vector<int>& ids) const;
  std::vector<int> All() const;

  comm::ProcessGroup* group_ = nullptr;
  int size_ = 1, rank_ = 0;
  std::vector<Entry> entries_;
  int64_t block_ = 0;  // elements per rank of the packed (uneven) tensors
  Tensor buffer_;      // [block_] this rank's block, then [P * block_] the bucket (uneven tensors)
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_SHARD_BUCKET_H_
