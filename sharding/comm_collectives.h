// Collectives over the comm layer: one ProcessGroup sub-group per mesh dim (this rank's row or
// column of the mesh), created once.
//
//   SG_ASSIGN_OR_RETURN(auto coll, ProcessGroupCollectives::Create(world.get(), mesh));
//   SG_ASSIGN_OR_RETURN(Tensor out, ExecuteRedistribute(*plan, src_spec, local, *coll));
//
// `world` must be the group of all mesh.size() ranks, with group rank == mesh rank; it must outlive
// this object. Creating it is collective: every rank of `world` calls Create with the same mesh.
#ifndef SGTRAIN_SHARDING_COMM_COLLECTIVES_H_
#define SGTRAIN_SHARDING_COMM_COLLECTIVES_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "sharding/collectives.h"

namespace sg::sharding {

class ProcessGroupCollectives : public Collectives {
 public:
  // InvalidArgument when world's size differs from the mesh's.
  static absl::StatusOr<std::unique_ptr<ProcessGroupCollectives>> Create(comm::ProcessGroup* world,
                                                                         DeviceMesh mesh);

  const DeviceMesh& mesh() const override { return mesh_; }
  int rank() const override { return world_->rank(); }
  absl::Status AllGather(int mesh_dim, const TensorView& in, const TensorView& out) override;
  absl::Status AllReduce(int mesh_dim, const TensorView& inout, ReduceOp op) override;
  absl::Status ReduceScatter(int mesh_dim, const TensorView& in, const TensorView& out,
                             ReduceOp op) override;
  absl::Status AllToAll(int mesh_dim, const TensorView& in, const TensorView& out) override;

 private:
  ProcessGroupCollectives() = default;
  absl::StatusOr<comm::ProcessGroup*> Group(int mesh_dim);

  comm::ProcessGroup* world_ = nullptr;
  DeviceMesh mesh_;
  std::vector<std::unique_ptr<comm::ProcessGroup>> groups_;  // per mesh dim (null: size 1)
};

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_COMM_COLLECTIVES_H_
