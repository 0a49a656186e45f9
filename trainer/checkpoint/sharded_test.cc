// Per-shard checkpoints: saved by 4 simulated ranks on a 2x2 mesh, loaded on 3 and on 1 rank with
// other placements, compared element by element (bytes) with slices of the global tensors; a
// flipped byte, a shard from another save, a wrong shape and a save killed midway.
#include "trainer/checkpoint/sharded.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/checkpoint/checkpoint.h"

namespace sg::trainer {
namespace {

using sharding::DeviceMesh;
using sharding::ParsePlacements;
using sharding::TensorSpec;

std::string TempRoot(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string root = std::string(t ? t : "/tmp") + "/sharded_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  return root;
}

// The box [off, off + shape) of `global`, element by element (unravelling each local index):
// deliberately unlike the loader's run-wise copy.
Tensor Slice(const Tensor& global, const Shape& shape, const std::vector<int64_t>& off) {
  Tensor t = Tensor::Empty(shape, global.dtype(), Device::Cpu()).value();
  const size_t item = size_t(SizeOf(global.dtype()));
  const Shape& gs = global.shape();
  std::vector<int64_t> idx(shape.size());
  for (int64_t i = 0; i < NumElements(shape); ++i) {
    int64_t rem = i, g = 0, stride = 1;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      idx[size_t(d)] = rem % shape[d];
      rem /= shape[d];
    }
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      g += (idx[size_t(d)] + off[size_t(d)]) * stride;
      stride *= gs[d];
    }
    std::memcpy(static_cast<char*>(t.view().raw()) + size_t(i) * item,
                static_cast<const char*>(global.view().raw()) + size_t(g) * item, item);
  }
  return t;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.view().raw(), b.view().raw(), size_t(a.nbytes())) == 0);
}

struct Global {
  std::string name;
  Tensor tensor;
};

// Four tensors of mixed dtypes and awkward sizes (chunks of unequal length, an empty trailing one).
std::vector<Global> MakeGlobals() {
  auto& rng = sg::testing::Rng();
  return {{"embed", sg::testing::RandomTensor({11, 7}, DType::kF32, Device::Cpu(), rng)},
          {"proj", sg::testing::RandomTensor({5, 9}, DType::kBF16, Device::Cpu(), rng)},
          {"norm", sg::testing::RandomTensor({13}, DType::kF32, Device::Cpu(), rng)},
          {"deep", sg::testing::RandomTensor({3, 4, 6}, DType::kF32, Device::Cpu(), rng)}};
}

TensorSpec Spec(const std::string& mesh, const std::string& placements, const Shape& shape) {
  return TensorSpec::Create(DeviceMesh::Parse(mesh).value(), ParsePlacements(placements).value(), shape)
      .value();
}

// Every rank's pieces of `globals` on `mesh` with per-tensor placements (the views point into
// `keep`).
std::vector<std::vector<ShardedTensorView>> Pieces(const std::vector<Global>& globals, const std::string& mesh,
                                                   const std::vector<std::string>& placements,
                                                   std::vector<Tensor>* keep) {
  const int n = DeviceMesh::Parse(mesh).value().size();
  std::vector<std::vector<ShardedTensorView>> per_rank(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < globals.size(); ++i) {
      TensorSpec s = Spec(mesh, placements[i], globals[i].tensor.shape());
      keep->push_back(Slice(globals[i].tensor, s.LocalShape(r), s.LocalOffsets(r)));
      per_rank[size_t(r)].push_back({globals[i].name, s, keep->back()});
    }
  }
  return per_rank;
}

