// The compile cache: stable hashing, hits across process restarts, a miss for any change in the
// key, corrupted/foreign entries rebuilt, eviction, guards, and two processes writing at once.
#include "graph/cache.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/builder.h"
#include "kernels/core/sha256.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::graph {
namespace {

using ::testing::HasSubstr;

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;
  std::string million(1000000, 'a');
  for (size_t i = 0; i < million.size(); i += 777) h.Update(absl::string_view(million).substr(i, 777));
  EXPECT_EQ(ToHex(h.Finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

Graph MakeGraph(double factor) {
  Builder b;
  Dim batch = b.Symbol("batch", 1, 64);
  Dim seq = b.Symbol("seq", 1, 4096);
  b.Output("y", b.Scale(b.Input("x", DType::kF32, {batch, seq, 8}), factor));
  return b.Finish().value();
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "_", ::getpid(), "_",
                                 testing::Rng()());
  EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

// A compile function whose output depends on the specialization; counts its calls.
struct Compiler {
  int calls = 0;
  CompileCache::CompileFn fn() {
    return [this](const Specialization& s) -> absl::StatusOr<Artifact> {
      ++calls;
      return Artifact{"graph for " + s.ToString(), std::string("\0plan\xff", 6)};
    };
  }
};

CompileCache::CompileFn MustNotCompile() {
  return [](const Specialization&) -> absl::StatusOr<Artifact> {
    return absl::InternalError("compile called on what should be a hit");
  };
}

std::unique_ptr<CompileCache> OpenCache(const std::string& dir, int64_t max_bytes = 1 << 30) {
  CompileCache::Options o;
  o.dir = dir;
  o.max_disk_bytes = max_bytes;
  o.log_warnings = false;
  return CompileCache::Open(o).value();
}

const Binding kB = {{"batch", 4}, {"seq", 100}};

TEST(CacheTest, FingerprintIsStableAndContentSensitive) {
  EXPECT_EQ(GraphFingerprint(MakeGraph(0.5)), GraphFingerprint(MakeGraph(0.5)));
  EXPECT_NE(GraphFingerprint(MakeGraph(0.5)), GraphFingerprint(MakeGraph(0.25)));
  EXPECT_EQ(GraphFingerprint(MakeGraph(0.5)).size(), 64u);
}

TEST(CacheTest, HitInMemoryThenFromDiskAfterRestartAndInAnotherProcess) {
  const std::string dir = FreshDir("restart");
  const CacheRequest req = CacheRequest::For(MakeGraph(0.5));
  Compiler c;
  {
    auto cache = OpenCache(dir);
    auto a = cache->GetOrCompile(req, kB, c.fn());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->plan_blob, std::string("\0plan\xff", 6));
    ASSERT_TRUE(cache->GetOrCompile(req, kB, MustNotCompile()).ok());
    CacheStats s = cache->stats();
    EXPECT_EQ(s.misses, 1);
    EXPECT_EQ(s.memory_hits, 1);
    EXPECT_EQ(s.miss_reasons["new graph"], 1);
    EXPECT_THAT(s.ToJson(), HasSubstr("\"memory_hits\":1"));
  }
  {
    auto cache = OpenCache(dir);  // a fresh object: nothing in memory
    auto a = cache->GetOrCompile(req, kB, MustNotCompile());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->graph_text, c.calls == 1 ? "graph for batch:sym[1,64]%1;seq:sym[1,4096]%1" : "");
    EXPECT_EQ(cache->stats().disk_hits, 1);
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // a real second process
    auto cache = OpenCache(dir);
    auto a = cache->GetOrCompile(req, {{"batch", 9}, {"seq", 7}}, MustNotCompile());
    ::_exit(a.ok() && cache->stats().disk_hits == 1 ? 0 : 1);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "child process timed out";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child did not hit the disk cache";
  EXPECT_EQ(c.calls, 1);
}

// Lookup never compiles; Store replaces an entry, also for a fresh cache object on the directory.
TEST(CacheTest, LookupAndStoreReplaceAnEntry) {
  const std::string dir = FreshDir("store");
  const CacheRequest req = CacheRequest::For(MakeGraph(0.5));
  auto cache = OpenCache(dir);
  auto missing = cache->Lookup(req, kB);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(*missing, nullptr);
  EXPECT_EQ(cache->stats().misses, 0) << "a lookup compiles nothing";
  const std::string blob = absl::StrCat("table ", testing::Rng()());
  ASSERT_TRUE(cache->Store(req, kB, Artifact{"", "old"}).ok());
  ASSERT_TRUE(cache->Store(req, kB, Artifact{"", blob}).ok());
  auto mem = cache->Lookup(req, kB);
  ASSERT_TRUE(mem.ok() && *mem != nullptr);
  EXPECT_EQ((*mem)->plan_blob, blob);
  auto fresh = OpenCache(dir);
  auto disk = fresh->Lookup(req, kB);
  ASSERT_TRUE(disk.ok() && *disk != nullptr);
  EXPECT_EQ((*disk)->plan_blob, blob);
  EXPECT_EQ(fresh->stats().disk_hits, 1);
  ASSERT_TRUE(fresh->GetOrCompile(req, kB, MustNotCompile()).ok()) << "a stored entry serves GetOrCompile";
}

TEST(CacheTest, AnyChangeInTheKeyMisses) {
  const std::string dir = FreshDir("keys");
  auto cache = OpenCache(dir);
  Compiler c;
  const CacheRequest base = CacheRequest::For(MakeGraph(0.5));
  ASSERT_TRUE(cache->GetOrCompile(base, kB, c.fn()).ok());
  std::vector<std::pair<std::string, CacheRequest>> variants;
  variants.push_back({"graph", CacheRequest::For(MakeGraph(0.25))});
  variants.push_back({"device", base});
  variants.back().second.device = "cpu";
  variants.push_back({"arch", base});
  variants.back().second.arch = "sm_100a";
  variants.push_back({"options", base});
  variants.back().second.options["recompute"] = "full";
  variants.push_back({"version", base});
  variants.back().second.compiler_version = "sg-graph-2";
  variants.push_back({"policy", base});
  variants.back().second.policy["batch"] = DimPolicy::Concrete();
  for (const auto& [what, req] : variants) {
    const int before = c.calls;
    ASSERT_TRUE(cache->GetOrCompile(req, kB, c.fn()).ok()) << what;
    EXPECT_EQ(c.calls, before + 1) << "changing the " << what << " must miss";
  }
  // Concrete batch: another batch value misses, the same one hits.
  CacheRequest concrete = variants.back().second;
  ASSERT_TRUE(cache->GetOrCompile(concrete, {{"batch", 5}, {"seq", 100}}, c.fn()).ok());
  ASSERT_TRUE(cache->GetOrCompile(concrete, {{"batch", 5}, {"seq", 3000}}, MustNotCompile()).ok());
  EXPECT_EQ(c.calls, 8);
  CacheStats s = cache->stats();
  EXPECT_EQ(s.misses, 8);
  EXPECT_EQ(s.miss_reasons["new graph"], 2);  // base graph and the 0.25 graph
  // Reasons compare with the previous compile of the same graph: the policy variant follows the
  // version variant, so it reads as a version change too.
  EXPECT_EQ(s.miss_reasons["target, options or compiler version changed"], 5);
  EXPECT_EQ(s.miss_reasons["specialization changed: batch"], 1);
}

TEST(CacheTest, BucketGuardsAndConstraints) {
  auto cache = OpenCache(FreshDir("buckets"));
  Compiler c;
  CacheRequest req = CacheRequest::For(MakeGraph(0.5));
  req.policy["seq"] = DimPolicy::Bucketed(64);
  auto spec = Specialization::Make(req.symbols, req.policy, {{"batch", 2}, {"seq", 300}}).value();
  EXPECT_EQ(spec.PlanningBinding().at("seq"), 512);
  EXPECT_EQ(spec.PlanningBinding().at("batch"), 64);
  EXPECT_TRUE(spec.Admits({{"batch", 3}, {"seq", 400}}).ok());
  EXPECT_THAT(std::string(spec.Admits({{"batch", 3}, {"seq", 600}}).message()),
              HasSubstr("seq=600 outside bucket seq<=512"));
  ASSERT_TRUE(cache->GetOrCompile(req, {{"batch", 2}, {"seq", 300}}, c.fn()).ok());
  ASSERT_TRUE(cache->GetOrCompile(req, {{"batch", 7}, {"seq", 512}}, MustNotCompile()).ok());
  ASSERT_TRUE(cache->GetOrCompile(req, {{"batch", 7}, {"seq", 513}}, c.fn()).ok());
  ASSERT_TRUE(cache->GetOrCompile(req, {{"batch", 7}, {"seq", 3}}, c.fn()).ok());  // bucket 64
  EXPECT_EQ(c.calls, 3);
  auto bad = cache->GetOrCompile(req, {{"batch", 65}, {"seq", 3}}, c.fn());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("symbol 'batch' = 65 violates max=64"));
  req.policy["nope"] = DimPolicy::Concrete();
  EXPECT_THAT(std::string(cache->GetOrCompile(req, kB, c.fn()).status().message()),
              HasSubstr("names symbol 'nope'"));
}

void Corrupt(const std::string& path, size_t offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekp(size - std::streamoff(offset_from_end));
  f.put('#');
}

TEST(CacheTest, CorruptedTruncatedAndForeignEntriesAreRebuilt) {
  const std::string dir = FreshDir("corrupt");
  const CacheRequest req = CacheRequest::For(MakeGraph(0.5));
  Compiler c;
  const std::string key = OpenCache(dir)->Key(req, kB).value();
  const std::string path = dir + "/" + key + ".sgc";
  ASSERT_TRUE(OpenCache(dir)->GetOrCompile(req, kB, c.fn()).ok());
  const std::vector<std::function<void()>> damage = {
      [&] { Corrupt(path, 3); },                                        // payload byte flipped
      [&] { ASSERT_EQ(::truncate(path.c_str(), 40), 0); },              // truncated
      [&] { std::ofstream(path, std::ios::trunc) << "some other tool's file"; },  // foreign
  };
  for (size_t i = 0; i < damage.size(); ++i) {
    damage[i]();
    auto cache = OpenCache(dir);
    auto a = cache->GetOrCompile(req, kB, c.fn());
    ASSERT_TRUE(a.ok()) << a.status();
    CacheStats s = cache->stats();
    EXPECT_EQ(s.corrupt_entries, 1) << i;
    EXPECT_EQ(s.miss_reasons["corrupt disk entry"], 1) << i;
    ASSERT_EQ(s.warnings.size(), 1u);
    EXPECT_THAT(s.warnings[0], HasSubstr("rebuilding it"));
    EXPECT_EQ(c.calls, int(i) + 2);
    // Rebuilt: a fresh process-like object hits again.
    EXPECT_TRUE(OpenCache(dir)->GetOrCompile(req, kB, MustNotCompile()).ok()) << i;
  }
}

TEST(CacheTest, EvictsLeastRecentlyUsedBeyondTheSizeBound) {
  const std::string dir = FreshDir("evict");
  auto cache = OpenCache(dir, /*max_bytes=*/4000);
  CacheRequest req = CacheRequest::For(MakeGraph(0.5));
  auto big = [](const Specialization&) -> absl::StatusOr<Artifact> {
    return Artifact{std::string(900, 'g'), "p"};
  };
  for (int i = 0; i < 10; ++i) {
    req.options["i"] = std::to_string(i);
    ASSERT_TRUE(cache->GetOrCompile(req, kB, big).ok());
  }
  int64_t total = 0;
  int files = 0;
  for (int i = 0; i < 10; ++i) {
    req.options["i"] = std::to_string(i);
    struct stat st;
    if (::stat((dir + "/" + cache->Key(req, kB).value() + ".sgc").c_str(), &st) == 0) {
      total += st.st_size;
      ++files;
    }
  }
  EXPECT_LE(total, 4000);
  EXPECT_GE(files, 2);
  EXPECT_EQ(cache->stats().evictions, 10 - files);
  req.options["i"] = "9";  // the newest survived
  EXPECT_TRUE(OpenCache(dir)->GetOrCompile(req, kB, MustNotCompile()).ok());
}

TEST(CacheTest, TwoProcessesWritingAtOnce) {
  const std::string dir = FreshDir("concurrent");
  CacheRequest req = CacheRequest::For(MakeGraph(0.5));
  auto content = [](const Specialization& s, const std::string& i) {
    return Artifact{absl::StrCat(std::string(20000, 'x'), s.ToString(), i), std::string(5000, char(i[0]))};
  };
  constexpr int kKeys = 25;
  std::vector<pid_t> pids;
  for (int p = 0; p < 2; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto cache = OpenCache(dir);
      CacheRequest r = req;
      bool ok = true;
      for (int round = 0; round < 2; ++round) {
        for (int k = 0; k < kKeys; ++k) {
          const std::string i = std::to_string((k + p * 7) % kKeys);
          r.options["i"] = i;
          auto a = cache->GetOrCompile(r, kB, [&](const Specialization& s) -> absl::StatusOr<Artifact> {
            return content(s, i);
          });
          ok &= a.ok() && (*a)->graph_text == content(Specialization::Make(r.symbols, {}, kB).value(), i).graph_text;
        }
      }
      ::_exit(ok && cache->stats().corrupt_entries == 0 && cache->stats().write_failures == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "writer process timed out";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer saw a bad entry";
  }
  auto cache = OpenCache(dir);
  for (int k = 0; k < kKeys; ++k) {
    req.options["i"] = std::to_string(k);
    auto a = cache->GetOrCompile(req, kB, MustNotCompile());
    ASSERT_TRUE(a.ok()) << k << ": " << a.status();
  }
  EXPECT_EQ(cache->stats().disk_hits, kKeys);
  EXPECT_EQ(cache->stats().corrupt_entries, 0);
}

}  // namespace
}  // namespace sg::graph
