#include "comm/store.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <random>
#include <thread>

#include "comm/hmac.h"
#include "kernels/core/sha256.h"
#include "comm/socket.h"
#include "comm/store_wire.h"
#include "gtest/gtest.h"

namespace sg::comm {
namespace {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Everything the server sends until it closes the connection (or 5 s pass).
std::string ReadUntilClosed(int fd) {
  std::string reply;
  char buf[512];
  absl::Time deadline = In(absl::Seconds(5));
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN)) break;
    if (n > 0) reply.append(buf, size_t(n));
  }
  return reply;
}

std::string Hex(const std::string& raw) {
  static const char* digits = "0123456789abcdef";
  std::string h;
  for (unsigned char c : raw) {
    h.push_back(digits[c >> 4]);
    h.push_back(digits[c & 15]);
  }
  return h;
}

// FIPS 180-4 / RFC 4231 vectors: an independent check of the hand-written SHA-256.
TEST(HmacTest, MatchesPublishedVectors) {
  EXPECT_EQ(Hex(Sha256Digest("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256Digest("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256Digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // RFC 4231 test cases 1 and 2.
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block size is hashed first.
  EXPECT_EQ(Hex(HmacSha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_TRUE(ConstantTimeEqual("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "ab"));
}

TEST(EnvTest, ReadsEachLauncherConvention) {
  std::map<std::string, std::string> env = {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}};
  auto lookup = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  RankInfo info = RankInfoFromLookup(lookup).value();
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 1234);
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_FALSE(info.external_store);
  env["SG_STORE_EXTERNAL"] = "1";
  EXPECT_TRUE(RankInfoFromLookup(lookup).value().external_store);
  env["SG_STORE_EXTERNAL"] = "yes";
  EXPECT_NE(RankInfoFromLookup(lookup).status().message().find("SG_STORE_EXTERNAL must be 0 or 1, found 'yes'"),
            std::string::npos);

  env = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "5"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}};
  info = RankInfoFromLookup(lookup).value();
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 5);
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.master_port, 29500);

  env = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}, {"SG_STORE_SECRET", "s"}};
  info = RankInfoFromLookup(lookup).value();
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.secret, "s");

  env = {{"RANK", "4"}, {"WORLD_SIZE", "4"}};
  absl::Status s = RankInfoFromLookup(lookup).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("RANK must be in [0, 4), found 4"), std::string::npos) << s;
  env = {{"RANK", "x"}, {"WORLD_SIZE", "4"}};
  EXPECT_NE(RankInfoFromLookup(lookup).status().message().find("found 'x'"), std::string::npos);
  env = {};
  EXPECT_TRUE(absl::IsNotFound(RankInfoFromLookup(lookup).status()));
}

class StoreTest : public ::testing::Test {
 protected:
  void StartServer(std::string secret = "", size_t max_message = 1 << 20) {
    StoreServerOptions opt;
    opt.secret = std::move(secret);
    opt.max_message_bytes = max_message;
    server_ = StoreServer::Start(opt).value();
  }
  std::unique_ptr<StoreClient> Client(std::string secret = "") {
    return StoreClient::Connect("127.0.0.1", server_->port(), std::move(secret), In(absl::Seconds(5)))
        .value();
  }
  std::unique_ptr<StoreServer> server_;
};

TEST_F(StoreTest, SetGetAddCompareAndSetDeleteCheck) {
  StartServer();
  auto a = Client();
  auto b = Client();
  absl::Time d = In(absl::Seconds(5));
  ASSERT_TRUE(a->Set("k", std::string("v\0w", 3), d).ok());
  EXPECT_EQ(b->Get("k", d).value(), std::string("v\0w", 3));
  EXPECT_TRUE(absl::IsNotFound(b->TryGet("missing", d).status()));
  EXPECT_EQ(a->Add("n", 5, d).value(), 5);
  EXPECT_EQ(b->Add("n", -2, d).value(), 3);
  EXPECT_EQ(a->CompareAndSet("c", "", "first", d).value(), "first");     // absent matches ""
  EXPECT_EQ(b->CompareAndSet("c", "wrong", "second", d).value(), "first");  // no change
  EXPECT_EQ(b->CompareAndSet("c", "first", "second", d).value(), "second");
  EXPECT_TRUE(a->Check({"k", "n", "c"}, d).value());
  EXPECT_FALSE(a->Check({"k", "nope"}, d).value());
  EXPECT_TRUE(a->Delete("k", d).value());
  EXPECT_FALSE(a->Delete("k", d).value());
  EXPECT_FALSE(a->Check({"k"}, d).value());
  // Add on a non-counter value is an error, and the client reconnects afterwards.
  ASSERT_TRUE(a->Set("s", "xyz", d).ok());
  EXPECT_FALSE(a->Add("s", 1, d).ok());
  EXPECT_EQ(a->Add("n", 1, d).value(), 4);
}