// Saves `globals` as step `step` under `root`; returns the step directory.
std::string Save(const std::string& root, int64_t step, const std::vector<Global>& globals,
                 const std::string& mesh, const std::vector<std::string>& placements) {
  std::vector<Tensor> keep;
  auto per_rank = Pieces(globals, mesh, placements, &keep);
  std::string dir = StepDir(root, step);
  absl::Status st = SaveShardedCheckpoint(dir, step, per_rank, {{"note", "test"}});
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

// Loads every tensor on every rank of `mesh` with `placements` and compares with the slices.
void ExpectLoadsExactly(const std::string& dir, const std::vector<Global>& globals,
                        const std::string& mesh, const std::vector<std::string>& placements) {
  const int n = DeviceMesh::Parse(mesh).value().size();
  for (int r = 0; r < n; ++r) {
    std::vector<ShardRequest> req;
    for (size_t i = 0; i < globals.size(); ++i) {
      req.push_back({globals[i].name, Spec(mesh, placements[i], globals[i].tensor.shape())});
    }
    auto got = LoadShards(dir, r, req);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), globals.size());
    for (size_t i = 0; i < globals.size(); ++i) {
      const TensorSpec& s = req[i].spec;
      EXPECT_EQ((*got)[i].name, globals[i].name);
      EXPECT_TRUE(SameBytes((*got)[i].tensor, Slice(globals[i].tensor, s.LocalShape(r), s.LocalOffsets(r))))
          << globals[i].name << " on rank " << r << " of " << s.ToString();
    }
  }
}

const std::vector<std::string> kSaved = {"[S(0),R]", "[R,S(1)]", "[R,R]", "[S(0),S(2)]"};

TEST(ShardedCheckpointTest, SavedOnFourLoadsOnThreeAndOneExactly) {
  std::string root = TempRoot("reshard");
  auto globals = MakeGlobals();
  std::string dir = Save(root, 7, globals, "dp=2,tp=2", kSaved);
  auto m = ReadShardedManifest(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->mesh.ToString(), "dp=2,tp=2");
  EXPECT_EQ(m->shards.size(), 4u);
  EXPECT_EQ(m->extra.at("note"), "test");
  EXPECT_EQ(m->tensors.at("proj").second.ToString(), "[5,9] over dp=2,tp=2 as [R,S(1)]");
  // The same layout, 3 ranks with other splits, 1 rank.
  ExpectLoadsExactly(dir, globals, "dp=2,tp=2", kSaved);
  ExpectLoadsExactly(dir, globals, "dp=3", {"[S(0)]", "[S(1)]", "[S(0)]", "[S(1)]"});
  ExpectLoadsExactly(dir, globals, "dp=3", {"[R]", "[S(0)]", "[R]", "[S(2)]"});
  ExpectLoadsExactly(dir, globals, "1", {"[R]", "[R]", "[R]", "[R]"});
  ExpectLoadsExactly(dir, globals, "dp=5", {"[S(1)]", "[S(0)]", "[S(0)]", "[S(0)]"});
}

TEST(ShardedCheckpointTest, FlippedByteIsRefusedNamingTheShard) {
  std::string root = TempRoot("flip");
  auto globals = MakeGlobals();
  std::string dir = Save(root, 1, globals, "dp=2,tp=2", kSaved);
  const std::string shard = dir + "/shard_00001.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-3, std::ios::end);
    c = char(c ^ 0x10);
    f.write(&c, 1);
  }
  auto got = LoadShards(dir, 0, {{"proj", Spec("1", "[R]", {5, 9})}});
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("shard_00001.safetensors (rank 1)"), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find("corrupted"), std::string::npos) << got.status();
  // A rank whose piece lies only in intact shards still loads.
  auto ok = LoadShards(dir, 0, {{"embed", Spec("dp=2", "[S(0)]", {11, 7})}});
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(ShardedCheckpointTest, ShardFromAnotherSaveAndWrongLayoutAreRefused) {
  std::string root = TempRoot("mismatch");
  auto a = MakeGlobals(), b = MakeGlobals();
  std::string da = Save(root, 1, a, "dp=2,tp=2", kSaved);
  std::string db = Save(root, 2, b, "dp=2,tp=2", kSaved);
  std::filesystem::copy_file(db + "/shard_00002.safetensors", da + "/shard_00002.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  auto got = LoadShards(da, 0, {{"embed", Spec("1", "[R]", {11, 7})}});
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("shard_00002.safetensors (rank 2)"), std::string::npos) << got.status();

  auto shape = LoadShards(db, 0, {{"embed", Spec("1", "[R]", {12, 7})}});
  EXPECT_TRUE(absl::IsInvalidArgument(shape.status())) << shape.status();
  EXPECT_NE(shape.status().message().find("'embed' has global shape [11,7]"), std::string::npos)
      << shape.status();
  auto missing = LoadShards(db, 0, {{"nope", Spec("1", "[R]", {1})}});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  std::filesystem::remove(db + "/shard_00003.safetensors");
  auto gone = LoadShards(db, 0, {{"deep", Spec("1", "[R]", {3, 4, 6})}});
  EXPECT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("shard_00003.safetensors (rank 3)"), std::string::npos) << gone.status();
}

