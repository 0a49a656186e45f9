// Timeline of one step: an event per schedule step (kernels and collectives, per stream) written
// as Chrome / Perfetto trace JSON (open it in ui.perfetto.dev or chrome://tracing), and the
// summary figure: compute time, communication time, and exposed communication (communication
// that no compute overlaps) as a share of the step.
//
//   SG_ASSIGN_OR_RETURN(StepTrace t, step->TraceStep(batch));
//   WriteFile("step.json", ToChromeTraceJson(t));  std::cout << Summary(t) << "\n";
#ifndef SGTRAIN_COMPILER_TRACE_H_
#define SGTRAIN_COMPILER_TRACE_H_

#include <string>
#include <vector>

namespace sg::compiler {

struct TraceEvent {
  std::string name;
  std::string category;  // "kernel", "reference", "copy", "collective"
  int stream = 0;        // 0 compute, 1 communication, 2 host copies, 3 weight gradients
  double start_us = 0;   // from the step's start
  double duration_us = 0;
};

struct StepTrace {
  std::string device;  // "cpu" (host timestamps) or "cuda:0" (CUDA event timestamps)
  std::vector<TraceEvent> events;
  double step_us = 0;  // first start to last end
};

// Streams: 0 compute, 1 communication, 2 host copies (activation offloading), 3 weight gradients
// (LowerOptions::wgrad_stream; summed as compute). Exposed: the time of a stream's events that no
// compute event covers.
struct TraceSummary {
  double step_us = 0, compute_us = 0, comm_us = 0, exposed_comm_us = 0, copy_us = 0, exposed_copy_us = 0;
  double exposed_comm_share() const { return step_us > 0 ? exposed_comm_us / step_us : 0; }
};

TraceSummary Summarize(const StepTrace& t);

// {"traceEvents":[{"name":..,"cat":..,"ph":"X","ts":..,"dur":..,"pid":0,"tid":<stream>}, ...]}
std::string ToChromeTraceJson(const StepTrace& t);

// "step 12.3 ms | compute 11.0 ms | communication 3.1 ms | exposed communication 1.3 ms (10.6% of step)",
// then " | host copies 4.0 ms, exposed 0.2 ms" when the step copies activations to the host.
std::string SummaryLine(const StepTrace& t);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TRACE_H_
