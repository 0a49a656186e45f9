#include "graph/passes/memory_plan.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::graph {
namespace {

constexpr int64_t kAlign = 256;

std::string Bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return absl::StrFormat("%.2f GiB", double(b) / double(1 << 30));
  if (b >= (1 << 20)) return absl::StrFormat("%.2f MiB", double(b) / double(1 << 20));
  return absl::StrCat(b, " B");
}

// First-fit allocator over [0, inf) keeping free ranges sorted by offset and coalesced.
class Arena {
 public:
  int64_t Allocate(int64_t bytes) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes) {
        const int64_t off = it->first;
        const int64_t rest = it->second - bytes;
        free_.erase(it);
        if (rest > 0) free_[off + bytes] = rest;
        return off;
      }
    }
    // Extend the arena, merging with a free range that ends at the top.
    int64_t off = top_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        off = last->first;
        free_.erase(last);
      }
    }
    top_ = off + bytes;
    return off;
  }
  void Free(int64_t off, int64_t bytes) {
    auto [it, ok] = free_.emplace(off, bytes);
    auto next = std::next(it);
    if (next != free_.end() && off + bytes == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  int64_t top() const { return top_; }

 private:
  std::map<int64_t, int64_t> free_;
  int64_t top_ = 0;
};

}  // namespace

std::string MemoryPlan::ToString() const {
  return absl::StrCat("arena ", Bytes(arena_bytes), " (live lower bound ", Bytes(live_lower_bound),
                      "), persistent ", Bytes(persistent_bytes));
}

absl::StatusOr<MemoryPlan> PlanMemory(const Graph& g, const Binding& binding) {
  SG_RETURN_IF_ERROR(Verify(g));
  SG_RETURN_IF_ERROR(CheckBinding(g, binding));
  const auto& nodes = g.nodes();
  const int end = int(nodes.size());
  MemoryPlan plan;
  plan.buffers.resize(g.num_value_ids());
  std::vector<int> root(g.num_value_ids(), -1);  // buffer owner of each value
  std::vector<bool> persistent(g.num_value_ids(), false);
  for (int i = 0; i < end; ++i) {
    const Node& n = nodes[i];
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const int v = n.outputs[k];
      SG_ASSIGN_OR_RETURN(Shape s, Evaluate(g.type(v).shape, binding));
      BufferAssignment& b = plan.buffers[v];
      b.value = v;
      b.bytes = sg::NumElements(s) * SizeOf(g.type(v).dtype);
      b.first_node = b.last_node = i;
      root[v] = v;
      if (n.op == OpKind::kReshape) root[v] = root[n.inputs[0]];
      if (n.op == OpKind::kAdamW) root[v] = root[n.inputs[k == 0 ? 0 : k + 1]];  // p, m, v
      if (n.op == OpKind::kParameter || n.op == OpKind::kInput) {
        persistent[v] = true;
        plan.persistent_bytes += b.bytes;
      }
    }
    for (int in : n.inputs) {
      BufferAssignment& r = plan.buffers[root[in]];
      r.last_node = std::max(r.last_node, i);
    }
    for (int v : n.outputs) {  // an alias keeps its owner alive as long as itself
      if (root[v] != v) plan.buffers[root[v]].last_node = std::max(plan.buffers[root[v]].last_node, i);
    }
  }
  for (const GraphOutput& o : g.outputs()) plan.buffers[root[o.value]].last_node = end;
  // Walk the schedule: allocate a node's outputs, then free what it read for the last time.
  std::vector<std::vector<int>> dies(end + 1);
  for (int v = 0; v < g.num_value_ids(); ++v) {
    if (g.has_value(v) && root[v] == v && !persistent[v]) dies[plan.buffers[v].last_node].push_back(v);
  }
  Arena arena;
  int64_t live = 0;
  for (int i = 0; i < end; ++i) {
    for (int v : nodes[i].outputs) {
      if (root[v] != v || persistent[v]) continue;
      BufferAssignment& b = plan.buffers[v];
      const int64_t size = (b.bytes + kAlign - 1) / kAlign * kAlign;
      b.offset = arena.Allocate(size);
      live += size;
    }
    plan.live_lower_bound = std::max(plan.live_lower_bound, live);
    for (int v : dies[i]) {
      BufferAssignment& b = plan.buffers[v];
      const int64_t size = (b.bytes + kAlign - 1) / kAlign * kAlign;
      arena.Free(b.offset, size);
      live -= size;
    }
  }
  plan.arena_bytes = arena.top();
  return plan;
}

}  // namespace sg::graph