TEST(ShardedCheckpointTest, WriteShardChecksLocalShapesAndPlacements) {
  Tensor t = Tensor::Empty({4, 7}, DType::kF32, Device::Cpu()).value();
  std::string root = TempRoot("args");
  auto bad = WriteShard(root + "/s", 0, 1, {{"w", Spec("dp=2", "[S(0)]", {11, 7}), t}});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("gives [6,7]"), std::string::npos) << bad.status();
  auto partial = WriteShard(root + "/s", 0, 1, {{"w", Spec("dp=2", "[P(sum)]", {4, 7}), t}});
  EXPECT_TRUE(absl::IsInvalidArgument(partial.status())) << partial.status();
}

TEST(ShardedCheckpointTest, RecordsRoundTripThroughJson) {
  ShardRecord r;
  r.rank = 3;
  r.file = "shard_00003.safetensors";
  r.hash = "sg64:0123456789abcdef";
  r.bytes = 99;
  r.tensors["w"] = {DType::kBF16, Spec("dp=2,tp=2", "[S(0),R]", {8, 3})};
  auto back = ShardRecord::FromJson(r.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->hash, r.hash);
  EXPECT_EQ(back->tensors.at("w").first, DType::kBF16);
  EXPECT_EQ(back->tensors.at("w").second, r.tensors.at("w").second);
  EXPECT_FALSE(ShardRecord::FromJson("{\"rank\": 1}").ok());
}

// A child process saves step 2 over and over while the parent SIGKILLs it at a different moment
// each round: step 1 (or a complete step 2) stays loadable, with exact values.
TEST(ShardedCheckpointTest, KillDuringSaveLeavesPreviousCheckpointLoadable) {
  std::string root = TempRoot("kill");
  auto globals = MakeGlobals();
  Save(root, 1, globals, "dp=2,tp=2", kSaved);
  auto& rng = sg::testing::Rng();
  std::vector<Global> big = {{"big", sg::testing::RandomTensor({512, 1024}, DType::kF32, Device::Cpu(), rng)}};
  int killed_mid_save = 0;
  for (int round = 0; round < 6; ++round) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::vector<Tensor> keep;
      auto per_rank = Pieces(big, "dp=4", {"[S(0)]"}, &keep);
      (void)!::write(ready[1], "r", 1);
      for (int i = 0; i < 1000; ++i) (void)SaveShardedCheckpoint(StepDir(root, 2), 2, per_rank);
      ::_exit(0);
    }
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    ::close(ready[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(300 + 2500 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    for (const auto& e : std::filesystem::directory_iterator(root)) {
      killed_mid_save += e.path().filename().string().find(".tmp.") != std::string::npos;
    }
    auto latest = FindLatestShardedCheckpoint(root);
    ASSERT_TRUE(latest.ok()) << latest.status();
    if (*latest == StepDir(root, 1)) {
      ExpectLoadsExactly(*latest, globals, "dp=3", {"[S(0)]", "[S(1)]", "[S(0)]", "[S(1)]"});
    } else {
      ASSERT_EQ(*latest, StepDir(root, 2));
      ExpectLoadsExactly(*latest, big, "dp=3", {"[S(1)]"});
      ExpectLoadsExactly(StepDir(root, 1), globals, "1", {"[R]", "[R]", "[R]", "[R]"});
    }
  }
  EXPECT_GT(killed_mid_save, 0) << "no kill landed inside a save";
}

}  // namespace
}  // namespace sg::trainer
