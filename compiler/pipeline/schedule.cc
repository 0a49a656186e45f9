#include "compiler/pipeline/schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace sg::compiler {

std::string PipelineAction::ToString() const {
  return (kind == Kind::kForward ? "F" : "B") + std::to_string(micro);
}

std::vector<PipelineAction> OneFOneBSchedule(int stages, int stage, int micro) {
  using K = PipelineAction::Kind;
  std::vector<PipelineAction> order;
  const int warmup = std::min(stages - 1 - stage, micro);
  int next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) order.push_back({K::kForward, next_f});
  while (next_f < micro) {
    order.push_back({K::kForward, next_f++});
    order.push_back({K::kBackward, next_b++});
  }
  while (next_b < micro) order.push_back({K::kBackward, next_b++});
  return order;
}

double OneFOneBBubbleTheory(int stages, int micro) {
  return double(stages - 1) / double(micro + stages - 1);
}

double BubbleFraction(const std::vector<std::vector<Interval>>& per_stage) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : per_stage) {
    for (const Interval& i : s) {
      lo = std::min(lo, i.start);
      hi = std::max(hi, i.end);
    }
  }
  if (!(hi > lo) || per_stage.empty()) return 0;
  double sum = 0;
  for (const auto& s : per_stage) {
    double busy = 0;
    for (const Interval& i : s) busy += i.end - i.start;
    sum += (hi - lo - busy) / (hi - lo);
  }
  return sum / double(per_stage.size());
}

std::vector<std::vector<Interval>> SimulateOneFOneB(int stages, int micro, double t_forward, double t_backward) {
  using K = PipelineAction::Kind;
  std::vector<std::vector<PipelineAction>> order(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) order[size_t(s)] = OneFOneBSchedule(stages, s, micro);
  std::vector<std::vector<Interval>> out(static_cast<size_t>(stages));
  std::map<std::pair<int, std::pair<int, int>>, double> done;  // (stage, (kind, micro)) -> end
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> free_at(static_cast<size_t>(stages), 0.0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[size_t(s)] < order[size_t(s)].size()) {
        const PipelineAction a = order[size_t(s)][next[size_t(s)]];
        const bool fwd = a.kind == K::kForward;
        const int dep_stage = fwd ? s - 1 : s + 1;
        double ready = free_at[size_t(s)];
        if (dep_stage >= 0 && dep_stage < stages) {
          auto it = done.find({dep_stage, {int(a.kind), a.micro}});
          if (it == done.end()) break;
          ready = std::max(ready, it->second);
        }
        const double end = ready + (fwd ? t_forward : t_backward);
        out[size_t(s)].push_back({ready, end});
        done[{s, {int(a.kind), a.micro}}] = end;
        free_at[size_t(s)] = end;
        ++next[size_t(s)];
        progressed = true;
      }
    }
  }
  return out;
}

}  // namespace sg::compiler
