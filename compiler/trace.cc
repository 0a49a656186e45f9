#include "compiler/trace.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace sg::compiler {

TraceSummary Summarize(const StepTrace& t) {
  TraceSummary s;
  s.step_us = t.step_us;
  std::vector<std::pair<double, double>> compute;
  for (const TraceEvent& e : t.events) {
    if (e.stream == 0) {
      s.compute_us += e.duration_us;
      compute.push_back({e.start_us, e.start_us + e.duration_us});
    } else {
      s.comm_us += e.duration_us;
    }
  }
  std::sort(compute.begin(), compute.end());
  // Exposed: the parts of each communication interval that no compute interval covers.
  for (const TraceEvent& e : t.events) {
    if (e.stream == 0) continue;
    double lo = e.start_us;
    const double hi = e.start_us + e.duration_us;
    double exposed = 0;
    for (const auto& [a, b] : compute) {
      if (b <= lo) continue;
      if (a >= hi) break;
      if (a > lo) exposed += a - lo;
      lo = std::max(lo, b);
      if (lo >= hi) break;
    }
    if (lo < hi) exposed += hi - lo;
    s.exposed_comm_us += exposed;
  }
  return s;
}

std::string ToChromeTraceJson(const StepTrace& t) {
  nlohmann::json events = nlohmann::json::array();
  for (int stream = 0; stream < 2; ++stream) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", stream},
                      {"args", {{"name", stream == 0 ? "compute" : "communication"}}}});
  }
  for (const TraceEvent& e : t.events) {
    events.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", e.start_us},
                      {"dur", e.duration_us}, {"pid", 0}, {"tid", e.stream}});
  }
  nlohmann::json root = {{"traceEvents", events}, {"displayTimeUnit", "ms"},
                         {"otherData", {{"device", t.device}}}};
  return root.dump();
}

std::string SummaryLine(const StepTrace& t) {
  const TraceSummary s = Summarize(t);
  return absl::StrFormat(
      "step %.3f ms | compute %.3f ms | communication %.3f ms | exposed communication %.3f ms (%.1f%% of step)",
      s.step_us / 1e3, s.compute_us / 1e3, s.comm_us / 1e3, s.exposed_comm_us / 1e3,
      100.0 * s.exposed_comm_share());
}

}  // namespace sg::compiler
