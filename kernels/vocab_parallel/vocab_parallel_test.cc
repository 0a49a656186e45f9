// The vocabulary-parallel kernels against the full-vocabulary kernels (kernels/cross_entropy,
// kernels/embedding, themselves tested against double loops): the logits, the table and the LM
// head split into T shards (even and uneven: 37 over 3 is 13, 13, 11), each shard's kernels run,
// the "collectives" done by hand (stats concatenated in rank order, embedding outputs summed),
// and the loss, dlogits (shards concatenated) and the embedding's output and table gradient
// compared with the full kernels'. Ignored targets, a dloss other than 1, dlogits in place, bf16.
// CUDA against the CPU where a GPU exists. Outputs poisoned before each run.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/embedding/embedding.h"
#include "kernels/vocab_parallel/vocab_parallel.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

struct Case {
  int64_t rows, vocab, ranks;
  DType dtype;
};

// torch.chunk's piece r of n over T: [begin, end).
std::pair<int64_t, int64_t> Piece(int64_t n, int64_t T, int64_t r) {
  const int64_t c = (n + T - 1) / T;
  return {std::min(n, r * c), std::min(n, (r + 1) * c)};
}

// Columns [b, e) of a row-major [rows, cols] host matrix.
std::vector<double> Columns(const std::vector<double>& m, int64_t rows, int64_t cols, int64_t b, int64_t e) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), m.begin() + r * cols + b, m.begin() + r * cols + e);
  return out;
}

Tensor Targets(int64_t rows, int64_t vocab, Device d) {
  std::vector<double> t;
  for (int64_t i = 0; i < rows; ++i) t.push_back(i % 5 == 3 ? -100.0 : double(Rng()() % uint64_t(vocab)));
  return FromHost(t, {rows}, DType::kI32, d);
}

void CheckCrossEntropy(const Case& c, Device device, bool in_place) {
  SCOPED_TRACE(std::to_string(c.rows) + " rows, vocab " + std::to_string(c.vocab) + " over " +
               std::to_string(c.ranks) + (in_place ? ", in place" : ""));
  const Stream s = device.is_cpu() ? Stream::Cpu() : *Stream::Create(device);
  Tensor logits = RandomTensor({c.rows, c.vocab}, c.dtype, device, Rng(), 4.f);
  Tensor targets = Targets(c.rows, c.vocab, device);
  const std::vector<double> full = ToHost(logits.view());
  const float seed = 0.37f;
  // The reference: the full-vocabulary kernel.
  Tensor loss_ref = *Tensor::Empty({}, DType::kF32, device), valid = *Tensor::Empty({}, DType::kI32, device);
  Tensor dlogits_ref = *Tensor::Empty({c.rows, c.vocab}, c.dtype, device);
  CrossEntropyOptions ro;
  ro.grad_scale = seed;
  ASSERT_TRUE(CrossEntropyForwardBackward(logits.view(), targets.view(), loss_ref.view(), valid.view(),
                                          dlogits_ref.view(), ro, s).ok());
  VocabParallelCrossEntropyOptions o;
  o.vocab = c.vocab;
  std::vector<Tensor> shards, stats;
  std::vector<double> gathered;
  for (int64_t r = 0; r < c.ranks; ++r) {
    const auto [b, e] = Piece(c.vocab, c.ranks, r);
    shards.push_back(FromHost(Columns(full, c.rows, c.vocab, b, e), {c.rows, e - b}, c.dtype, device));
    stats.push_back(*Tensor::Empty({3, c.rows}, DType::kF32, device));
    Poison(stats.back().view());
    ASSERT_TRUE(VocabParallelCrossEntropyStats(shards.back().view(), targets.view(), b, o, stats.back().view(), s).ok());
    ASSERT_TRUE(s.Synchronize().ok());  // s does not order against the host copies below
    const std::vector<double> st = ToHost(stats.back().view());
    gathered.insert(gathered.end(), st.begin(), st.end());
  }
  Tensor g = FromHost(gathered, {c.ranks, 3, c.rows}, DType::kF32, device);
  Tensor dloss = FromHost({seed}, {}, DType::kF32, device);
  std::vector<double> dlogits(size_t(c.rows * c.vocab), NAN);
  for (int64_t r = 0; r < c.ranks; ++r) {
    const auto [b, e] = Piece(c.vocab, c.ranks, r);
    Tensor loss = *Tensor::Empty({}, DType::kF32, device);
    Poison(loss.view());
    Tensor out = *Tensor::Empty({c.rows, e - b}, c.dtype, device);
    Poison(out.view());
    const TensorView grad = in_place ? shards[size_t(r)].view() : out.view();
    ASSERT_TRUE(VocabParallelCrossEntropyFinish(shards[size_t(r)].view(), targets.view(), b, g.view(), dloss.view(), o,
                                                loss.view(), grad, s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_NEAR(ToHost(loss.view())[0], ToHost(loss_ref.view())[0], 1e-5 * std::abs(ToHost(loss_ref.view())[0]) + 1e-6)
        << "rank " << r;
    const std::vector<double> local = ToHost(grad);
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t j = b; j < e; ++j) dlogits[size_t(i * c.vocab + j)] = local[size_t(i * (e - b) + j - b)];
    }
  }
  const double tol = c.dtype == DType::kBF16 ? 1e-2 : 1e-5;
  EXPECT_LT(RelativeError(dlogits, ToHost(dlogits_ref.view())), tol);
}

