// The default CUDA embedding backward ("atomic2s") when its very first call on a device is made
// while the stream is being captured into a CUDA graph: it may not create its side stream and
// events inside the capture, so it takes the one-stream preparation. A binary of its own, because
// the side stream lives as long as the process: in embedding_test it exists before any capture.
// The reference is the CPU backward (double-checked against the eager one-stream CUDA path too);
// the graph is replayed twice over poisoned gradients.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/allocator.h"
#include "kernels/core/testing.h"
#include "kernels/embedding/embedding.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::kernels {
namespace {

#ifdef SG_WITH_CUDA
// The number of elements that differ from `want` in value or sign (so a failure prints one line).
int64_t Differences(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]) ? 0 : 1;
  return bad;
}

TEST(EmbeddingCaptureFirstTest, FirstCallUnderCaptureMatchesTheCpu) {
  SG_SKIP_WITHOUT_CUDA();
  unsetenv("SG_EMBEDDING_BWD");  // the default path
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  const int64_t tokens = 777, vocab = 1000, dim = 136;
  std::vector<double> idv;
  for (int64_t i = 0; i < tokens; ++i) idv.push_back(double(testing::Rng()() % uint64_t(vocab / 4)));
  Tensor ids_cpu = testing::FromHost(idv, {tokens}, DType::kI32, Device::Cpu());
  Tensor ids = testing::FromHost(idv, {tokens}, DType::kI32, d);
  Tensor dout = testing::RandomTensor({tokens, dim}, DType::kBF16, d, testing::Rng());
  Tensor dout_cpu = testing::FromHost(testing::ToHost(dout), {tokens, dim}, DType::kBF16, Device::Cpu());
  Tensor want = Tensor::Empty({vocab, dim}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(EmbeddingBackward(dout_cpu, ids_cpu, want, Stream::Cpu()).ok());
  const std::vector<double> want_dt = testing::ToHost(want);

  Tensor dtable = Tensor::Empty({vocab, dim}, DType::kF32, d).value();
  // Warm the allocator with the one-stream path's scratch (same size), eagerly; no side stream yet.
  setenv("SG_EMBEDDING_BWD", "atomic", 1);
  ASSERT_TRUE(EmbeddingBackward(dout, ids, dtable, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(Differences(testing::ToHost(dtable), want_dt), 0);
  unsetenv("SG_EMBEDDING_BWD");

  Allocator* alloc = AllocatorFor(d).value();
  cudaStream_t cs = static_cast<cudaStream_t>(s.native());
  alloc->BeginHoldingFrees();
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status b = EmbeddingBackward(dout, ids, dtable, s);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(cs, &graph);
  const std::vector<void*> held = alloc->EndHoldingFrees();
  ASSERT_TRUE(b.ok()) << b;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    testing::Poison(dtable);
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_EQ(Differences(testing::ToHost(dtable), want_dt), 0) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  alloc->ReleaseHeld(held);

  // Now, eagerly, the side stream is created and used: still the same bits.
  testing::Poison(dtable);
  ASSERT_TRUE(EmbeddingBackward(dout, ids, dtable, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(Differences(testing::ToHost(dtable), want_dt), 0);
}
#endif  // SG_WITH_CUDA

}  // namespace
}  // namespace sg::kernels
