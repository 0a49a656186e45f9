#include "compiler/executor.h"

#include "kernels/core/allocator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::compiler {

// A stream priority above the default 0 (CUDA: lower numbers are higher; every device since
// compute capability 7 offers down to -5, and cudaStreamCreateWithPriority clamps to the range).
constexpr int kHighStreamPriority = -1;
// The replays keep each kernel's priority: its stream's at capture (compute or weight-gradient
// under SG_WGRAD_PRIORITY, below) or its own launch attribute's (the embedding backward's chain at
// the device's greatest priority beside its zero fill at the least: 88.4-88.8 us a call replayed
// so at 16384 of 32000 x 2048 on an H200, against 90.0-90.2 with every node at the launch
// stream's priority; benchmarks/gpu_calls/gpu_call89-90.sh).
constexpr bool kNodePriority = true;

bool CudaGraphsDisabledByEnv() {
  const char* v = std::getenv("SG_CUDA_GRAPH");
  return v != nullptr && std::string(v) == "0";
}

bool Executor::will_capture() const {
  return program_->device.is_cuda() && options_.cuda_graph && !CudaGraphsDisabledByEnv() && program_->capturable;
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const Program* program, const ExecutorOptions& options) {
  const Device d = program->device;
  // With weight-gradient steps (stream 3) SG_WGRAD_PRIORITY=compute (or =wgrad) in the environment
  // gives the compute stream (or the weight-gradient stream) a higher priority, so its pending
  // blocks take the SMs first; unset, all streams share the default priority.
  int compute_priority = 0, wgrad_priority = 0;
  const bool splits = std::any_of(program->schedule.steps.begin(), program->schedule.steps.end(),
                                  [](const Step& s) { return s.stream == 3; });
  if (const char* v = std::getenv("SG_WGRAD_PRIORITY"); v != nullptr && splits && d.is_cuda()) {
    if (std::string(v) == "compute") compute_priority = kHighStreamPriority;
    if (std::string(v) == "wgrad") wgrad_priority = kHighStreamPriority;
  }
  SG_ASSIGN_OR_RETURN(Stream compute, Stream::Create(d, compute_priority));
  SG_ASSIGN_OR_RETURN(Stream comm, Stream::Create(d));
  SG_ASSIGN_OR_RETURN(Stream copy, Stream::Create(d));
  SG_ASSIGN_OR_RETURN(Stream wgrad, Stream::Create(d, wgrad_priority));
  auto ex = std::unique_ptr<Executor>(
      new Executor(program, options, std::move(compute), std::move(comm), std::move(copy), std::move(wgrad)));
  return ex;
}

absl::Status Executor::RunEager() {
  for (const Step& s : program_->schedule.steps) {
    absl::Status st = s.launch(StreamOf(s));
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("step '", s.name, "': ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status Executor::AfterWarmup() {
  if (after_warmup_done_ || !options_.after_warmup) return absl::OkStatus();
  after_warmup_done_ = true;
  return options_.after_warmup();
}

Executor::~Executor() {
  // Queued steps may still read and write the program's memory (and the held scratch): let them
  // finish before anything is freed and handed out again.
  (void)compute_.Synchronize();
  (void)comm_.Synchronize();
  (void)copy_.Synchronize();
  (void)wgrad_.Synchronize();
  graph_ = CudaGraph();
  if (held_blocks_.empty()) return;
  if (absl::StatusOr<Allocator*> alloc = AllocatorFor(program_->device); alloc.ok()) {
    (*alloc)->ReleaseHeld(held_blocks_);
  }
  held_blocks_.clear();
}

absl::Status Executor::Run() {
  if (!will_capture()) {
    SG_RETURN_IF_ERROR(RunEager());
    SG_RETURN_IF_ERROR(AfterWarmup());
  } else if (graph_.valid()) {
    SG_RETURN_IF_ERROR(graph_.Launch(compute_));
  } else if (runs_ < options_.warmup_steps) {
    SG_RETURN_IF_ERROR(RunEager());
    SG_RETURN_IF_ERROR(AfterWarmup());
  } else {
    // Capture records the work without running it; launch the capture for this step's result.
    // Scratch freed inside the capture stays reserved for the graph's lifetime.
    if (options_.before_capture) {
      SG_RETURN_IF_ERROR(options_.before_capture());
    } else {
      SG_RETURN_IF_ERROR(compute_.Synchronize());
      SG_RETURN_IF_ERROR(comm_.Synchronize());
      SG_RETURN_IF_ERROR(copy_.Synchronize());
      SG_RETURN_IF_ERROR(wgrad_.Synchronize());
    }
    SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(program_->device));
    alloc->BeginHoldingFrees();
    absl::StatusOr<CudaGraph> captured =
        CudaGraph::Capture(compute_, [this] { return RunEager(); }, {&comm_, &copy_, &wgrad_}, kNodePriority);
    held_blocks_ = alloc->EndHoldingFrees();
    SG_RETURN_IF_ERROR(captured.status());
    graph_ = std::move(captured).value();
    SG_RETURN_IF_ERROR(graph_.Launch(compute_));
  }
  ++runs_;
  return absl::OkStatus();
}

absl::StatusOr<StepTrace> Executor::RunTraced() {
  StepTrace t;
  t.device = program_->device.ToString();
  const auto& steps = program_->schedule.steps;
  auto category = [](const Step& s) {
    return s.kind == Step::Kind::kCollective ? std::string("collective") : s.impl;
  };
  if (program_->device.is_cpu()) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    for (const Step& s : steps) {
      const auto a = Clock::now();
      SG_RETURN_IF_ERROR(s.launch(StreamOf(s)));
      const auto b = Clock::now();
      t.events.push_back({s.name, category(s), s.stream,
                          std::chrono::duration<double, std::micro>(a - t0).count(),
                          std::chrono::duration<double, std::micro>(b - a).count()});
    }
    t.step_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  } else {
    std::vector<Event> marks;
    SG_ASSIGN_OR_RETURN(Event origin, Event::Create(program_->device, /*timing=*/true));
    SG_RETURN_IF_ERROR(origin.Record(compute_));
    for (const Step& s : steps) {
      const Stream& stream = StreamOf(s);
      SG_ASSIGN_OR_RETURN(Event a, Event::Create(program_->device, true));
      SG_ASSIGN_OR_RETURN(Event b, Event::Create(program_->device, true));
      SG_RETURN_IF_ERROR(a.Record(stream));
      SG_RETURN_IF_ERROR(s.launch(stream));
      SG_RETURN_IF_ERROR(b.Record(stream));
      marks.push_back(std::move(a));
      marks.push_back(std::move(b));
    }
    SG_RETURN_IF_ERROR(compute_.Synchronize());
    SG_RETURN_IF_ERROR(comm_.Synchronize());
    SG_RETURN_IF_ERROR(copy_.Synchronize());
    SG_RETURN_IF_ERROR(wgrad_.Synchronize());
    for (size_t i = 0; i < steps.size(); ++i) {
      SG_ASSIGN_OR_RETURN(float start_ms, marks[2 * i].ElapsedMsSince(origin));
      SG_ASSIGN_OR_RETURN(float dur_ms, marks[2 * i + 1].ElapsedMsSince(marks[2 * i]));
      t.events.push_back({steps[i].name, category(steps[i]), steps[i].stream, start_ms * 1e3, dur_ms * 1e3});
      t.step_us = std::max(t.step_us, (start_ms + dur_ms) * 1e3);
    }
  }
  ++runs_;
  return t;
}

}  // namespace sg::compiler