TEST(VocabParallelCrossEntropyTest, ShardsEqualTheFullVocabulary) {
  for (const Case& c : {Case{7, 32, 2, DType::kF32}, Case{9, 37, 3, DType::kF32}, Case{5, 50, 4, DType::kBF16},
                        Case{3, 8, 1, DType::kF32}}) {
    CheckCrossEntropy(c, Device::Cpu(), /*in_place=*/false);
    CheckCrossEntropy(c, Device::Cpu(), /*in_place=*/true);
  }
}

TEST(VocabParallelCrossEntropyTest, CudaShardsEqualTheFullVocabulary) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Case& c : {Case{7, 32, 2, DType::kF32}, Case{9, 37, 3, DType::kF32}, Case{64, 1000, 4, DType::kBF16}}) {
    CheckCrossEntropy(c, Device::Cuda(0), /*in_place=*/false);
    CheckCrossEntropy(c, Device::Cuda(0), /*in_place=*/true);
  }
}

TEST(VocabParallelCrossEntropyTest, OutOfRangeTargetIsAClearError) {
  Tensor logits = RandomTensor({2, 4}, DType::kF32, Device::Cpu(), Rng());
  Tensor targets = FromHost({1, 9}, {2}, DType::kI32, Device::Cpu());
  Tensor stats = *Tensor::Empty({3, 2}, DType::kF32, Device::Cpu());
  VocabParallelCrossEntropyOptions o;
  o.vocab = 8;
  const absl::Status st = VocabParallelCrossEntropyStats(logits.view(), targets.view(), 4, o, stats.view(), Stream::Cpu());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("targets[1] = 9"), std::string::npos) << st;
}

void CheckEmbedding(int64_t vocab, int64_t ranks, DType dtype, Device device) {
  SCOPED_TRACE("vocab " + std::to_string(vocab) + " over " + std::to_string(ranks));
  const Stream s = device.is_cpu() ? Stream::Cpu() : *Stream::Create(device);
  const int64_t dim = 6, n = 23;
  Tensor table = RandomTensor({vocab, dim}, dtype, device, Rng());
  std::vector<double> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(double(Rng()() % uint64_t(vocab)));
  Tensor tokens = FromHost(ids, {1, n}, DType::kI64, device);
  Tensor dout = RandomTensor({1, n, dim}, dtype, device, Rng());
  Tensor out_ref = *Tensor::Empty({1, n, dim}, dtype, device), dtable_ref = *Tensor::Empty({vocab, dim}, DType::kF32, device);
  ASSERT_TRUE(EmbeddingForward(tokens.view(), table.view(), out_ref.view(), s).ok());
  ASSERT_TRUE(EmbeddingBackward(dout.view(), tokens.view(), dtable_ref.view(), s).ok());
  ASSERT_TRUE(s.Synchronize().ok());  // s does not order against the host copies below
  const std::vector<double> full = ToHost(table.view());
  std::vector<double> sum(size_t(n * dim), 0.0), dtable;
  for (int64_t r = 0; r < ranks; ++r) {
    const auto [b, e] = Piece(vocab, ranks, r);
    Tensor shard = FromHost(std::vector<double>(full.begin() + b * dim, full.begin() + e * dim), {e - b, dim}, dtype, device);
    Tensor out = *Tensor::Empty({1, n, dim}, dtype, device), dshard = *Tensor::Empty({e - b, dim}, DType::kF32, device);
    Poison(out.view());
    Poison(dshard.view());
    ASSERT_TRUE(VocabParallelEmbeddingForward(tokens.view(), shard.view(), b, out.view(), s).ok());
    ASSERT_TRUE(VocabParallelEmbeddingBackward(dout.view(), tokens.view(), b, dshard.view(), s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    const std::vector<double> o = ToHost(out.view()), d = ToHost(dshard.view());
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += o[k];
    dtable.insert(dtable.end(), d.begin(), d.end());
  }
  // One rank holds each row, the others add exact zeros: bitwise equal.
  EXPECT_EQ(sum, ToHost(out_ref.view()));
  EXPECT_EQ(dtable, ToHost(dtable_ref.view()));
}

TEST(VocabParallelEmbeddingTest, ShardsSumToTheFullLookup) {
  CheckEmbedding(32, 2, DType::kF32, Device::Cpu());
  CheckEmbedding(37, 3, DType::kF32, Device::Cpu());
  CheckEmbedding(50, 4, DType::kBF16, Device::Cpu());
}

TEST(VocabParallelEmbeddingTest, CudaShardsSumToTheFullLookup) {
  SG_SKIP_WITHOUT_CUDA();
  CheckEmbedding(37, 3, DType::kF32, Device::Cuda(0));
  CheckEmbedding(1000, 4, DType::kBF16, Device::Cuda(0));
}

}  // namespace
}  // namespace sg::kernels
