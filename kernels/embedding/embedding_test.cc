// Embedding against a double loop (gather; sum of gradient rows per id), finite differences of
// sum(out * g) for the backward, CUDA against the CPU reference (bitwise for the backward: both sum
// in f32 in token order), repeated ids, out-of-range ids. Fresh random inputs; outputs poisoned.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/embedding/embedding.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

struct Case {
  int64_t batch, seq, vocab, dim;
  DType dtype, ids;
};

// Ids drawn from a small range of the vocabulary so many repeat (the case that needs ordering).
Tensor RandomIds(const Case& c, Device d) {
  std::vector<double> v;
  const int64_t range = std::max<int64_t>(1, c.vocab / 3);
  for (int64_t i = 0; i < c.batch * c.seq; ++i) v.push_back(double(Rng()() % uint64_t(range)));
  return FromHost(v, {c.batch, c.seq}, c.ids, d);
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 1, 1, 1, DType::kF32, DType::kI32},        {2, 7, 11, 5, DType::kF32, DType::kI64},
      {3, 33, 100, 24, DType::kF32, DType::kI32},    {2, 9, 50, 8, DType::kBF16, DType::kI64},
      {4, 65, 301, 200, DType::kBF16, DType::kI32},  {4, 65, 301, 200, DType::kF16, DType::kI32},  {1, 300, 1000, 2048, DType::kBF16, DType::kI32},
  };
  return cases;
}

void Check(const Case& c, Device device) {
  SCOPED_TRACE(std::to_string(c.batch) + "x" + std::to_string(c.seq) + " vocab " + std::to_string(c.vocab) + " dim " +
               std::to_string(c.dim) + " " + std::string(DTypeName(c.dtype)) + " on " + device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  Tensor ids = RandomIds(c, device);
  Tensor table = RandomTensor({c.vocab, c.dim}, c.dtype, device, Rng());
  Tensor out = Tensor::Empty({c.batch, c.seq, c.dim}, c.dtype, device).value();
  Tensor dout = RandomTensor({c.batch, c.seq, c.dim}, c.dtype, device, Rng());
  Tensor dtable = Tensor::Empty({c.vocab, c.dim}, DType::kF32, device).value();
  Poison(out);
  Poison(dtable);
  ASSERT_TRUE(EmbeddingForward(ids, table, out, s).ok());
  ASSERT_TRUE(EmbeddingBackward(dout, ids, dtable, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const std::vector<double> hid = ToHost(ids), ht = ToHost(table), hd = ToHost(dout);
  std::vector<double> want_out, want_dt(static_cast<size_t>(c.vocab * c.dim), 0.0);
  for (size_t i = 0; i < hid.size(); ++i) {
    const int64_t id = int64_t(hid[i]);
    for (int64_t j = 0; j < c.dim; ++j) {
      want_out.push_back(ht[size_t(id * c.dim + j)]);
      want_dt[size_t(id * c.dim + j)] += hd[i * size_t(c.dim) + size_t(j)];
    }
  }
  EXPECT_EQ(ToHost(out), want_out);  // a gather is exact
  // f32 sums of up to ~tokens/vocab*3 terms: ~1e-6 relative.
  EXPECT_LT(RelativeError(ToHost(dtable), want_dt), 1e-5);
}

TEST(EmbeddingCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) Check(c, Device::Cpu());
}

TEST(EmbeddingCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 6, vocab = 4, dim = 3;
  const std::vector<double> ids = {1, 3, 1, 0, 1, 3};
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> table(vocab * dim), g(n * dim);
  for (double& e : table) e = u(Rng());
  for (double& e : g) e = u(Rng());
  auto loss = [&](const std::vector<double>& t) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < dim; ++j) l += t[size_t(int64_t(ids[size_t(i)]) * dim + j)] * g[size_t(i * dim + j)];
    return l;
  };
  Tensor tid = FromHost(ids, {n}, DType::kI32, Device::Cpu());
  Tensor tg = FromHost(g, {n, dim}, DType::kF32, Device::Cpu());
  Tensor dt = Tensor::Empty({vocab, dim}, DType::kF32, Device::Cpu()).value();
  Poison(dt);
  ASSERT_TRUE(EmbeddingBackward(tg, tid, dt, Stream::Cpu()).ok());
  const std::vector<double> hdt = ToHost(dt);
  for (int64_t i = 0; i < vocab * dim; ++i) {
    std::vector<double> p = table, m = table;
    p[size_t(i)] += 1e-6;
    m[size_t(i)] -= 1e-6;
    EXPECT_NEAR(hdt[size_t(i)], (loss(p) - loss(m)) / 2e-6, 1e-6) << i;  // id 2 unused: exactly 0
  }
}

