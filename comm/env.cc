#include "comm/env.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::comm {
namespace {

absl::StatusOr<int> ParseIntVar(const char* name, const char* value) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, ": expected an integer, found '", value, "'"));
  }
  return v;
}

}  // namespace

absl::StatusOr<RankInfo> RankInfoFromLookup(const std::function<const char*(const char*)>& getenv) {
  struct Convention {
    const char* source;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  const Convention conventions[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  RankInfo info;
  bool found = false;
  for (const Convention& c : conventions) {
    const char* rank = getenv(c.rank);
    const char* size = getenv(c.size);
    if (rank == nullptr || size == nullptr) continue;
    SG_ASSIGN_OR_RETURN(info.rank, ParseIntVar(c.rank, rank));
    SG_ASSIGN_OR_RETURN(info.world_size, ParseIntVar(c.size, size));
    const char* local = getenv(c.local_rank);
    info.local_rank = 0;
    if (local != nullptr) {
      SG_ASSIGN_OR_RETURN(info.local_rank, ParseIntVar(c.local_rank, local));
    }
    info.source = c.source;
    SG_CHECK_ARG(info.world_size >= 1, c.size, " must be >= 1, found ", info.world_size);
    SG_CHECK_ARG(info.rank >= 0 && info.rank < info.world_size, c.rank, " must be in [0, ",
                 info.world_size, "), found ", info.rank);
    found = true;
    break;
  }
  if (!found) {
    return absl::NotFoundError(
        "no rank information in the environment: expected RANK and WORLD_SIZE (torchrun, launch), "
        "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (mpirun), or SLURM_PROCID and SLURM_NTASKS "
        "(srun)");
  }
  if (const char* addr = getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    info.master_addr = addr;
  }
  if (const char* port = getenv("MASTER_PORT"); port != nullptr && *port != '\0') {
    SG_ASSIGN_OR_RETURN(info.master_port, ParseIntVar("MASTER_PORT", port));
    SG_CHECK_ARG(info.master_port > 0 && info.master_port < 65536,
                 "MASTER_PORT must be in [1, 65535], found ", info.master_port);
  }
  if (const char* bind = getenv("SG_STORE_BIND_ADDR"); bind != nullptr && *bind != '\0') {
    info.bind_addr = bind;
  }
  if (const char* secret = getenv("SG_STORE_SECRET"); secret != nullptr) info.secret = secret;
  if (const char* external = getenv("SG_STORE_EXTERNAL"); external != nullptr && *external != '\0') {
    const std::string v = external;
    SG_CHECK_ARG(v == "0" || v == "1", "SG_STORE_EXTERNAL must be 0 or 1, found '", v, "'");
    info.external_store = v == "1";
  }
  return info;
}

absl::StatusOr<RankInfo> RankInfoFromEnv() {
  return RankInfoFromLookup([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace sg::comm
