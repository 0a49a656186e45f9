#include "sharding/placement.h"

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "sharding/mesh.h"

namespace sg::sharding {
namespace {

TEST(DeviceMesh, ParsesBothForms) {
  DeviceMesh a = DeviceMesh::Parse("2x4").value();
  DeviceMesh b = DeviceMesh::Parse("dp=2,tp=4").value();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 8);
  EXPECT_EQ(a.ToString(), "dp=2,tp=4");
  EXPECT_EQ(DeviceMesh::Parse("8").value().ToString(), "dp=8");
  EXPECT_EQ(DeviceMesh::Parse("2x2x2").value().ToString(), "d0=2,d1=2,d2=2");
  EXPECT_EQ(DeviceMesh::Parse("replica=2, shard=3").value().dim_name(1), "shard");
}

TEST(DeviceMesh, RejectsBadInput) {
  EXPECT_FALSE(DeviceMesh::Parse("2xfoo").ok());
  EXPECT_FALSE(DeviceMesh::Parse("dp=0").ok());
  EXPECT_FALSE(DeviceMesh::Parse("dp=2,dp=2").ok());
  EXPECT_FALSE(DeviceMesh::Parse("dp").ok());
  absl::Status s = DeviceMesh::Parse("2x-1").status();
  EXPECT_NE(s.message().find("expected size >= 1, found -1"), std::string::npos) << s;
  EXPECT_FALSE(DeviceMesh::Parse("dp=2").value().DimIndex("tp").ok());
}

TEST(DeviceMesh, GroupsAreRowsAndColumns) {
  DeviceMesh m = DeviceMesh::Parse("dp=2,tp=4").value();
  EXPECT_EQ(m.Coordinates(6), (std::vector<int>{1, 2}));
  EXPECT_EQ(m.RankAt({1, 2}), 6);
  EXPECT_EQ(m.GroupRanks(6, 1), (std::vector<int>{4, 5, 6, 7}));  // tp: contiguous ranks
  EXPECT_EQ(m.GroupRanks(6, 0), (std::vector<int>{2, 6}));        // dp: stride 4
  EXPECT_EQ(m.AllGroups(0), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.AllGroups(1), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Every rank is in exactly one group per mesh dim, at its own coordinate.
  for (int dim = 0; dim < 2; ++dim) {
    for (int r = 0; r < m.size(); ++r) {
      EXPECT_EQ(m.GroupRanks(r, dim)[m.Coordinates(r)[dim]], r);
    }
  }
}

TEST(Placement, ValueSemantics) {
  EXPECT_EQ(Placement::Shard(0).ToString(), "S(0)");
  EXPECT_EQ(Placement::Replicate().ToString(), "R");
  EXPECT_EQ(Placement::Partial().ToString(), "P(sum)");
  EXPECT_EQ(Placement::Partial(ReduceOp::kMax).ToString(), "P(max)");
  EXPECT_EQ(Placement::Shard(1), Placement::Shard(1));
  EXPECT_NE(Placement::Shard(1), Placement::Shard(0));
  EXPECT_NE(Placement::Partial(ReduceOp::kAvg), Placement::Partial(ReduceOp::kSum));
  absl::flat_hash_set<Placement> set = {Placement::Shard(0), Placement::Shard(0), Placement(),
                                        Placement::Partial()};
  EXPECT_EQ(set.size(), 3u);
  for (const char* text : {"R", "S(3)", "P(sum)", "P(avg)", "P(max)"}) {
    EXPECT_EQ(Placement::Parse(text).value().ToString(), text);
  }
  EXPECT_FALSE(Placement::Parse("S(x)").ok());
  EXPECT_FALSE(Placement::Parse("P(min)").ok());
  EXPECT_EQ(PlacementsToString(ParsePlacements("[S(0),P(avg)]").value()), "[S(0),P(avg)]");
}

TEST(Chunk, MatchesTorchChunk) {
  // torch.chunk(arange(10), 4) -> sizes 3,3,3,1; torch.chunk(arange(2), 4) -> 1,1,0,0.
  EXPECT_EQ(Chunk(10, 4, 0).length, 3);
  EXPECT_EQ(Chunk(10, 4, 3).offset, 9);
  EXPECT_EQ(Chunk(10, 4, 3).length, 1);
  EXPECT_EQ(Chunk(2, 4, 1).length, 1);
  EXPECT_EQ(Chunk(2, 4, 2).length, 0);
  EXPECT_EQ(Chunk(2, 4, 3).offset, 2);
  // torch.chunk(arange(6), 4): chunk size 2 -> 2,2,2,0.
  EXPECT_EQ(Chunk(6, 4, 2).length, 2);
  EXPECT_EQ(Chunk(6, 4, 3).length, 0);
}

TEST(TensorSpec, LocalShapesTileTheGlobalTensor) {
  DeviceMesh m = DeviceMesh::Parse("dp=2,tp=3").value();
  for (const char* p : {"[S(0),R]", "[S(0),S(1)]", "[S(0),S(0)]", "[R,S(1)]", "[P(sum),S(0)]"}) {
    TensorSpec s = TensorSpec::Create(m, ParsePlacements(p).value(), {11, 7}).value();
    // Count how often each global element is held, per replica/partial group.
    std::vector<int> held(11 * 7, 0);
    for (int r = 0; r < m.size(); ++r) {
      Shape l = s.LocalShape(r);
      std::vector<int64_t> o = s.LocalOffsets(r);
      for (int64_t i = 0; i < l[0]; ++i)
        for (int64_t j = 0; j < l[1]; ++j) ++held[(o[0] + i) * 7 + o[1] + j];
    }
    int copies = 1;
    for (int d = 0; d < m.ndim(); ++d) {
      if (!s.placements()[d].is_shard()) copies *= m.dim_size(d);
    }
    for (int h : held) EXPECT_EQ(h, copies) << p;
  }
}

TEST(TensorSpec, NestedShardsChunkInMeshDimOrder) {
  DeviceMesh m = DeviceMesh::Parse("dp=2,tp=4").value();
  TensorSpec s = TensorSpec::Create(m, ParsePlacements("[S(0),S(0)]").value(), {10, 2}).value();
  // dp chunk of 10 rows: 5 | 5; tp chunks of 5: 2,2,1,0.
  EXPECT_EQ(s.LocalShape(m.RankAt({1, 2}))[0], 1);
  EXPECT_EQ(s.LocalOffsets(m.RankAt({1, 2}))[0], 9);
  EXPECT_EQ(s.LocalShape(m.RankAt({1, 3}))[0], 0);
  EXPECT_EQ(s.ParentExtent(m.RankAt({1, 2}), 1, 0), 5);
  EXPECT_EQ(s.ToString(), "[10,2] over dp=2,tp=4 as [S(0),S(0)]");
}

TEST(TensorSpec, RejectsBadPlacements) {
  DeviceMesh m = DeviceMesh::Parse("dp=2,tp=4").value();
  EXPECT_FALSE(TensorSpec::Create(m, {Placement::Shard(0)}, {4}).ok());
  absl::Status s = TensorSpec::Create(m, {Placement::Shard(2), Placement()}, {4, 4}).status();
  EXPECT_NE(s.message().find("S(2) is beyond the rank"), std::string::npos) << s;
}

}  // namespace
}  // namespace sg::sharding
