// Redistribution executed for real: one test per row of the transition table (redistribute.h) and
// per multi-dim combination, each on separate processes on localhost through the comm layer
// (ProcessGroup over UCX). Every worker rebuilds the global tensor (and every rank's partial
// contribution) from the shared seed, so the single-process reference is computed in each worker;
// values are small integers stored in f32, so sums in any order are exact and the check is ==.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "sharding/comm_collectives.h"
#include "sharding/redistribute.h"
#include "sharding/redistribute_exec.h"

namespace sg::sharding {
namespace {

struct Row {
  const char* name;
  const char* mesh;
  const char* src;
  const char* dst;
  Shape shape;
};

// Shapes are odd on purpose: uneven torch.chunk pieces, some ranks holding nothing.
const std::vector<Row>& Rows() {
  static const auto* rows = new std::vector<Row>{
      {"ShardToReplicate", "dp=4", "[S(0)]", "[R]", {10, 3}},
      {"PartialSumToReplicate", "dp=4", "[P(sum)]", "[R]", {5, 7}},
      {"PartialMaxToReplicate", "dp=3", "[P(max)]", "[R]", {5, 7}},
      {"PartialAvgToShard", "dp=4", "[P(avg)]", "[S(1)]", {3, 10}},
      {"PartialSumToShard", "dp=3", "[P(sum)]", "[S(0)]", {2, 5}},
      {"ShardToShard", "dp=4", "[S(0)]", "[S(1)]", {6, 9}},
      {"ReplicateToShard", "dp=4", "[R]", "[S(1)]", {4, 7}},
      {"ReplicateToPartialSum", "dp=4", "[R]", "[P(sum)]", {3, 3}},
      {"ReplicateToPartialMax", "dp=3", "[R]", "[P(max)]", {3, 3}},
      {"ShardToPartialSum", "dp=3", "[S(1)]", "[P(sum)]", {2, 7}},
      {"PartialSumToPartialMax", "dp=3", "[P(sum)]", "[P(max)]", {4, 4}},
      {"Unchanged", "dp=3", "[S(1)]", "[S(1)]", {4, 4}},
      {"NestedShardsToReplicate", "2x2", "[S(0),S(0)]", "[R,R]", {7, 3}},
      {"ReplicateShardToNestedShards", "2x2", "[R,S(0)]", "[S(0),S(0)]", {9, 2}},
      {"HybridShardGrads", "2x2", "[P(sum),P(sum)]", "[R,S(0)]", {5, 3}},
      {"PartialShardToShardReplicate", "2x2", "[P(sum),S(0)]", "[S(1),R]", {6, 5}},
      {"SwapShards", "2x2", "[S(0),S(1)]", "[S(1),S(0)]", {5, 7}},
      {"FsdpTpParamGather", "2x2", "[S(0),S(1)]", "[R,S(1)]", {6, 6}},
      {"AllToAllInnerOnly", "2x2", "[S(0),S(1)]", "[S(0),S(0)]", {7, 5}},
  };
  return *rows;
}

// Small integers in f32, from (seed, contribution index).
std::vector<double> Values(int64_t seed, int which, int64_t n) {
  std::mt19937_64 rng(uint64_t(seed) * 7919 + uint64_t(which));
  std::uniform_int_distribution<int> u(-50, 50);
  std::vector<double> v(size_t(n), 0);
  for (double& x : v) x = u(rng);
  return v;
}

// Index of rank's contribution among the partial dims' coordinates (0 when none is partial).
int PartialIndex(const DeviceMesh& mesh, const Placements& p, int rank) {
  const std::vector<int> c = mesh.Coordinates(rank);
  int idx = 0;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (p[m].is_partial()) idx = idx * mesh.dim_size(m) + c[m];
  }
  return idx;
}

TEST(Workers, DISABLED_Redistribute) {
  const Row& row = Rows()[comm::testing::EnvInt("SG_ROW", 0)];
  const int64_t seed = comm::testing::EnvInt("SG_SEED", 1);
  comm::ProcessGroupOptions opt;
  opt.timeout = absl::Seconds(20);
  auto w = comm::testing::MakeWorkerWorld(opt);
  ASSERT_TRUE(w.ok()) << w.status();
  const DeviceMesh mesh = DeviceMesh::Parse(row.mesh).value();
  auto coll = ProcessGroupCollectives::Create(w->world.get(), mesh);
  ASSERT_TRUE(coll.ok()) << coll.status();
  const int me = w->rank;
  const TensorSpec src = TensorSpec::Create(mesh, ParsePlacements(row.src).value(), row.shape).value();
  const TensorSpec dst = src.WithPlacements(ParsePlacements(row.dst).value());

  // The reference: contributions C_k over the partial dims' coordinates, X = op over k of C_k.
  int num_contrib = 1;
  ReduceOp src_op = ReduceOp::kSum;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (src.placements()[m].is_partial()) {
      num_contrib *= mesh.dim_size(m);
      src_op = src.placements()[m].reduce_op();
    }
  }
  const int64_t n = NumElements(row.shape);
  std::vector<double> x(size_t(n), src_op == ReduceOp::kMax ? -1e30 : 0.0);
  for (int k = 0; k < num_contrib; ++k) {
    std::vector<double> c = Values(seed, k, n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = src_op == ReduceOp::kMax ? std::max(x[i], c[i]) : x[i] + c[i];
    }
  }
  if (src_op == ReduceOp::kAvg) {
    for (double& v : x) v /= num_contrib;  // num_contrib is a power of two in avg rows: exact
  }
  Tensor mine_global = testing::FromHost(Values(seed, PartialIndex(mesh, src.placements(), me), n),
                                         row.shape, DType::kF32, Device::Cpu());
  Tensor local = LocalShard(mine_global.view(), src, me).value();

