#include "compiler/shard_bucket.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

TensorView Flat(const TensorView& base, int64_t offset, int64_t n) {
  return TensorView(static_cast<char*>(base.raw()) + offset * SizeOf(base.dtype()), base.dtype(), {n}, base.device());
}

}  // namespace

absl::StatusOr<ShardBucket> ShardBucket::Create(const std::vector<Shape>& shapes, comm::ProcessGroup* group,
                                                Device device) {
  ShardBucket b;
  b.group_ = group;
  b.size_ = group != nullptr ? group->size() : 1;
  b.rank_ = group != nullptr ? group->rank() : 0;
  for (const Shape& s : shapes) {
    Entry e;
    e.rows = s.empty() ? 1 : s[0];
    e.row = e.rows == 0 ? 0 : NumElements(s) / e.rows;
    e.chunk = sharding::MaxChunk(e.rows, b.size_);
    e.mine = sharding::Chunk(e.rows, b.size_, b.rank_);
    e.direct = e.rows % b.size_ == 0;
    if (!e.direct) {
      e.offset = b.block_;
      b.block_ += e.chunk * e.row;
    }
    b.entries_.push_back(e);
  }
  SG_ASSIGN_OR_RETURN(b.buffer_, Tensor::Empty({std::max<int64_t>(1, b.block_ * (b.size_ + 1))}, DType::kF32, device));
  return b;
}

std::vector<int> ShardBucket::All() const {
  std::vector<int> ids;
  for (int i = 0; i < count(); ++i) ids.push_back(i);
  return ids;
}

TensorView ShardBucket::MineOf(int i, const TensorView& full) const {
  const Entry& e = entries_[size_t(i)];
  return Flat(full, e.mine.offset * e.row, e.mine.length * e.row);
}

absl::Status ShardBucket::CheckViews(const std::vector<TensorView>& shards, const std::vector<TensorView>& full,
                                     const char* op, const std::vector<int>& ids) const {
  SG_CHECK_ARG(shards.size() == entries_.size() && full.size() == entries_.size(), "shard bucket ", op, ": expected ",
               entries_.size(), " shards and full tensors, found ", shards.size(), " and ", full.size());
  for (int k : ids) {
    SG_CHECK_ARG(k >= 0 && k < count(), "shard bucket ", op, ": tensor index must be in [0, ", count(), "), found ", k);
    const size_t i = size_t(k);
    const Entry& e = entries_[i];
    SG_CHECK_ARG(full[i].dtype() == DType::kF32 && full[i].numel() == e.rows * e.row, "shard bucket ", op, ": tensor ",
                 i, " must be f32 with ", e.rows * e.row, " elements, found ", full[i].ToString());
    SG_CHECK_ARG(shards[i].dtype() == DType::kF32 && shards[i].numel() == e.mine.length * e.row, "shard bucket ", op,
                 ": shard ", i, " must be f32 with ", e.mine.length * e.row, " elements, found ", shards[i].ToString());
  }
  return absl::OkStatus();
}

absl::Status ShardBucket::Gather(const std::vector<TensorView>& shards, const std::vector<TensorView>& full,
                                 const Stream& s, const std::vector<int>& which) {
  const std::vector<int> ids = which.empty() ? All() : which;
  SG_RETURN_IF_ERROR(CheckViews(shards, full, "gather", ids));
  // Even splits: rank r's rows are block r of the full tensor, gathered in place.
  std::vector<int> packed;
  for (int i : ids) {
    const Entry& e = entries_[size_t(i)];
    if (!e.direct) {
      packed.push_back(i);
    } else if (e.rows * e.row > 0) {
      const TensorView& f = full[size_t(i)];
      SG_RETURN_IF_ERROR(group_ != nullptr ? group_->AllGather(shards[size_t(i)], Flat(f, 0, f.numel()), s)
                                           : CopyTensor(shards[size_t(i)], Flat(f, 0, f.numel()), s));
    }
  }
  // The others packed at consecutive offsets of a smaller block.
  std::vector<int64_t> at(packed.size());
  int64_t block = 0;
  for (size_t k = 0; k < packed.size(); ++k) {
    at[k] = block;
    block += entries_[size_t(packed[k])].chunk * entries_[size_t(packed[k])].row;
  }
  if (block == 0) return absl::OkStatus();
  const TensorView mine = Flat(buffer_.view(), 0, block), bucket = Flat(buffer_.view(), block_, block * size_);
  SG_RETURN_IF_ERROR(ZeroTensor(mine, s));
  for (size_t k = 0; k < packed.size(); ++k) {
    const TensorView& shard = shards[size_t(packed[k])];
    if (shard.numel() > 0) SG_RETURN_IF_ERROR(CopyTensor(shard, Flat(mine, at[k], shard.numel()), s));
  }
  if (group_ != nullptr) {
    SG_RETURN_IF_ERROR(group_->AllGather(mine, bucket, s));
  } else {
    SG_RETURN_IF_ERROR(CopyTensor(mine, Flat(bucket, 0, block), s));
  }
  for (int r = 0; r < size_; ++r) {
    for (size_t k = 0; k < packed.size(); ++k) {
      const Entry& e = entries_[size_t(packed[k])];
      const sharding::ChunkRange c = sharding::Chunk(e.rows, size_, r);
      if (c.length == 0) continue;
      SG_RETURN_IF_ERROR(CopyTensor(Flat(bucket, r * block + at[k], c.length * e.row),
                                    Flat(full[size_t(packed[k])], c.offset * e.row, c.length * e.row), s));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardBucket::ReduceScatter(const std::vector<TensorView>& full, const std::vector<TensorView>& shards,
                                        const Stream& s) {
  SG_RETURN_IF_ERROR(CheckViews(shards, full, "reduce-scatter", All()));
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (!e.direct || e.rows * e.row == 0) continue;
    const TensorView f = Flat(full[i], 0, full[i].numel());
    SG_RETURN_IF_ERROR(group_ != nullptr ? group_->ReduceScatter(f, shards[i], comm::ReduceOp::kSum, s)
                                         : CopyTensor(f, shards[i], s));
  }
  if (block_ == 0) return absl::OkStatus();
  const TensorView mine = Flat(buffer_.view(), 0, block_), bucket = Flat(buffer_.view(), block_, block_ * size_);
  SG_RETURN_IF_ERROR(ZeroTensor(bucket, s));
  for (int r = 0; r < size_; ++r) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      const sharding::ChunkRange c = sharding::Chunk(e.rows, size_, r);
      if (e.direct || c.length == 0) continue;
      SG_RETURN_IF_ERROR(CopyTensor(Flat(full[i], c.offset * e.row, c.length * e.row),
                                    Flat(bucket, r * block_ + e.offset, c.length * e.row), s));
    }
  }
  if (group_ != nullptr) {
    SG_RETURN_IF_ERROR(group_->ReduceScatter(bucket, mine, comm::ReduceOp::kSum, s));
  } else {
    SG_RETURN_IF_ERROR(CopyTensor(Flat(bucket, 0, block_), mine, s));
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].direct || shards[i].numel() == 0) continue;
    SG_RETURN_IF_ERROR(CopyTensor(Flat(mine, entries_[i].offset, shards[i].numel()), shards[i], s));
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler
