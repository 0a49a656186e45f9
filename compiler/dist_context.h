// The process's place in a distributed job, for the compiler's distributed runtimes: the
// rendezvous and transports set up once from the launcher's environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT as //comm:launch, torchrun, mpirun or srun set them; comm/env.h), the
// world ProcessGroup, and sub-groups over sets of mesh dims, created once and cached.
//
//   SG_ASSIGN_OR_RETURN(std::shared_ptr<DistContext> ctx, DistContext::FromEnv(device, {}));
//   SG_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create({"dp", "shard"}, {2, 2}));
//   SG_ASSIGN_OR_RETURN(comm::ProcessGroup* row, ctx->Group(mesh, {1}));   // this rank's row
//
// One context per process (FromEnv returns the same one on later calls): the store rendezvous
// happens once per job. Host tensors go over UCX, CUDA tensors over NCCL (when built with it).
#ifndef SGTRAIN_COMPILER_DIST_CONTEXT_H_
#define SGTRAIN_COMPILER_DIST_CONTEXT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/env.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/transport.h"
#include "kernels/core/device.h"
#include "sharding/mesh.h"

namespace sg::compiler {

class DistContext {
 public:
  // The process's context, created on the first call (collective: every rank of the job calls
  // it). `device`: a CUDA device adds a NCCL transport for device tensors. NotFound when no
  // launcher variables are set; FailedPrecondition when a later call asks for another device.
  static absl::StatusOr<std::shared_ptr<DistContext>> FromEnv(Device device,
                                                             comm::ProcessGroupOptions options);

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  comm::ProcessGroup& world() { return *world_; }

  // The group of the ranks that share this rank's coordinates on every mesh dim outside
  // `dims` (ordered row-major over `dims`), or null when that group is this rank alone. Every
  // rank calls it with the same mesh and dims (it creates the sub-group on first use).
  // `dims` covering every mesh dim gives the world group.
  absl::StatusOr<comm::ProcessGroup*> Group(const sharding::DeviceMesh& mesh, const std::vector<int>& dims);

  // Every rank calls it before exiting (comm::Rendezvous::Finalize): rank 0, which hosts the
  // store, waits for the others, so a rank still finishing its last collective keeps the store.
  absl::Status Finalize(absl::Time deadline) { return rdzv_->Finalize(deadline); }

 private:
  DistContext() = default;

  comm::RankInfo info_;
  Device device_;
  std::unique_ptr<comm::Rendezvous> rdzv_;
  std::unique_ptr<comm::Transport> host_, device_transport_;
  std::unique_ptr<comm::ProcessGroup> world_;
  std::map<std::string, std::unique_ptr<comm::ProcessGroup>> groups_;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_DIST_CONTEXT_H_
