#include "compiler/memory_plan.h"

#include <random>

#include "gtest/gtest.h"

namespace sg::compiler {
namespace {

TEST(MemoryPlanTest, DisjointLifetimesShareMemory) {
  MemoryPlanner p;
  const int a = p.Add(1000, 0, 2);
  const int b = p.Add(1000, 3, 5);
  const int c = p.Add(500, 1, 4);
  MemoryPlan plan = p.Plan();
  EXPECT_EQ(plan.offsets[a], plan.offsets[b]);  // a dies before b is born
  EXPECT_NE(plan.offsets[a], plan.offsets[c]);
  EXPECT_EQ(plan.arena_bytes, AlignUp(1000) + AlignUp(500));
  EXPECT_EQ(plan.sum_bytes, 2 * AlignUp(1000) + AlignUp(500));
}

TEST(MemoryPlanTest, RandomIntervalsNeverCollide) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    MemoryPlanner p;
    struct B { int64_t bytes; int first, last; };
    std::vector<B> bs;
    for (int i = 0; i < 60; ++i) {
      const int first = int(rng() % 40);
      B b{int64_t(1 + rng() % 5000), first, first + int(rng() % 10)};
      bs.push_back(b);
      p.Add(b.bytes, b.first, b.last);
    }
    MemoryPlan plan = p.Plan();
    int64_t peak_live = 0;
    for (int t = 0; t < 50; ++t) {
      int64_t live = 0;
      for (const B& b : bs) live += (b.first <= t && t <= b.last) ? AlignUp(b.bytes) : 0;
      peak_live = std::max(peak_live, live);
    }
    EXPECT_GE(plan.arena_bytes, peak_live);
    EXPECT_LT(plan.arena_bytes, plan.sum_bytes);  // some reuse happened
    for (size_t i = 0; i < bs.size(); ++i) {
      EXPECT_EQ(plan.offsets[i] % kArenaAlignment, 0);
      for (size_t j = i + 1; j < bs.size(); ++j) {
        const bool time = !(bs[i].last < bs[j].first || bs[j].last < bs[i].first);
        const bool space = plan.offsets[i] < plan.offsets[j] + bs[j].bytes &&
                           plan.offsets[j] < plan.offsets[i] + bs[i].bytes;
        EXPECT_FALSE(time && space) << "buffers " << i << " and " << j << " collide";
      }
    }
  }
}

}  // namespace
}  // namespace sg::compiler
