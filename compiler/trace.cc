#include "compiler/trace.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace sg::compiler {

namespace {

// The parts of the intervals of `stream`'s events that no compute interval (sorted) covers.
double Exposed(const StepTrace& t, int stream, const std::vector<std::pair<double, double>>& compute) {
  double exposed = 0;
  for (const TraceEvent& e : t.events) {
    if (e.stream != stream) continue;
    double lo = e.start_us;
    const double hi = e.start_us + e.duration_us;
    for (const auto& [a, b] : compute) {
      if (b <= lo) continue;
      if (a >= hi) break;
      if (a > lo) exposed += a - lo;
      lo = std::max(lo, b);
      if (lo >= hi) break;
    }
    if (lo < hi) exposed += hi - lo;
  }
  return exposed;
}

constexpr const char* kStreamNames[] = {"compute", "communication", "host copies", "weight gradients"};

}  // namespace

TraceSummary Summarize(const StepTrace& t) {
  TraceSummary s;
  s.step_us = t.step_us;
  std::vector<std::pair<double, double>> compute;
  for (const TraceEvent& e : t.events) {
    if (e.stream == 0 || e.stream == 3) {  // 3: weight-gradient matmuls (LowerOptions::wgrad_stream)
      s.compute_us += e.duration_us;
      compute.push_back({e.start_us, e.start_us + e.duration_us});
    } else if (e.stream == 2) {
      s.copy_us += e.duration_us;
    } else {
      s.comm_us += e.duration_us;
    }
  }
  std::sort(compute.begin(), compute.end());
  s.exposed_comm_us = Exposed(t, 1, compute);
  s.exposed_copy_us = Exposed(t, 2, compute);
  return s;
}

std::string ToChromeTraceJson(const StepTrace& t) {
  nlohmann::json events = nlohmann::json::array();
  // Compute and communication always; the copy and weight-gradient streams when the step has work
  // there.
  for (int stream = 0; stream < 4; ++stream) {
    const bool used = std::any_of(t.events.begin(), t.events.end(), [&](const TraceEvent& e) { return e.stream == stream; });
    if (stream >= 2 && !used) continue;
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", stream},
                      {"args", {{"name", kStreamNames[stream]}}}});
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
  std::string line = absl::StrFormat(
      "step %.3f ms | compute %.3f ms | communication %.3f ms | exposed communication %.3f ms (%.1f%% of step)",
      s.step_us / 1e3, s.compute_us / 1e3, s.comm_us / 1e3, s.exposed_comm_us / 1e3,
      100.0 * s.exposed_comm_share());
  if (s.copy_us > 0) {
    absl::StrAppendFormat(&line, " | host copies %.3f ms, exposed %.3f ms", s.copy_us / 1e3, s.exposed_copy_us / 1e3);
  }
  return line;
}

}  // namespace sg::compiler
