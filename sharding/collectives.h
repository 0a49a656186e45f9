// The collectives redistribution needs, over one mesh dim: the small interface the executor
// (redistribute_exec.h) calls. The comm layer's ProcessGroup implements it through
// ProcessGroupCollectives (comm_collectives.h); tests or other runtimes may implement it too.
//
//   ProcessGroupCollectives coll = ProcessGroupCollectives::Create(world, mesh).value();
//   SG_RETURN_IF_ERROR(coll.AllReduce(/*mesh_dim=*/1, grads, ReduceOp::kSum));
//
// Each call runs among the ranks of `mesh_dim`'s group through this rank (DeviceMesh::GroupRanks),
// member k being the rank at coordinate k. Every member calls with equally sized, contiguous
// buffers (the executor pads uneven chunks); block k of a blocked buffer is numel/p elements.
#ifndef SGTRAIN_SHARDING_COLLECTIVES_H_
#define SGTRAIN_SHARDING_COLLECTIVES_H_

#include "absl/status/status.h"
#include "kernels/core/tensor.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace sg::sharding {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual const DeviceMesh& mesh() const = 0;
  // This process's rank in the mesh.
  virtual int rank() const = 0;
  // out = concat over members k of member k's `in` (out has p * in.numel() elements).
  virtual absl::Status AllGather(int mesh_dim, const TensorView& in, const TensorView& out) = 0;
  // inout = op over members of inout.
  virtual absl::Status AllReduce(int mesh_dim, const TensorView& inout, ReduceOp op) = 0;
  // out = op over members of block k of their `in`, where k is this rank's coordinate.
  virtual absl::Status ReduceScatter(int mesh_dim, const TensorView& in, const TensorView& out,
                                     ReduceOp op) = 0;
  // Block k of this rank's `in` goes to member k; block k of `out` comes from member k.
  virtual absl::Status AllToAll(int mesh_dim, const TensorView& in, const TensorView& out) = 0;
};

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_COLLECTIVES_H_
