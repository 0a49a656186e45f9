#include "sharding/redistribute.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sg::sharding {

absl::string_view StepKindName(StepKind k) {
  switch (k) {
    case StepKind::kAllGather: return "all-gather";
    case StepKind::kAllReduce: return "all-reduce";
    case StepKind::kReduceScatter: return "reduce-scatter";
    case StepKind::kAllToAll: return "all-to-all";
    case StepKind::kLocalSlice: return "local-slice";
    case StepKind::kLocalPartial: return "local-partial";
  }
  return "?";
}

std::string RedistributeStep::ToString(const DeviceMesh& mesh) const {
  const std::string& dim = mesh.dim_name(mesh_dim);
  switch (kind) {
    case StepKind::kAllGather: return absl::StrCat("all-gather(", dim, ", S(", from_dim, "))");
    case StepKind::kAllReduce: return absl::StrCat("all-reduce(", dim, ", ", ReduceOpName(op), ")");
    case StepKind::kReduceScatter:
      return absl::StrCat("reduce-scatter(", dim, ", ", ReduceOpName(op), ", S(", to_dim, "))");
    case StepKind::kAllToAll:
      return absl::StrCat("all-to-all(", dim, ", S(", from_dim, ")->S(", to_dim, "))");
    case StepKind::kLocalSlice: return absl::StrCat("local-slice(", dim, ", S(", to_dim, "))");
    case StepKind::kLocalPartial:
      return absl::StrCat("local-partial(", dim, ", ", ReduceOpName(op), ")");
  }
  return "?";
}

std::string RedistributePlan::ToString() const {
  std::string steps_text =
      steps.empty() ? "nothing"
                    : absl::StrJoin(steps, "; ", [&](std::string* o, const RedistributeStep& s) {
                        o->append(s.ToString(mesh));
                      });
  return absl::StrCat(PlacementsToString(src), " -> ", PlacementsToString(dst), ": ", steps_text);
}

namespace {

absl::Status CheckPlacements(const DeviceMesh& mesh, const Placements& p, int rank,
                             const char* what) {
  if (int(p.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("redistribute ", what, ": expected ",
                                                   mesh.ndim(), " placements for mesh ",
                                                   mesh.ToString(), ", found ",
                                                   PlacementsToString(p)));
  }
  for (const Placement& x : p) {
    if (x.is_shard() && x.dim() >= rank) {
      return absl::InvalidArgumentError(absl::StrCat("redistribute ", what, ": ", x.ToString(),
                                                     " is beyond tensor rank ", rank));
    }
  }
  return absl::OkStatus();
}

class Builder {
 public:
  Builder(RedistributePlan* plan, Placements current) : plan_(plan), cur_(std::move(current)) {}
  const Placements& current() const { return cur_; }
  void Add(StepKind kind, int m, Placement after, int from = -1, int to = -1,
           ReduceOp op = ReduceOp::kSum) {
    RedistributeStep s{kind, m, from, to, op, cur_, {}};
    cur_[m] = after;
    s.after = cur_;
    plan_->steps.push_back(std::move(s));
  }

 private:
  RedistributePlan* plan_;
  Placements cur_;
};

}  // namespace

absl::StatusOr<RedistributePlan> PlanRedistribute(const DeviceMesh& mesh, const Placements& src,
                                                  const Placements& dst, int tensor_rank) {
  if (absl::Status s = CheckPlacements(mesh, src, tensor_rank, "source"); !s.ok()) return s;
  if (absl::Status s = CheckPlacements(mesh, dst, tensor_rank, "destination"); !s.ok()) return s;
  RedistributePlan plan{mesh, src, dst, {}};
  const int n = mesh.ndim();
  // survives[m]: src[m] is a shard that stays in place (see the header's ordering rule).
  std::vector<bool> survives(n, false);
  for (int m = 0; m < n; ++m) {
    if (!src[m].is_shard() || src[m] != dst[m]) continue;
    const int d = src[m].dim();
    bool ok = true;
    for (int k = 0; k < m && ok; ++k) {
      if (src[k].is_shard(d) || dst[k].is_shard(d)) ok = survives[k];
    }
    survives[m] = ok;
  }
  Builder b(&plan, src);
  // 1. Undo the shards that do not survive, innermost mesh dim first.
  for (int m = n - 1; m >= 0; --m) {
    if (!src[m].is_shard() || survives[m]) continue;
    const int i = src[m].dim();
    if (dst[m].is_shard() && dst[m].dim() != i) {
      const int j = dst[m].dim();
      // Every outer shard of j, before or after, must stay in place: j then nests correctly now
      // and no outer mesh dim has to gather or split j later, outside this inner shard.
      bool outer_ready = true;
      for (int k = 0; k < m; ++k) {
        if ((src[k].is_shard(j) || dst[k].is_shard(j)) && !survives[k]) outer_ready = false;
      }
      if (outer_ready) {
        b.Add(StepKind::kAllToAll, m, dst[m], i, j);
        continue;
      }
    }
    b.Add(StepKind::kAllGather, m, Placement::Replicate(), i);
  }
  // 2. Reductions, slices and partials, outermost mesh dim first.
  for (int m = 0; m < n; ++m) {
    const Placement cur = b.current()[m];
    const Placement& want = dst[m];
    if (cur == want) continue;
    if (cur.is_partial()) {
      if (want.is_shard()) {
        b.Add(StepKind::kReduceScatter, m, want, -1, want.dim(), cur.reduce_op());
        continue;
      }
      b.Add(StepKind::kAllReduce, m, Placement::Replicate(), -1, -1, cur.reduce_op());
    }
    // Now replicated on m.
    if (want.is_shard()) {
      b.Add(StepKind::kLocalSlice, m, want, -1, want.dim());
    } else if (want.is_partial()) {
      b.Add(StepKind::kLocalPartial, m, want, -1, -1, want.reduce_op());
    }
  }
  return plan;
}

absl::StatusOr<const RedistributePlan*> RedistributePlanner::Plan(const TensorSpec& src,
                                                                  const TensorSpec& dst) {
  if (src.mesh() != dst.mesh() || src.global_shape() != dst.global_shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "redistribute: source and destination must share mesh and global shape: ", src.ToString(),
        " vs ", dst.ToString()));
  }
  auto key = std::make_pair(src, dst);
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    ++hits_;
    return it->second.get();
  }
  ++misses_;
  absl::StatusOr<RedistributePlan> plan = PlanRedistribute(
      src.mesh(), src.placements(), dst.placements(), int(src.global_shape().size()));
  if (!plan.ok()) return plan.status();
  auto owned = std::make_unique<RedistributePlan>(*std::move(plan));
  const RedistributePlan* p = owned.get();
  cache_.emplace(std::move(key), std::move(owned));
  return p;
}

}  // namespace sg::sharding
