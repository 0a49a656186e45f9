// The 1F1B pipeline schedule (PipeDream-flush / Megatron): per stage, the order of micro-batch
// forwards and backwards; a dependency simulator; and the bubble fraction of a timeline.
//
//   std::vector<PipelineAction> order = OneFOneBSchedule(/*stages=*/4, /*stage=*/1, /*micro=*/8);
//   // F0 F1 F2 B0 F3 B1 ... : warm-up forwards, steady one-forward-one-backward, cool-down backwards
//   double theory = OneFOneBBubbleTheory(4, 8);   // (p-1)/(m+p-1) = 3/11
//
// Stage s runs min(p-1-s, m) warm-up forwards, then alternates forward/backward until every
// forward is issued, then the remaining backwards. At most p-s micro-batches are in flight on
// stage s (their stage inputs are what it stashes), the memory bound that makes 1F1B preferable
// to all-forwards-then-all-backwards (GPipe), whose bubble is the same.
#ifndef SGTRAIN_COMPILER_PIPELINE_SCHEDULE_H_
#define SGTRAIN_COMPILER_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

namespace sg::compiler {

struct PipelineAction {
  enum class Kind { kForward, kBackward } kind;
  int micro = 0;
  bool operator==(const PipelineAction& o) const { return kind == o.kind && micro == o.micro; }
  std::string ToString() const;  // "F3", "B0"
};

// The action order of `stage` (0-based) of `stages`, for `micro` micro-batches. Preconditions:
// stages >= 1, 0 <= stage < stages, micro >= 1.
std::vector<PipelineAction> OneFOneBSchedule(int stages, int stage, int micro);

// (p-1)/(m+p-1): the idle share of each stage's time in a 1F1B step whose forward and backward
// times are the same on every stage (whatever their ratio), communication free.
double OneFOneBBubbleTheory(int stages, int micro);

struct Interval {
  double start = 0, end = 0;  // seconds, any common origin
};

// The mean over stages of idle / span, where span runs from the earliest start to the latest end
// over all stages and a stage's idle time is span minus its busy time. 0 for an empty timeline.
double BubbleFraction(const std::vector<std::vector<Interval>>& per_stage);

// Start/end of every action when each forward takes t_forward and each backward t_backward on
// every stage and transfers are instant: the schedule's dependency structure (F(i) on s after F(i)
// on s-1, B(i) on s after B(i) on s+1, actions of a stage in order). Indexed [stage][action].
std::vector<std::vector<Interval>> SimulateOneFOneB(int stages, int micro, double t_forward, double t_backward);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_SCHEDULE_H_
