// Planning tests: one per row of the transition table in redistribute.h (the steps chosen), the
// multi-dim ordering cases, and the cache. Values after execution: redistribute_multiprocess_test.
#include "sharding/redistribute.h"

#include "gtest/gtest.h"

namespace sg::sharding {
namespace {

std::string PlanText(const char* mesh, const char* src, const char* dst, int rank = 2) {
  DeviceMesh m = DeviceMesh::Parse(mesh).value();
  absl::StatusOr<RedistributePlan> p =
      PlanRedistribute(m, ParsePlacements(src).value(), ParsePlacements(dst).value(), rank);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->ToString() : "";
}

TEST(PlanRedistribute, OneDimTable) {
  EXPECT_EQ(PlanText("dp=4", "[S(0)]", "[R]"), "[S(0)] -> [R]: all-gather(dp, S(0))");
  EXPECT_EQ(PlanText("dp=4", "[P(sum)]", "[R]"), "[P(sum)] -> [R]: all-reduce(dp, sum)");
  EXPECT_EQ(PlanText("dp=4", "[P(avg)]", "[S(1)]"),
            "[P(avg)] -> [S(1)]: reduce-scatter(dp, avg, S(1))");
  EXPECT_EQ(PlanText("dp=4", "[S(0)]", "[S(1)]"), "[S(0)] -> [S(1)]: all-to-all(dp, S(0)->S(1))");
  EXPECT_EQ(PlanText("dp=4", "[R]", "[S(1)]"), "[R] -> [S(1)]: local-slice(dp, S(1))");
  EXPECT_EQ(PlanText("dp=4", "[R]", "[P(sum)]"), "[R] -> [P(sum)]: local-partial(dp, sum)");
  EXPECT_EQ(PlanText("dp=4", "[R]", "[P(max)]"), "[R] -> [P(max)]: local-partial(dp, max)");
  EXPECT_EQ(PlanText("dp=4", "[S(0)]", "[P(sum)]"),
            "[S(0)] -> [P(sum)]: all-gather(dp, S(0)); local-partial(dp, sum)");
  EXPECT_EQ(PlanText("dp=4", "[P(sum)]", "[P(max)]"),
            "[P(sum)] -> [P(max)]: all-reduce(dp, sum); local-partial(dp, max)");
  EXPECT_EQ(PlanText("dp=4", "[S(1)]", "[S(1)]"), "[S(1)] -> [S(1)]: nothing");
}

TEST(PlanRedistribute, MultiDimOrdering) {
  // Nested shards of one dim are gathered innermost first.
  EXPECT_EQ(PlanText("2x2", "[S(0),S(0)]", "[R,R]"),
            "[S(0),S(0)] -> [R,R]: all-gather(tp, S(0)); all-gather(dp, S(0))");
  // The outer shard must come first: the inner one is undone and redone.
  EXPECT_EQ(PlanText("2x2", "[R,S(0)]", "[S(0),S(0)]"),
            "[R,S(0)] -> [S(0),S(0)]: all-gather(tp, S(0)); local-slice(dp, S(0)); "
            "local-slice(tp, S(0))");
  // An outer shard that stays keeps the inner one valid.
  EXPECT_EQ(PlanText("2x2", "[S(0),S(0)]", "[S(0),R]"),
            "[S(0),S(0)] -> [S(0),R]: all-gather(tp, S(0))");
  // HYBRID_SHARD gradients: all-reduce across replicas, reduce-scatter within the shard group.
  EXPECT_EQ(PlanText("2x2", "[P(sum),P(sum)]", "[R,S(0)]"),
            "[P(sum),P(sum)] -> [R,S(0)]: all-reduce(dp, sum); reduce-scatter(tp, sum, S(0))");
  // Two reduce-scatters of one dim nest outer first.
  EXPECT_EQ(PlanText("2x2", "[P(sum),P(sum)]", "[S(0),S(0)]"),
            "[P(sum),P(sum)] -> [S(0),S(0)]: reduce-scatter(dp, sum, S(0)); "
            "reduce-scatter(tp, sum, S(0))");
  EXPECT_EQ(PlanText("2x2", "[S(0),S(1)]", "[S(1),S(0)]"),
            "[S(0),S(1)] -> [S(1),S(0)]: all-gather(tp, S(1)); all-to-all(dp, S(0)->S(1)); "
            "local-slice(tp, S(0))");
  EXPECT_EQ(PlanText("2x2", "[S(0),S(1)]", "[S(0),S(0)]"),
            "[S(0),S(1)] -> [S(0),S(0)]: all-to-all(tp, S(1)->S(0))");
  // All-to-all onto a dim whose outer shard is not in place yet would nest wrongly: gather.
  EXPECT_EQ(PlanText("2x2", "[R,S(0)]", "[S(1),S(1)]"),
            "[R,S(0)] -> [S(1),S(1)]: all-gather(tp, S(0)); local-slice(dp, S(1)); "
            "local-slice(tp, S(1))");
  EXPECT_EQ(PlanText("2x2", "[P(sum),S(0)]", "[S(1),R]"),
            "[P(sum),S(0)] -> [S(1),R]: all-gather(tp, S(0)); reduce-scatter(dp, sum, S(1))");
}

TEST(PlanRedistribute, StepsCarryIntermediatePlacements) {
  DeviceMesh m = DeviceMesh::Parse("2x2").value();
  RedistributePlan p = PlanRedistribute(m, ParsePlacements("[S(0),P(sum)]").value(),
                                        ParsePlacements("[R,S(0)]").value(), 2)
                           .value();
  ASSERT_EQ(p.steps.size(), 2u);
  EXPECT_EQ(p.steps[0].before, p.src);
  EXPECT_EQ(p.steps[0].after, p.steps[1].before);
  EXPECT_EQ(p.steps.back().after, p.dst);
}

TEST(PlanRedistribute, RejectsBadPlacements) {
  DeviceMesh m = DeviceMesh::Parse("2x2").value();
  absl::Status s = PlanRedistribute(m, {Placement()}, {Placement()}, 2).status();
  EXPECT_NE(s.message().find("expected 2 placements for mesh dp=2,tp=2"), std::string::npos) << s;
  s = PlanRedistribute(m, {Placement(), Placement::Shard(3)}, {Placement(), Placement()}, 2)
          .status();
  EXPECT_NE(s.message().find("S(3) is beyond tensor rank 2"), std::string::npos) << s;
}

TEST(RedistributePlanner, CachesBySpecPair) {
  DeviceMesh m = DeviceMesh::Parse("2x2").value();
  TensorSpec a = TensorSpec::Create(m, ParsePlacements("[S(0),R]").value(), {8, 8}).value();
  TensorSpec b = a.WithPlacements(ParsePlacements("[R,R]").value());
  RedistributePlanner planner;
  const RedistributePlan* p1 = planner.Plan(a, b).value();
  const RedistributePlan* p2 = planner.Plan(a, b).value();
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(planner.hits(), 1);
  EXPECT_EQ(planner.misses(), 1);
  planner.Plan(b, a).value();
  EXPECT_EQ(planner.misses(), 2);
  TensorSpec other = TensorSpec::Create(m, b.placements(), {8, 4}).value();
  EXPECT_FALSE(planner.Plan(a, other).ok());
}

}  // namespace
}  // namespace sg::sharding