// Found by the store's fuzz corpus under UBSan: Add overflowing int64 was undefined behaviour.
TEST_F(StoreTest, AddRefusesOverflowAndKeepsTheCounter) {
  StartServer();
  auto c = Client();
  ASSERT_EQ(c->Add("n", INT64_MAX - 1, In(absl::Seconds(5))).value(), INT64_MAX - 1);
  auto over = c->Add("n", 2, In(absl::Seconds(5)));
  EXPECT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("counter overflow"), std::string::npos) << over.status();
  EXPECT_EQ(c->Add("n", 0, In(absl::Seconds(5))).value(), INT64_MAX - 1);
  EXPECT_EQ(c->Add("n", INT64_MIN, In(absl::Seconds(5))).value(), -2);
}

TEST_F(StoreTest, WaitReturnsWhenKeysAppearAndTimesOutNamingMissingKeys) {
  StartServer();
  auto a = Client();
  auto b = Client();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(b->Set("x", "1", In(absl::Seconds(5))).ok());
    ASSERT_TRUE(b->Set("y", "2", In(absl::Seconds(5))).ok());
  });
  EXPECT_TRUE(a->Wait({"x", "y"}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(a->Get("y", In(absl::Seconds(5))).value(), "2");
  setter.join();

  absl::Time start = absl::Now();
  absl::Status s = a->Wait({"x", "never"}, In(absl::Milliseconds(300)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("'never'"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("'x'"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  s = a->Get("never", In(absl::Milliseconds(100))).status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("never"), std::string::npos);
  // The client still works after timeouts.
  EXPECT_EQ(a->Get("x", In(absl::Seconds(5))).value(), "1");
}

TEST_F(StoreTest, ConcurrentAddsAreAtomic) {
  StartServer();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto c = Client();
      for (int i = 0; i < 100; ++i) ASSERT_TRUE(c->Add("counter", 1, In(absl::Seconds(5))).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(Client()->Add("counter", 0, In(absl::Seconds(5))).value(), 400);
}

// Raw connections send garbage, oversized frames, truncated fields and unknown opcodes; the server
// answers with an error (or just drops them) and keeps serving a well-behaved client throughout.
TEST_F(StoreTest, GarbageFloodDoesNotStopServingCorrectClients) {
  StartServer("", /*max_message=*/1 << 16);
  auto good = Client();
  std::mt19937_64 rng(42);
  std::vector<std::string> attacks;
  for (int i = 0; i < 50; ++i) {
    std::string junk(1 + rng() % 4096, '\0');
    for (char& c : junk) c = char(rng());
    attacks.push_back(junk);
  }
  attacks.push_back(std::string("\xff\xff\xff\x7f", 4) + "oversized");  // 2 GiB frame header
  WireWriter truncated;
  truncated.U8(uint8_t(StoreOp::kSet));
  truncated.U32(1000);  // key length beyond the payload
  attacks.push_back(truncated.Frame());
  WireWriter unknown;
  unknown.U8(200);
  attacks.push_back(unknown.Frame());
  attacks.push_back(std::string(4, '\0'));  // empty payload

  int64_t before = server_->rejected_connections();
  for (size_t i = 0; i < attacks.size(); ++i) {
    Fd fd = ConnectTcp("127.0.0.1", server_->port(), In(absl::Seconds(5))).value();
    (void)WriteAll(fd.get(), attacks[i].data(), attacks[i].size(), In(absl::Seconds(5)), "junk");
    if (i % 10 == 0) {
      ASSERT_TRUE(good->Set("alive", std::to_string(i), In(absl::Seconds(5))).ok());
      ASSERT_EQ(good->Get("alive", In(absl::Seconds(5))).value(), std::to_string(i));
    }
  }
  // The oversized frame gets an error reply naming both sizes before the connection closes.
  Fd fd = ConnectTcp("127.0.0.1", server_->port(), In(absl::Seconds(5))).value();
  std::string big = std::string("\x00\x00\x10\x00", 4);  // 1 MiB > 64 KiB limit
  ASSERT_TRUE(WriteAll(fd.get(), big.data(), big.size(), In(absl::Seconds(5)), "big").ok());
  std::string reply = ReadUntilClosed(fd.get());
  EXPECT_NE(reply.find("1048576 bytes exceeds the limit of 65536"), std::string::npos) << Hex(reply);
  EXPECT_GT(server_->rejected_connections(), before + 3);
  ASSERT_TRUE(good->Set("final", "ok", In(absl::Seconds(5))).ok());
  EXPECT_EQ(Client()->Get("final", In(absl::Seconds(5))).value(), "ok");
}

TEST_F(StoreTest, SecretAuthenticatesEveryConnection) {
  StartServer("correct horse");
  auto good = Client("correct horse");
  ASSERT_TRUE(good->Set("k", "v", In(absl::Seconds(5))).ok());
  auto wrong = StoreClient::Connect("127.0.0.1", server_->port(), "wrong", In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsPermissionDenied(wrong.status())) << wrong.status();
  EXPECT_NE(wrong.status().message().find("wrong secret"), std::string::npos) << wrong.status();
  auto none = StoreClient::Connect("127.0.0.1", server_->port(), "", In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsPermissionDenied(none.status())) << none.status();
  EXPECT_NE(none.status().message().find("SG_STORE_SECRET"), std::string::npos);

  // A raw connection that skips authentication and sends a command is refused.
  Fd fd = ConnectTcp("127.0.0.1", server_->port(), In(absl::Seconds(5))).value();
  WireWriter get;
  get.U8(uint8_t(StoreOp::kGet));
  get.Str("k");
  get.I64(0);
  std::string frame = get.Frame();
  ASSERT_TRUE(WriteAll(fd.get(), frame.data(), frame.size(), In(absl::Seconds(5)), "get").ok());
  std::string reply = ReadUntilClosed(fd.get());
  EXPECT_EQ(reply.find(std::string("\x01\x00\x00\x00v", 5)), std::string::npos);  // never the value
  EXPECT_NE(reply.find("requires authentication"), std::string::npos) << Hex(reply);
  EXPECT_EQ(good->Get("k", In(absl::Seconds(5))).value(), "v");
}

// With a secret, a peer that cannot authenticate cannot inject data: a raw Set (no auth, a forged
// MAC, or auth followed by a Set in the same packet) is refused and never reaches the store.
TEST_F(StoreTest, UnauthenticatedPeerCannotSetKeys) {
  StartServer("correct horse");
  auto good = Client("correct horse");
  WireWriter set;
  set.U8(uint8_t(StoreOp::kSet));
  set.Str("injected");
  set.Str("evil");
  WireWriter forged;
  forged.U8(uint8_t(StoreOp::kAuth));
  forged.Str(std::string(32, 'x'));
  const std::vector<std::string> attacks = {set.Frame(), forged.Frame() + set.Frame()};
  for (const std::string& attack : attacks) {
    Fd fd = ConnectTcp("127.0.0.1", server_->port(), In(absl::Seconds(5))).value();
    ASSERT_TRUE(WriteAll(fd.get(), attack.data(), attack.size(), In(absl::Seconds(5)), "attack").ok());
    std::string reply = ReadUntilClosed(fd.get());
    EXPECT_NE(reply.find("authentication"), std::string::npos) << Hex(reply);
  }
  // A client with the wrong secret gets no connection at all.
  EXPECT_FALSE(StoreClient::Connect("127.0.0.1", server_->port(), "guess", In(absl::Seconds(5))).ok());
  auto probe = good->TryGet("injected", In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsNotFound(probe.status())) << (probe.ok() ? *probe : probe.status().ToString());
  EXPECT_GE(server_->rejected_connections(), 3);
}

TEST_F(StoreTest, ClientWithSecretRefusesUnauthenticatedServer) {
  StartServer();
  auto c = StoreClient::Connect("127.0.0.1", server_->port(), "s", In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
}

TEST(StoreConnectTest, ConnectTimesOutWhenNoServer) {
  int port = PickFreePort().value();
  absl::Time start = absl::Now();
  auto c = StoreClient::Connect("127.0.0.1", port, "", In(absl::Milliseconds(300)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_NE(c.status().message().find(std::to_string(port)), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(RendezvousTest, RankZeroHostsAndAllFinalize) {
  int port = PickFreePort().value();
  std::vector<std::thread> ranks;
  std::vector<absl::Status> results(3);
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      RankInfo info;
      info.rank = r;
      info.world_size = 3;
      info.master_port = port;
      info.secret = "shh";
      auto rdzv = Rendezvous::Create(info, In(absl::Seconds(10)));
      if (!rdzv.ok()) {
        results[r] = rdzv.status();
        return;
      }
      absl::Time d = In(absl::Seconds(10));
      results[r] = (*rdzv)->store().Set("hello/" + std::to_string(r), "x", d);
      if (results[r].ok()) results[r] = (*rdzv)->store().Wait({"hello/0", "hello/1", "hello/2"}, d);
      if (results[r].ok()) results[r] = (*rdzv)->Finalize(d);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// With external_store rank 0 connects to a store someone else serves (a launcher) instead of
// binding the port itself.
TEST(RendezvousTest, ExternalStoreIsJoinedByRankZero) {
  StoreServerOptions opt;
  opt.secret = "shh";
  std::unique_ptr<StoreServer> server = StoreServer::Start(opt).value();
  RankInfo info;
  info.rank = 0;
  info.world_size = 1;
  info.master_port = server->port();
  info.secret = "shh";
  info.external_store = true;
  auto rdzv = Rendezvous::Create(info, In(absl::Seconds(10)));
  ASSERT_TRUE(rdzv.ok()) << rdzv.status();
  EXPECT_TRUE((*rdzv)->store().Set("k", "v", In(absl::Seconds(5))).ok());
  EXPECT_TRUE((*rdzv)->Finalize(In(absl::Seconds(5))).ok());
  info.external_store = false;  // hosting it too: the port is taken
  auto second = Rendezvous::Create(info, In(absl::Seconds(5)));
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("could not host the store"), std::string::npos) << second.status();
}

}  // namespace
}  // namespace sg::comm
