// Fused cross-entropy bandwidth: logits read once and dlogits written once (in place, as a training
// step uses it), plus the targets; the scalar outputs are not counted. Vocab 32000 x 16384 tokens
// (Llama-2 / the 1B target) and 128256 x 4096 (Llama-3, the chunked path).
#include <benchmark/benchmark.h>

#include "kernels/core/testing.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

void Run(benchmark::State& state, DType dtype, bool grad) {
  Setup s;
  const int64_t rows = state.range(0), vocab = state.range(1);
  Tensor logits = testing::RandomTensor({rows, vocab}, dtype, s.device, testing::Rng(), 4.0f);
  std::vector<double> tv;
  for (int64_t i = 0; i < rows; ++i) tv.push_back(double(testing::Rng()() % uint64_t(vocab)));
  Tensor targets = testing::FromHost(tv, {rows}, DType::kI32, s.device);
  Tensor loss = Tensor::Empty({}, DType::kF32, s.device).value();
  Tensor valid = Tensor::Empty({}, DType::kI32, s.device).value();
  Event start = Event::Create(s.device, true).value(), stop = Event::Create(s.device, true).value();
  for (auto _ : state) {
    (void)start.Record(s.stream);
    // In place: later iterations see gradients as logits, which moves the same bytes.
    absl::Status st = grad ? CrossEntropyForwardBackward(logits, targets, loss, valid, logits, {}, s.stream)
                           : CrossEntropyForward(logits, targets, loss, valid, {}, s.stream);
    (void)stop.Record(s.stream);
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
    if (s.device.is_cuda()) {
      (void)stop.Synchronize();
      state.SetIterationTime(stop.ElapsedMsSince(start).value() / 1e3);
    }
  }
  state.SetBytesProcessed(state.iterations() * (logits.nbytes() * (grad ? 2 : 1) + rows * 4));
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + s.device.ToString());
}

void BM_CrossEntropyForwardBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true); }
void BM_CrossEntropyForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_CrossEntropyForwardBackwardF32(benchmark::State& st) { Run(st, DType::kF32, true); }

#define SG_SHAPES ->Args({16384, 32000})->Args({4096, 128256})->Args({64, 1000})->UseManualTime()
BENCHMARK(BM_CrossEntropyForwardBackwardBF16) SG_SHAPES;
BENCHMARK(BM_CrossEntropyForwardBF16) SG_SHAPES;
BENCHMARK(BM_CrossEntropyForwardBackwardF32)->Args({4096, 32000})->Args({64, 1000})->UseManualTime();

}  // namespace
}  // namespace sg::kernels
