// Fused cross-entropy bandwidth: logits read once and dlogits written once (in place, as a training
// step uses it), plus the targets; the scalar outputs are not counted. Vocab 32000 x 16384 tokens
// (Llama-2 / the 1B target) and 128256 x 4096 (Llama-3, the chunked path).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/core/testing.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// kernel: SG_CE_KERNEL for this benchmark ("" = the default); calls: calls per timed iteration
// (1: events around one call, host launch latency included; kBatch: back-to-back calls, as in a
// CUDA-graph step).
constexpr int kBatch = 5;
void Run(benchmark::State& state, DType dtype, bool grad, const char* kernel = "", int calls = 1) {
  Setup s;
  if (*kernel != 0) {
    setenv("SG_CE_KERNEL", kernel, 1);
  } else {
    unsetenv("SG_CE_KERNEL");
  }
  const int64_t rows = state.range(0), vocab = state.range(1);
  Tensor logits = testing::RandomTensor({rows, vocab}, dtype, s.device, testing::Rng(), 4.0f);
  std::vector<double> tv;
  for (int64_t i = 0; i < rows; ++i) tv.push_back(double(testing::Rng()() % uint64_t(vocab)));
  Tensor targets = testing::FromHost(tv, {rows}, DType::kI32, s.device);
  Tensor loss = Tensor::Empty({}, DType::kF32, s.device).value();
  Tensor valid = Tensor::Empty({}, DType::kI32, s.device).value();
  Event start = Event::Create(s.device, true).value(), stop = Event::Create(s.device, true).value();
  std::vector<double> iteration_s;  // per call, for the median
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)start.Record(s.stream);
    absl::Status st;
    for (int i = 0; i < calls && st.ok(); ++i) {
      // In place: later iterations see gradients as logits, which moves the same bytes.
      st = grad ? CrossEntropyForwardBackward(logits, targets, loss, valid, logits, {}, s.stream)
                : CrossEntropyForward(logits, targets, loss, valid, {}, s.stream);
    }
    (void)stop.Record(s.stream);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
    if (s.device.is_cuda()) {
      (void)stop.Synchronize();
      const double t = stop.ElapsedMsSince(start).value() / 1e3 / calls;
      state.SetIterationTime(t);
      iteration_s.push_back(t);
    } else {
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
  }
  unsetenv("SG_CE_KERNEL");
  const int64_t bytes = logits.nbytes() * (grad ? 2 : 1) + rows * 4;
  state.SetBytesProcessed(state.iterations() * bytes);
  if (!iteration_s.empty()) state.counters["median_TBps"] = double(bytes) / testing::Median(iteration_s) / 1e12;
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + s.device.ToString() +
                 (*kernel ? std::string(" ") + kernel : std::string(" default")) +
                 (calls > 1 ? " batch" : " per-call"));
}

void BM_CrossEntropyForwardBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true); }
void BM_CrossEntropyForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_CrossEntropyForwardBackwardF32(benchmark::State& st) { Run(st, DType::kF32, true); }
// The row kernels side by side (cross_entropy.cu says what each measured), batch timing: the
// default (the register kernel at vocab 32000) and SG_CE_KERNEL=chunked.
void BM_CrossEntropyFwdBwdBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, true, "", kBatch); }
void BM_CrossEntropyFwdBwdBF16ChunkedBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "chunked", kBatch); }

#define SG_SHAPES ->Args({16384, 32000})->Args({4096, 128256})->Args({64, 1000})->UseManualTime()
BENCHMARK(BM_CrossEntropyForwardBackwardBF16) SG_SHAPES;
BENCHMARK(BM_CrossEntropyForwardBF16) SG_SHAPES;
BENCHMARK(BM_CrossEntropyForwardBackwardF32)->Args({4096, 32000})->Args({64, 1000})->UseManualTime();
BENCHMARK(BM_CrossEntropyFwdBwdBF16Batch)->Args({16384, 32000})->UseManualTime();
BENCHMARK(BM_CrossEntropyFwdBwdBF16ChunkedBatch)->Args({16384, 32000})->UseManualTime();

}  // namespace
}  // namespace sg::kernels
