// Who this process is in the job: rank, world size, local rank and where the rendezvous store is,
// read from the variables launchers already set.
//
//   SG_ASSIGN_OR_RETURN(sg::comm::RankInfo info, sg::comm::RankInfoFromEnv());
//   // info.rank, info.world_size, info.master_addr + ":" + info.master_port
//
// Sources, first match wins:
//   torchrun / this project's `launch`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   mpirun (Open MPI):                 OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
//   Slurm (srun):                      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500 when the launcher sets none (mpirun,
// srun). SG_STORE_SECRET, when set, is the shared secret every store connection must prove.
// SG_STORE_BIND_ADDR is the address rank 0's store listens on (default 127.0.0.1; set 0.0.0.0 or an
// interface address for multi-node jobs). SG_STORE_EXTERNAL=1 says the launcher already serves the
// store at MASTER_ADDR:MASTER_PORT (it bound port 0 and holds it, so no other job can take the port
// between its choice and its use): rank 0 then connects like every other rank instead of hosting.
#ifndef SGTRAIN_COMM_ENV_H_
#define SGTRAIN_COMM_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace sg::comm {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string bind_addr = "127.0.0.1";
  std::string secret;  // empty: no authentication
  bool external_store = false;  // SG_STORE_EXTERNAL: the launcher hosts the store, not rank 0
  std::string source;  // "torchrun", "openmpi", "slurm": which variables were used
};

// Reads RankInfo from the process environment. InvalidArgument naming the variable when a value is
// not an integer or rank is not in [0, world_size); NotFound when no launcher's variables are set.
absl::StatusOr<RankInfo> RankInfoFromEnv();

// The same, from a lookup function (returns nullptr for unset), so tests need not touch the
// process environment.
absl::StatusOr<RankInfo> RankInfoFromLookup(const std::function<const char*(const char*)>& getenv);

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_ENV_H_
