#include "sharding/comm_collectives.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/core/status.h"

namespace sg::sharding {
namespace {

comm::ReduceOp ToComm(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return comm::ReduceOp::kSum;
    case ReduceOp::kAvg: return comm::ReduceOp::kAvg;
    case ReduceOp::kMax: return comm::ReduceOp::kMax;
  }
  return comm::ReduceOp::kSum;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroupCollectives>> ProcessGroupCollectives::Create(
    comm::ProcessGroup* world, DeviceMesh mesh) {
  SG_CHECK_ARG(world != nullptr, "ProcessGroupCollectives: world group is null");
  SG_CHECK_ARG(world->size() == mesh.size(), "ProcessGroupCollectives: mesh ", mesh.ToString(),
               " has ", mesh.size(), " ranks, the world group ", world->size());
  std::unique_ptr<ProcessGroupCollectives> c(new ProcessGroupCollectives());
  c->world_ = world;
  c->mesh_ = std::move(mesh);
  for (int m = 0; m < c->mesh_.ndim(); ++m) {
    if (c->mesh_.dim_size(m) == 1) {
      c->groups_.push_back(nullptr);
      continue;
    }
    std::vector<int> ranks = c->mesh_.GroupRanks(world->rank(), m);
    std::string name = absl::StrCat(world->name(), "/mesh/", c->mesh_.dim_name(m), "/",
                                    absl::StrJoin(ranks, "_"));
    SG_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> g, world->Subgroup(ranks, name));
    c->groups_.push_back(std::move(g));
  }
  return c;
}

absl::StatusOr<comm::ProcessGroup*> ProcessGroupCollectives::Group(int mesh_dim) {
  SG_CHECK_ARG(mesh_dim >= 0 && mesh_dim < mesh_.ndim(), "collective on mesh dim ", mesh_dim,
               ": mesh ", mesh_.ToString(), " has ", mesh_.ndim(), " dims");
  return groups_[mesh_dim].get();
}

absl::Status ProcessGroupCollectives::AllGather(int mesh_dim, const TensorView& in,
                                                const TensorView& out) {
  SG_ASSIGN_OR_RETURN(comm::ProcessGroup* g, Group(mesh_dim));
  if (g == nullptr) return CopyTensor(in, out, Stream::Cpu());
  return g->AllGather(in, out);
}

absl::Status ProcessGroupCollectives::AllReduce(int mesh_dim, const TensorView& inout, ReduceOp op) {
  SG_ASSIGN_OR_RETURN(comm::ProcessGroup* g, Group(mesh_dim));
  if (g == nullptr) return absl::OkStatus();
  return g->AllReduce(inout, ToComm(op));
}

absl::Status ProcessGroupCollectives::ReduceScatter(int mesh_dim, const TensorView& in,
                                                    const TensorView& out, ReduceOp op) {
  SG_ASSIGN_OR_RETURN(comm::ProcessGroup* g, Group(mesh_dim));
  if (g == nullptr) return CopyTensor(in, out, Stream::Cpu());
  return g->ReduceScatter(in, out, ToComm(op));
}

absl::Status ProcessGroupCollectives::AllToAll(int mesh_dim, const TensorView& in,
                                               const TensorView& out) {
  SG_ASSIGN_OR_RETURN(comm::ProcessGroup* g, Group(mesh_dim));
  if (g == nullptr) return CopyTensor(in, out, Stream::Cpu());
  return g->AllToAll(in, out);
}

}  // namespace sg::sharding
