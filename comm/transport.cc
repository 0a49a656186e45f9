#include "comm/transport.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::comm {

absl::Status TransportRequest::Wait(absl::Time deadline) {
  int idle_polls = 0;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool done, Test());
    if (done) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(Describe(), ": not done by the deadline"));
    }
    // Spin first (latency), then yield so waiting ranks share a small machine's cores.
    if (++idle_polls > 1000) std::this_thread::yield();
  }
}

absl::Status CheckPeerAndTag(const Transport& t, absl::string_view op, int peer, uint64_t tag) {
  SG_CHECK_ARG(peer >= 0 && peer < t.world_size(), t.name(), " ", op, ": peer must be in [0, ",
               t.world_size(), "), found ", peer);
  SG_CHECK_ARG(tag <= kMaxTransportTag, t.name(), " ", op, ": tag must be below 2^",
               kTransportTagBits, ", found ", tag);
  return absl::OkStatus();
}

}  // namespace sg::comm