  RedistributePlanner planner;
  const RedistributePlan* plan = planner.Plan(src, dst).value();
  absl::StatusOr<Tensor> out = ExecuteRedistribute(*plan, src, local.view(), **coll);
  ASSERT_TRUE(out.ok()) << out.status();

  // Expected: the destination's piece of X; a P(sum) made from R lives on coordinate 0 only.
  Placements as_replicated = dst.placements();
  bool zeroed = false;
  const std::vector<int> coords = mesh.Coordinates(me);
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (!as_replicated[m].is_partial()) continue;
    zeroed |= as_replicated[m].reduce_op() == ReduceOp::kSum && coords[m] != 0;
    as_replicated[m] = Placement::Replicate();
  }
  Tensor xt = testing::FromHost(x, row.shape, DType::kF32, Device::Cpu());
  Tensor want = LocalShard(xt.view(), dst.WithPlacements(as_replicated), me).value();
  std::vector<double> want_v = testing::ToHost(want.view());
  if (zeroed) want_v.assign(want_v.size(), 0.0);
  ASSERT_EQ(ShapeToString(out->shape()), ShapeToString(dst.LocalShape(me))) << plan->ToString();
  EXPECT_EQ(testing::ToHost(out->view()), want_v) << "rank " << me << ": " << plan->ToString();
  // Nobody leaves while a peer may still be connecting to it (local-only plans finish at once).
  absl::Status done = w->world->Barrier();
  EXPECT_TRUE(done.ok()) << done;
}

class RedistributeRow : public ::testing::TestWithParam<int> {};

TEST_P(RedistributeRow, ValuesExactOnRealProcesses) {
  const Row& row = Rows()[GetParam()];
  const int n = DeviceMesh::Parse(row.mesh).value().size();
  comm::testing::WorkerRun run = comm::testing::RunWorkers(
      n, "Workers.DISABLED_Redistribute",
      {absl::StrCat("SG_ROW=", GetParam()),
       absl::StrCat("SG_SEED=", sg::testing::Rng()() % 1000000007)},
      absl::Seconds(60));
  EXPECT_TRUE(run.AllPassed()) << row.name << ": " << row.src << " -> " << row.dst << "\n"
                               << run.Summary();
}

INSTANTIATE_TEST_SUITE_P(Table, RedistributeRow, ::testing::Range(0, int(Rows().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(Rows()[i.param].name);
                         });

}  // namespace
}  // namespace sg::sharding
