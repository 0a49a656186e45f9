// Redistribution planning: the list of collective steps that turns a tensor held with placements A
// into the same tensor held with placements B, over a mesh. Planning only looks at placements; it
// is done once per (source spec, destination spec) and cached. Execution is separate
// (redistribute_exec.h), through the comm layer.
//
//   RedistributePlanner planner;
//   SG_ASSIGN_OR_RETURN(const RedistributePlan* plan, planner.Plan(src_spec, dst_spec));
//   plan->ToString();  // "[S(0),P(sum)] -> [R,S(0)]: all-gather(dp, S(0)); reduce-scatter(tp, sum, S(0))"
//
// THE LEGAL TRANSITIONS, on one mesh dim of size p (every multi-dim change is a sequence of these):
//
//   | from  | to       | step                                        | traffic per rank         |
//   |-------|----------|---------------------------------------------|--------------------------|
//   | S(i)  | R        | all-gather along tensor dim i               | (p-1)/p * full           |
//   | P(op) | R        | all-reduce(op)                              | 2(p-1)/p * full          |
//   | P(op) | S(j)     | reduce-scatter(op) along tensor dim j       | (p-1)/p * full           |
//   | S(i)  | S(j)     | all-to-all: dim i gathered, dim j split     | (p-1)/p * local          |
//   | R     | S(j)     | local slice of chunk k along j (no traffic) | 0                        |
//   | R     | P(sum)   | local: coordinate 0 keeps, others zero      | 0                        |
//   | R     | P(avg|max)| local: every coordinate keeps its copy     | 0                        |
//   | S(i)  | P(op)    | all-gather (S->R), then R->P                | as S->R                  |
//   | P(a)  | P(b), a!=b | all-reduce(a) (P->R), then R->P(b)        | as P->R                  |
//   | X     | X        | nothing                                     | 0                        |
//
// Shards of one tensor dim by several mesh dims nest in mesh-dim order (placement.h), so steps are
// ordered to keep every intermediate layout valid:
//   1. from the last mesh dim to the first, undo each shard that does not survive: a shard on mesh
//      dim m survives when B has the same shard there and every earlier mesh dim sharding that
//      tensor dim (in A or B) survives too. Undo = all-to-all when B shards another dim j on m and
//      every earlier mesh dim sharding j (in A or B) survives; all-gather otherwise.
//   2. from the first mesh dim to the last: P -> R / S / P' reductions, R -> S slices and R -> P.
// Uneven chunks (torch.chunk) are padded to ceil(n/p) inside each collective and trimmed after.
#ifndef SGTRAIN_SHARDING_REDISTRIBUTE_H_
#define SGTRAIN_SHARDING_REDISTRIBUTE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace sg::sharding {

enum class StepKind : uint8_t {
  kAllGather,      // S(from_dim) -> R
  kAllReduce,      // P(op) -> R
  kReduceScatter,  // P(op) -> S(to_dim)
  kAllToAll,       // S(from_dim) -> S(to_dim)
  kLocalSlice,     // R -> S(to_dim)
  kLocalPartial,   // R -> P(op)
};
absl::string_view StepKindName(StepKind k);  // "all-gather", ...
// True for the steps that move data between ranks.
inline bool IsCollective(StepKind k) { return k != StepKind::kLocalSlice && k != StepKind::kLocalPartial; }

struct RedistributeStep {
  StepKind kind;
  int mesh_dim = 0;
  int from_dim = -1;  // tensor dim gathered (all-gather, all-to-all)
  int to_dim = -1;    // tensor dim split (reduce-scatter, all-to-all, local slice)
  ReduceOp op = ReduceOp::kSum;  // all-reduce, reduce-scatter, local partial
  Placements before, after;      // the whole placement list around this step
  // "all-gather(dp, S(0))"
  std::string ToString(const DeviceMesh& mesh) const;
};

struct RedistributePlan {
  DeviceMesh mesh;
  Placements src, dst;
  std::vector<RedistributeStep> steps;
  // "[S(0),R] -> [R,R]: all-gather(dp, S(0))"; "... : nothing" when src == dst.
  std::string ToString() const;
};

// Plans src -> dst for a tensor of rank `tensor_rank`. InvalidArgument when a list's length differs
// from the mesh's dims or a shard is beyond the rank.
absl::StatusOr<RedistributePlan> PlanRedistribute(const DeviceMesh& mesh, const Placements& src,
                                                  const Placements& dst, int tensor_rank);

// Caches plans by (source spec, destination spec). Not thread-safe.
class RedistributePlanner {
 public:
  // The cached plan, planned on first use. The pointer stays valid for the planner's lifetime.
  // InvalidArgument when the specs differ in mesh or global shape.
  absl::StatusOr<const RedistributePlan*> Plan(const TensorSpec& src, const TensorSpec& dst);
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  absl::flat_hash_map<std::pair<TensorSpec, TensorSpec>, std::unique_ptr<RedistributePlan>> cache_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_REDISTRIBUTE_H_
