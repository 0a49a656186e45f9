// Security defaults: in a single-node job (the store on loopback), nothing a rank listens on --
// the store on rank 0, UCX's TCP listener -- is reachable from another host. Every listening TCP
// socket this process owns must be bound to a loopback address.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "comm/multiprocess_testing.h"
#include "gtest/gtest.h"

namespace sg::comm {
namespace {

// Inodes of this process's sockets.
std::set<std::string> OwnSocketInodes() {
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  return inodes;
}

// "local_address" (hex) of every LISTEN (state 0A) socket of ours in /proc/self/net/<file>.
std::vector<std::string> ListeningAddresses(const std::string& file, const std::set<std::string>& ours) {
  std::ifstream f("/proc/self/net/" + file);
  std::string line;
  std::getline(f, line);  // header
  std::vector<std::string> out;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    in >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state == "0A" && ours.count(inode)) out.push_back(local);
  }
  return out;
}

TEST(Workers, DISABLED_ListenOnlyOnLoopback) {
  auto w = testing::MakeWorkerWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  Tensor t = Tensor::Empty({16}, DType::kF32, Device::Cpu()).value();
  for (int i = 0; i < 16; ++i) t.data<float>()[i] = 1.0f;
  ASSERT_TRUE(w->world->AllReduce(t, ReduceOp::kSum).ok());
  std::set<std::string> ours = OwnSocketInodes();
  int listening = 0;
  for (const std::string& a : ListeningAddresses("tcp", ours)) {
    ++listening;
    // Little-endian hex: 127.x.y.z ends in "7F" before the port ("0100007F:9C9B" is 127.0.0.1).
    EXPECT_EQ(a.substr(6, 3), "7F:") << "rank " << w->rank << " listens on " << a;
  }
  for (const std::string& a : ListeningAddresses("tcp6", ours)) {
    ++listening;
    EXPECT_EQ(a.substr(0, 32), "00000000000000000000000001000000") << "rank " << w->rank << " listens on " << a;
  }
  // Rank 0 listens at least for UCX's connections (the store is served by the test's parent).
  if (w->rank == 0) {
    EXPECT_GE(listening, 1);
  }
  std::cout << "rank " << w->rank << ": " << listening << " listening sockets, all loopback\n";
  ASSERT_TRUE(w->rdzv->Finalize(absl::Now() + absl::Seconds(20)).ok());
}

TEST(LoopbackTest, SingleNodeJobListensOnlyOnLoopback) {
  // UCX over TCP (its listener is what would be exposed), as well as its default selection.
  for (const char* tls : {"SG_UCX_TLS=tcp", "SG_UCX_UNUSED=1"}) {
    testing::WorkerRun run = testing::RunWorkers(2, "Workers.DISABLED_ListenOnlyOnLoopback", {tls},
                                                 absl::Seconds(40));
    EXPECT_TRUE(run.AllPassed()) << tls << "\n" << run.Summary();
  }
}

}  // namespace
}  // namespace sg::comm
