// ShardBucket on real processes (localhost, CPU, UCX): 3 ranks, tensors whose rows split unevenly
// (one rank's chunk empty; packed) and evenly (in place), against the full tensors computed on every rank from a shared seed:
// Gather of every rank's rows rebuilds them, ReduceScatter gives each rank the sum of its rows.
#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/shard_bucket.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

// {6, 2} splits evenly over 3 (gathered and reduce-scattered in place); the others are packed.
const std::vector<Shape> kShapes = {{5, 3}, {2, 4}, {7}, {}, {1, 2}, {6, 2}};

// Rank r's full tensor i: seeded by (seed, r, i), so every rank can compute every rank's.
std::vector<float> Values(uint64_t seed, int r, size_t i) {
  std::mt19937_64 rng(seed * 1000003 + uint64_t(r) * 101 + i);
  std::normal_distribution<float> n;
  std::vector<float> v(size_t(NumElements(kShapes[i])));
  for (float& x : v) x = n(rng);
  return v;
}

TensorView View(std::vector<float>& v) { return TensorView(v.data(), DType::kF32, {int64_t(v.size())}, Device::Cpu()); }

TEST(Workers, DISABLED_Bucket) {
  auto w = comm::testing::MakeWorkerWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  const uint64_t seed = uint64_t(comm::testing::EnvInt("SG_BUCKET_SEED", 1));
  auto b = ShardBucket::Create(kShapes, w->world.get(), Device::Cpu());
  ASSERT_TRUE(b.ok()) << b.status();
  const int P = w->size, me = w->rank;
  std::vector<std::vector<float>> full(kShapes.size()), shard(kShapes.size());
  std::vector<TensorView> fv, sv;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    full[i].assign(size_t(NumElements(kShapes[i])), -7.f);  // poison
    // Rank r's shard of tensor i is its rows of Values(seed, 0, i): together they are that tensor.
    std::vector<float> whole = Values(seed, 0, i);
    const sharding::ChunkRange c = b->rows(int(i));
    const int64_t row = kShapes[i].empty() ? 1 : NumElements(kShapes[i]) / kShapes[i][0];
    shard[i].assign(whole.begin() + c.offset * row, whole.begin() + (c.offset + c.length) * row);
    fv.push_back(View(full[i]));
    sv.push_back(View(shard[i]));
  }
  EXPECT_EQ(b->shard_numel(0), (me < 2 ? 2 : 1) * 3);
  EXPECT_EQ(b->shard_numel(1), me < 2 ? 4 : 0) << "2 rows over 3 ranks: the last chunk is empty";
  ASSERT_TRUE(b->Gather(sv, fv, Stream::Cpu()).ok());
  for (size_t i = 0; i < kShapes.size(); ++i) EXPECT_EQ(full[i], Values(seed, 0, i)) << "tensor " << i;
  // Only tensors 2 (packed) and 5 (in place), into fresh poison.
  for (int i : {0, 2, 5}) std::fill(full[size_t(i)].begin(), full[size_t(i)].end(), -7.f);
  ASSERT_TRUE(b->Gather(sv, fv, Stream::Cpu(), {2, 5}).ok());
  EXPECT_EQ(full[2], Values(seed, 0, 2));
  EXPECT_EQ(full[5], Values(seed, 0, 5));
  EXPECT_EQ(full[0][0], -7.f) << "tensors outside `which` untouched";

  // Reduce-scatter: every rank contributes Values(seed, r, i).
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const std::vector<float> mine = Values(seed, me, i);
    std::copy(mine.begin(), mine.end(), full[i].begin());  // in place: the views point into full[i]
    std::fill(shard[i].begin(), shard[i].end(), -7.f);
  }
  ASSERT_TRUE(b->ReduceScatter(fv, sv, Stream::Cpu()).ok());
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const sharding::ChunkRange c = b->rows(int(i));
    const int64_t row = kShapes[i].empty() ? 1 : NumElements(kShapes[i]) / kShapes[i][0];
    for (int64_t k = 0; k < c.length * row; ++k) {
      double sum = 0;
      for (int r = 0; r < P; ++r) sum += Values(seed, r, i)[size_t(c.offset * row + k)];
      EXPECT_NEAR(shard[i][size_t(k)], sum, 1e-5) << "tensor " << i << " element " << k;
    }
  }
  std::vector<float> wrong(11);  // no rank's shard of tensor 0 has 11 elements
  std::vector<TensorView> bad = sv;
  bad[0] = View(wrong);
  EXPECT_FALSE(b->Gather(bad, fv, Stream::Cpu()).ok()) << "a shard of the wrong size is rejected";
  EXPECT_TRUE(w->world->Barrier().ok());
  EXPECT_TRUE(w->rdzv->Finalize(absl::Now() + absl::Seconds(20)).ok());
}

TEST(ShardBucketTest, ThreeRanksUnevenChunksGatherAndReduceScatter) {
  auto run = comm::testing::RunWorkers(3, "Workers.DISABLED_Bucket",
                                       {absl::StrCat("SG_BUCKET_SEED=", sg::testing::Rng()() % 1000000)},
                                       absl::Seconds(40));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

}  // namespace
}  // namespace sg::compiler
