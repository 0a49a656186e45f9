// Static memory planning for a lowered step: every transient buffer of the step gets an offset in
// one arena, chosen from buffer lifetimes so buffers whose lifetimes do not overlap share memory.
//
//   MemoryPlanner planner;
//   int a = planner.Add(/*bytes=*/4096, /*first=*/0, /*last=*/3);   // live during steps 0..3
//   int b = planner.Add(4096, 4, 7);                                  // may reuse a's bytes
//   MemoryPlan plan = planner.Plan();   // plan.offsets[a], plan.offsets[b], plan.arena_bytes
//
// Lifetimes are inclusive step indices. Placement is greedy best-fit by decreasing size (the
// classic offset-assignment heuristic, as in TFLite's and XLA's planners): a buffer takes the
// lowest offset that does not collide with an already placed buffer whose lifetime overlaps.
// The graph layer's memory-planning pass will provide lifetimes once it lands; this planner takes
// plain intervals so either source of lifetimes works.
#ifndef SGTRAIN_COMPILER_MEMORY_PLAN_H_
#define SGTRAIN_COMPILER_MEMORY_PLAN_H_

#include <cstdint>
#include <vector>

namespace sg::compiler {

// Offsets are multiples of this (cuBLASLt and 16-byte vector loads want aligned operands).
inline constexpr int64_t kArenaAlignment = 256;

struct MemoryPlan {
  std::vector<int64_t> offsets;  // per buffer, in Add order
  int64_t arena_bytes = 0;       // the arena size the offsets need
  int64_t sum_bytes = 0;         // what the buffers would take without reuse
  // Per buffer, in Add order: its aligned size and lifetime (for accounting: ArenaPeak).
  std::vector<int64_t> bytes;
  std::vector<int> first, last;
};

class MemoryPlanner {
 public:
  // Registers a buffer of `bytes` live from step `first` to step `last` (inclusive); returns its
  // index in MemoryPlan::offsets. Precondition: first <= last.
  int Add(int64_t bytes, int first, int last);
  // Extends buffer `i`'s lifetime to cover step `step`.
  void Touch(int i, int step);
  MemoryPlan Plan() const;
  int size() const { return int(buffers_.size()); }

 private:
  struct Buffer {
    int64_t bytes;
    int first, last;
  };
  std::vector<Buffer> buffers_;
};

inline int64_t AlignUp(int64_t n, int64_t a = kArenaAlignment) { return (n + a - 1) / a * a; }

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_MEMORY_PLAN_H_
