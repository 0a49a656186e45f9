#include "compiler/dist_context.h"

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "comm/nccl_transport.h"
#include "comm/ucx_transport.h"
#include "kernels/core/status.h"

namespace sg::compiler {

absl::StatusOr<std::shared_ptr<DistContext>> DistContext::FromEnv(Device device,
                                                                 comm::ProcessGroupOptions options) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static std::shared_ptr<DistContext> instance;
  absl::MutexLock lock(&mu);
  if (instance != nullptr) {
    if (instance->device_ != device && device.is_cuda()) {
      return absl::FailedPreconditionError(absl::StrCat("the distributed context was set up for ",
                                                        instance->device_.ToString(), ", asked for ",
                                                        device.ToString()));
    }
    return instance;
  }
  std::shared_ptr<DistContext> c(new DistContext());
  SG_ASSIGN_OR_RETURN(c->info_, comm::RankInfoFromEnv());
  c->device_ = device;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  SG_ASSIGN_OR_RETURN(c->rdzv_, comm::Rendezvous::Create(c->info_, deadline));
  SG_ASSIGN_OR_RETURN(c->host_, comm::UcxTransport::Create(c->rdzv_->store(), "compiler", c->info_.rank,
                                                           c->info_.world_size, deadline));
  if (device.is_cuda()) {
    SG_ASSIGN_OR_RETURN(c->device_transport_,
                        comm::NcclTransport::Create(c->rdzv_->store(), "compiler", c->info_.rank,
                                                    c->info_.world_size, device, deadline));
  }
  SG_ASSIGN_OR_RETURN(c->world_, comm::ProcessGroup::Create(&c->rdzv_->store(), c->host_.get(),
                                                            c->device_transport_.get(), "compiler/world",
                                                            options));
  instance = c;
  return c;
}

absl::StatusOr<comm::ProcessGroup*> DistContext::Group(const sharding::DeviceMesh& mesh,
                                                       const std::vector<int>& dims) {
  SG_CHECK_ARG(mesh.size() == world_size(), "mesh ", mesh.ToString(), " has ", mesh.size(),
               " ranks, the job ", world_size());
  std::vector<int> members;
  const std::vector<int> me = mesh.Coordinates(rank());
  for (int r = 0; r < mesh.size(); ++r) {
    const std::vector<int> c = mesh.Coordinates(r);
    bool same = true;
    for (int m = 0; m < mesh.ndim(); ++m) {
      if (std::find(dims.begin(), dims.end(), m) == dims.end()) same = same && c[m] == me[m];
    }
    if (same) members.push_back(r);
  }
  if (members.size() == 1) return nullptr;
  if (int(members.size()) == world_size()) return world_.get();
  const std::string name = absl::StrCat("compiler/", mesh.ToString(), "/", absl::StrJoin(dims, "_"), "/",
                                        absl::StrJoin(members, "_"));
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    SG_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> g, world_->Subgroup(members, name));
    it = groups_.emplace(name, std::move(g)).first;
  }
  return it->second.get();
}

}  // namespace sg::compiler
