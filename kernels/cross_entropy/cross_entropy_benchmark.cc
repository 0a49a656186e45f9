// Fused cross-entropy bandwidth: logits read once and dlogits written once (in place, as a training
// step uses it), plus the targets; the scalar outputs are not counted. Vocab 32000 x 16384 tokens
// (Llama-2 / the 1B target) and 128256 x 4096 (Llama-3, the chunked path).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/core/benchmark_timing.h"
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
  const int64_t bytes = logits.nbytes() * (grad ? 2 : 1) + rows * 4;
  // In place: later iterations see gradients as logits, which moves the same bytes.
  testing::TimeCalls(state, s.stream, calls, bytes, [&] {
    return grad ? CrossEntropyForwardBackward(logits, targets, loss, valid, logits, {}, s.stream)
                : CrossEntropyForward(logits, targets, loss, valid, {}, s.stream);
  });
  unsetenv("SG_CE_KERNEL");
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
