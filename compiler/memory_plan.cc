#include "compiler/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace sg::compiler {

int MemoryPlanner::Add(int64_t bytes, int first, int last) {
  buffers_.push_back({AlignUp(std::max<int64_t>(bytes, 1)), first, std::max(first, last)});
  return int(buffers_.size()) - 1;
}

void MemoryPlanner::Touch(int i, int step) {
  buffers_[i].first = std::min(buffers_[i].first, step);
  buffers_[i].last = std::max(buffers_[i].last, step);
}

MemoryPlan MemoryPlanner::Plan() const {
  const int n = int(buffers_.size());
  MemoryPlan plan;
  plan.offsets.assign(n, 0);
  for (const Buffer& b : buffers_) {
    plan.bytes.push_back(b.bytes);
    plan.first.push_back(b.first);
    plan.last.push_back(b.last);
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Big buffers first: they are the hardest to fit; ties broken by start so the result is stable.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (buffers_[a].bytes != buffers_[b].bytes) return buffers_[a].bytes > buffers_[b].bytes;
    return buffers_[a].first < buffers_[b].first;
  });
  std::vector<int> placed;
  for (int i : order) {
    const Buffer& b = buffers_[i];
    plan.sum_bytes += b.bytes;
    // Occupied ranges of already placed buffers alive at the same time, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (int j : placed) {
      const Buffer& o = buffers_[j];
      if (o.last < b.first || b.last < o.first) continue;
      busy.push_back({plan.offsets[j], plan.offsets[j] + o.bytes});
    }
    std::sort(busy.begin(), busy.end());
    // Best fit: the smallest gap that holds the buffer; past the end when none does.
    int64_t best = -1, best_gap = INT64_MAX, cursor = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo > cursor && lo - cursor >= b.bytes && lo - cursor < best_gap) {
        best = cursor;
        best_gap = lo - cursor;
      }
      cursor = std::max(cursor, hi);
    }
    if (best < 0) best = cursor;
    plan.offsets[i] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + b.bytes);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace sg::compiler
