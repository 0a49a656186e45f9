#include "kernels/core/benchmark_timing.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/core/allocator.h"
#include "kernels/core/cuda_graph.h"
#include "kernels/core/testing.h"

namespace sg::testing {
namespace {

// Runs `fn` repeatedly, synchronizing `stream` after each, for at least `seconds` of wall time, so
// the GPU's clocks have ramped up from idle and lazily loaded kernels are loaded.
absl::Status WarmUp(const Stream& stream, const std::function<absl::Status()>& fn, double seconds = 0.05) {
  const auto start = std::chrono::steady_clock::now();
  do {
    if (absl::Status st = fn(); !st.ok()) return st;
    if (absl::Status st = stream.Synchronize(); !st.ok()) return st;
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
  return absl::OkStatus();
}

// The timing loop of both: `batch` enqueues one timed iteration of `calls` calls.
void TimeBatches(benchmark::State& state, const Stream& stream, int calls, int64_t bytes_per_call,
                 const std::function<absl::Status()>& batch) {
  const Device device = stream.device();
  auto fail = [&](const absl::Status& st) { state.SkipWithError(std::string(st.message()).c_str()); };
  if (device.is_cuda()) {
    if (absl::Status st = WarmUp(stream, batch); !st.ok()) return fail(st);
  }
  // SG_BENCH_HOLD=1: the stream is held by a spinning kernel while the batch is enqueued, so the
  // events time the batch alone, without the host's launch gaps (on the H200 this moved the means
  // by under 1%: the batches are not launch-bound).
  std::unique_ptr<StreamHold> hold;
  const char* hold_env = std::getenv("SG_BENCH_HOLD");
  if (device.is_cuda() && hold_env != nullptr && std::strcmp(hold_env, "1") == 0) {
    absl::StatusOr<std::unique_ptr<StreamHold>> h = StreamHold::Create();
    if (!h.ok()) return fail(h.status());
    hold = std::move(*h);
    state.counters["held"] = 1;
  }
  absl::StatusOr<Event> start = Event::Create(device, true), stop = Event::Create(device, true);
  if (!start.ok() || !stop.ok()) return fail(start.ok() ? stop.status() : start.status());
  std::vector<double> per_call;  // seconds
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = hold ? hold->Hold(stream) : absl::OkStatus();
    if (st.ok()) st = start->Record(stream);
    if (st.ok()) st = batch();
    if (st.ok()) st = stop->Record(stream);
    if (hold) hold->Release();
    if (st.ok()) st = stop->Synchronize();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st.ok() && device.is_cuda()) {
      absl::StatusOr<float> ms = stop->ElapsedMsSince(*start);
      if (ms.ok()) seconds = *ms / 1e3;
      st = ms.status();
    }
    if (!st.ok()) return fail(st);
    per_call.push_back(seconds / calls);
    state.SetIterationTime(per_call.back());
  }
  // Decimal terabytes (1e12 bytes) per second, as HBM bandwidth and the PyTorch peers are quoted.
  // Not SetBytesProcessed: Google Benchmark prints that counter with binary prefixes (its "T/s" is
  // 2^40 bytes/s, 10% more than 1e12), which this project once misread as decimal TB/s.
  if (per_call.empty()) return;
  double total = 0;
  for (double t : per_call) total += t;
  state.counters["mean_TBps"] = double(bytes_per_call) * double(per_call.size()) / total / 1e12;
  state.counters["median_TBps"] = double(bytes_per_call) / Median(per_call) / 1e12;
}

// `calls` calls of fn.
std::function<absl::Status()> Batch(int calls, const std::function<absl::Status()>& fn) {
  return [calls, &fn]() -> absl::Status {
    for (int i = 0; i < calls; ++i) {
      if (absl::Status st = fn(); !st.ok()) return st;
    }
    return absl::OkStatus();
  };
}

}  // namespace

void TimeCalls(benchmark::State& state, const Stream& stream, int calls, int64_t bytes_per_call,
               const std::function<absl::Status()>& fn) {
  TimeBatches(state, stream, calls, bytes_per_call, Batch(calls, fn));
}

void TimeGraphReplays(benchmark::State& state, const Stream& stream, int calls, int64_t bytes_per_call,
                      const std::function<absl::Status()>& fn, bool node_priority) {
  auto fail = [&](const absl::Status& st) { state.SkipWithError(std::string(st.message()).c_str()); };
  if (!stream.device().is_cuda()) return fail(absl::FailedPreconditionError("graph replays need a CUDA stream"));
  const std::function<absl::Status()> batch = Batch(calls, fn);
  if (absl::Status st = WarmUp(stream, batch); !st.ok()) return fail(st);
  absl::StatusOr<Allocator*> alloc = AllocatorFor(stream.device());
  if (!alloc.ok()) return fail(alloc.status());
  // Blocks the batch frees inside the capture are used by every replay: held until the graph is gone.
  (*alloc)->BeginHoldingFrees();
  absl::StatusOr<CudaGraph> graph = CudaGraph::Capture(stream, batch, /*join=*/{}, node_priority);
  const std::vector<void*> held = (*alloc)->EndHoldingFrees();
  if (graph.ok()) {
    TimeBatches(state, stream, calls, bytes_per_call, [&] { return graph->Launch(stream); });
  } else {
    fail(graph.status());
  }
  if (absl::Status st = stream.Synchronize(); !st.ok()) fail(st);
  graph = CudaGraph();
  (*alloc)->ReleaseHeld(held);
}

}  // namespace sg::testing