TEST(EmbeddingCpuTest, BadArgumentsAreNamed) {
  Tensor ids = FromHost({0, 5, 9}, {3}, DType::kI64, Device::Cpu());
  Tensor table = Tensor::Empty({9, 4}, DType::kBF16, Device::Cpu()).value();
  Tensor out = Tensor::Empty({3, 4}, DType::kBF16, Device::Cpu()).value();
  absl::Status st = EmbeddingForward(ids, table, out, Stream::Cpu());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tokens[2] = 9 is outside the vocabulary [0, 9)"), std::string::npos) << st;
  Tensor bad_out = Tensor::Empty({3, 5}, DType::kBF16, Device::Cpu()).value();
  st = EmbeddingForward(FromHost({0, 1, 2}, {3}, DType::kI32, Device::Cpu()), table, bad_out, Stream::Cpu());
  EXPECT_NE(st.message().find("out: expected contiguous bf16[3,4]@cpu, found bf16[3,5]@cpu"), std::string::npos) << st;
  Tensor dt_bf16 = Tensor::Empty({9, 4}, DType::kBF16, Device::Cpu()).value();
  st = EmbeddingBackward(out, FromHost({0, 1, 2}, {3}, DType::kI32, Device::Cpu()), dt_bf16, Stream::Cpu());
  EXPECT_NE(st.message().find("table must be f32"), std::string::npos) << st;
}

// Both row-sum kernels of the backward (embedding.cu: SG_EMBEDDING_BWD selects one per call).
class EmbeddingCudaTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { ASSERT_EQ(setenv("SG_EMBEDDING_BWD", GetParam(), 1), 0); }
  void TearDown() override { unsetenv("SG_EMBEDDING_BWD"); }
};
INSTANTIATE_TEST_SUITE_P(RowSumKernels, EmbeddingCudaTest, ::testing::Values("rows", "packs"));

TEST_P(EmbeddingCudaTest, MatchesReferenceAndIsDeterministic) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) Check(c, Device::Cuda(0));
  // Runs longer than one row, vocabulary sizes that leave a partial group of rows, wide rows.
  Check({2, 300, 7, 2048, DType::kBF16, DType::kI32}, Device::Cuda(0));
  Check({1, 1000, 4099, 4096, DType::kF32, DType::kI64}, Device::Cuda(0));
  Check({3, 50, 33, 2056, DType::kBF16, DType::kI32}, Device::Cuda(0));
  // Llama-1B-like shape with heavy repetition; GPU must equal the CPU reference bit for bit (same
  // f32 additions in the same order), and repeat runs must agree.
  const Case c{2, 2048, 32000, 2048, DType::kBF16, DType::kI32};
  Stream s = Stream::Create(Device::Cuda(0)).value();
  Tensor ids_cpu = RandomIds(c, Device::Cpu());
  Tensor ids = FromHost(ToHost(ids_cpu), ids_cpu.shape(), DType::kI32, Device::Cuda(0));
  Tensor dout_cpu = RandomTensor({c.batch, c.seq, c.dim}, c.dtype, Device::Cpu(), Rng());
  Tensor dout = FromHost(ToHost(dout_cpu), dout_cpu.shape(), c.dtype, Device::Cuda(0));
  Tensor d1 = Tensor::Empty({c.vocab, c.dim}, DType::kF32, Device::Cuda(0)).value();
  Tensor d2 = Tensor::Empty({c.vocab, c.dim}, DType::kF32, Device::Cuda(0)).value();
  Tensor dref = Tensor::Empty({c.vocab, c.dim}, DType::kF32, Device::Cpu()).value();
  Poison(d1);
  Poison(d2);
  ASSERT_TRUE(EmbeddingBackward(dout, ids, d1, s).ok());
  ASSERT_TRUE(EmbeddingBackward(dout, ids, d2, s).ok());
  ASSERT_TRUE(EmbeddingBackward(dout_cpu, ids_cpu, dref, Stream::Cpu()).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const std::vector<double> h1 = ToHost(d1);
  EXPECT_EQ(h1, ToHost(d2));
  EXPECT_EQ(h1, ToHost(dref));
}

// CUDA does not check ids (no host sync): out-of-range rows come out zero and their gradients drop.
TEST_P(EmbeddingCudaTest, OutOfRangeIdsAreMemorySafe) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  Tensor ids = FromHost({2, -1, 7, 1000000}, {4}, DType::kI64, d);
  Tensor table = RandomTensor({8, 16}, DType::kF32, d, Rng());
  Tensor out = Tensor::Empty({4, 16}, DType::kF32, d).value();
  Tensor dout = RandomTensor({4, 16}, DType::kF32, d, Rng());
  Tensor dt = Tensor::Empty({8, 16}, DType::kF32, d).value();
  Poison(out);
  Poison(dt);
  ASSERT_TRUE(EmbeddingForward(ids, table, out, s).ok());
  ASSERT_TRUE(EmbeddingBackward(dout, ids, dt, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const std::vector<double> ho = ToHost(out), ht = ToHost(table), hd = ToHost(dout), hdt = ToHost(dt);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(ho[size_t(j)], ht[size_t(2 * 16 + j)]);
    EXPECT_EQ(ho[size_t(16 + j)], 0.0);
    EXPECT_EQ(ho[size_t(48 + j)], 0.0);
    EXPECT_EQ(hdt[size_t(2 * 16 + j)], hd[size_t(j)]);
    EXPECT_EQ(hdt[size_t(7 * 16 + j)], hd[size_t(32 + j)]);
    EXPECT_EQ(hdt[size_t(0 * 16 + j)], 0.0);
  }
}

}  // namespace
}  // namespace sg::kernels
