// Placements (how one mesh dim holds a tensor) and TensorSpec (a global tensor over a whole mesh),
// after PyTorch DTensor.
//
//   TensorSpec s = TensorSpec::Create(mesh /*dp=2,tp=4*/, {Placement::Shard(0), Placement::Replicate()},
//                                     /*global_shape=*/{10, 64}).value();
//   s.ToString();           // "[10,64] over dp=2,tp=4 as [S(0),R]"
//   s.LocalShape(rank);     // {5, 64}
//
// Placement on one mesh dim of size p:
//   Shard(d):     each group member holds one torch.chunk piece of tensor dim d: chunk size
//                 ceil(n/p); member k holds [k*c, min((k+1)*c, n)), so trailing members may hold
//                 fewer rows, or none.
//   Replicate:    each member holds the whole (current) tensor.
//   Partial(op):  each member holds a tensor of the full local shape; the value is op over the group
//                 (sum, avg = sum/p, or max).
// Several mesh dims may shard the same tensor dim: chunking nests in mesh-dim order (mesh dim 0
// outermost), so for [S(0),S(0)] on dp=2,tp=4 rank (i,j) holds chunk j of chunk i.
#ifndef SGTRAIN_SHARDING_PLACEMENT_H_
#define SGTRAIN_SHARDING_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/shape.h"
#include "sharding/mesh.h"

namespace sg::sharding {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
absl::string_view ReduceOpName(ReduceOp op);  // "sum", "avg", "max"

class Placement {
 public:
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };

  Placement() = default;  // Replicate
  static Placement Shard(int dim) { return Placement(Kind::kShard, dim, ReduceOp::kSum); }
  static Placement Replicate() { return Placement(); }
  static Placement Partial(ReduceOp op = ReduceOp::kSum) { return Placement(Kind::kPartial, -1, op); }
  // Inverse of ToString: "S(0)", "R", "P(sum)", "P(avg)", "P(max)".
  static absl::StatusOr<Placement> Parse(absl::string_view text);

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_shard(int dim) const { return kind_ == Kind::kShard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  // The sharded tensor dim. Precondition: is_shard().
  int dim() const { return dim_; }
  // The reduction. Precondition: is_partial().
  ReduceOp reduce_op() const { return op_; }

  std::string ToString() const;

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind_ == b.kind_ && a.dim_ == b.dim_ && a.op_ == b.op_;
  }
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const Placement& p) {
    return H::combine(std::move(h), p.kind_, p.dim_, p.op_);
  }

 private:
  Placement(Kind k, int dim, ReduceOp op) : kind_(k), dim_(dim), op_(op) {}
  Kind kind_ = Kind::kReplicate;
  int dim_ = -1;
  ReduceOp op_ = ReduceOp::kSum;
};

// One placement per mesh dim.
using Placements = std::vector<Placement>;
// "[S(0),R]"
std::string PlacementsToString(const Placements& p);
// "[S(0),R]" or "S(0),R" -> placements.
absl::StatusOr<Placements> ParsePlacements(absl::string_view text);
// All Replicate, one per mesh dim.
inline Placements Replicated(int mesh_ndim) { return Placements(mesh_ndim, Placement::Replicate()); }

// torch.chunk of `n` items into `parts`: the [offset, offset+length) range piece `index` holds.
struct ChunkRange {
  int64_t offset = 0;
  int64_t length = 0;
};
ChunkRange Chunk(int64_t n, int parts, int index);
// ceil(n / parts): the largest piece (what collectives pad every piece to).
inline int64_t MaxChunk(int64_t n, int parts) { return (n + parts - 1) / parts; }

class TensorSpec {
 public:
  TensorSpec() = default;
  // Checks one placement per mesh dim and every Shard(d) within the shape's rank.
  static absl::StatusOr<TensorSpec> Create(DeviceMesh mesh, Placements placements,
                                           Shape global_shape);

  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const Shape& global_shape() const { return global_shape_; }

  // The shape of `rank`'s local piece and where it starts in the global tensor (zeros for
  // replicated/partial dims). Elements beyond a short trailing chunk are simply absent.
  Shape LocalShape(int rank) const;
  std::vector<int64_t> LocalOffsets(int rank) const;
  // The extent of tensor dim `tensor_dim` that mesh dim `mesh_dim` splits for `rank`: the local
  // extent after the shards of mesh dims before `mesh_dim` only (what a collective over `mesh_dim`
  // gathers back).
  int64_t ParentExtent(int rank, int mesh_dim, int tensor_dim) const;
  // Same mesh and shape, other placements.
  TensorSpec WithPlacements(Placements p) const;

  // "[10,64] over dp=2,tp=4 as [S(0),R]"
  std::string ToString() const;

  friend bool operator==(const TensorSpec& a, const TensorSpec& b) {
    return a.mesh_ == b.mesh_ && a.placements_ == b.placements_ &&
           a.global_shape_ == b.global_shape_;
  }
  friend bool operator!=(const TensorSpec& a, const TensorSpec& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const TensorSpec& s) {
    return H::combine(std::move(h), s.mesh_, s.placements_, s.global_shape_);
  }

 private:
  // Offset and length of `rank`'s piece of tensor dim d, applying mesh dims [0, upto).
  ChunkRange Range(int rank, int tensor_dim, int upto) const;

  DeviceMesh mesh_;
  Placements placements_;
  Shape global_shape_;
};

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_PLACEMENT_H_
