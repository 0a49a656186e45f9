// Embedding against a double loop (gather; sum of gradient rows per id), finite differences of
// sum(out * g) for the backward, CUDA against the CPU reference (bitwise for the backward: both sum
// in f32 in token order), repeated ids, out-of-range ids. Fresh random inputs; outputs poisoned.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
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

TEST(EmbeddingCpuTest, NoTokensGiveZeroGradients) {
  Tensor ids = Tensor::Empty({0}, DType::kI64, Device::Cpu()).value();
  Tensor dout = Tensor::Empty({0, 3}, DType::kF32, Device::Cpu()).value();
  Tensor dt = Tensor::Empty({4, 3}, DType::kF32, Device::Cpu()).value();
  Poison(dt);
  ASSERT_TRUE(EmbeddingBackward(dout, ids, dt, Stream::Cpu()).ok());
  EXPECT_EQ(ToHost(dt), std::vector<double>(12, 0.0));
}

// Sets (or, for "", unsets) an environment variable for a scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (*value != 0) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// The CUDA backward kernels selected per call by SG_EMBEDDING_BWD (embedding.cu), "" = the default.
const char* const kBackwards[] = {"", "rows", "atomic", "atomic_nopdl", "atomic2s"};
// Those compared bitwise against "rows" (and so against the CPU reference) on constructed ids.
const char* const kComparedBackwards[] = {"atomic", "atomic_nopdl", "atomic2s"};

class EmbeddingCudaTest : public ::testing::TestWithParam<const char*> {
 protected:
  ScopedEnv bwd_{"SG_EMBEDDING_BWD", GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Backward, EmbeddingCudaTest, ::testing::ValuesIn(kBackwards),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(*info.param ? info.param : "default");
                         });

TEST_P(EmbeddingCudaTest, MatchesReferenceAndIsDeterministic) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) Check(c, Device::Cuda(0));
  // Runs longer than one row, vocabulary sizes that leave a partial group of rows, wide rows.
  Check({2, 300, 7, 2048, DType::kBF16, DType::kI32}, Device::Cuda(0));
  Check({1, 1000, 4099, 4096, DType::kF32, DType::kI64}, Device::Cuda(0));
  Check({3, 50, 33, 2056, DType::kBF16, DType::kI32}, Device::Cuda(0));
  // Forward units of 16 bytes (f32 dim 4), 8 (f32 dim 6: 24-byte rows), 4 (f32 dim 5), 2 (bf16
  // dim 7, f16 dim 3); token counts no multiple of the flat kernel's 2 rows, units no multiple of
  // its CTA. Backward: rows without the 16-byte layout (one column per thread), a team of threads
  // per row narrower than the CTA (dim 24, 200), wider (1032 f16 = 129 packs).
  Check({3, 33, 100, 4, DType::kF32, DType::kI64}, Device::Cuda(0));
  Check({1, 7, 9, 6, DType::kF32, DType::kI32}, Device::Cuda(0));
  Check({2, 5, 13, 5, DType::kF32, DType::kI64}, Device::Cuda(0));
  Check({3, 11, 40, 7, DType::kBF16, DType::kI32}, Device::Cuda(0));
  Check({1, 9, 6, 3, DType::kF16, DType::kI64}, Device::Cuda(0));
  Check({5, 13, 1000, 1032, DType::kF16, DType::kI64}, Device::Cuda(0));
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

// Bitwise equality (NaN never equals: an unwritten, poisoned element fails), reporting the first
// difference and the count rather than printing whole tables.
void ExpectBitwise(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]))) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << "first difference at " << first << ": " << got[first] << " vs " << want[first];
}

// dtable from the GPU backward under SG_EMBEDDING_BWD = `bwd`.
std::vector<double> GpuBackward(const char* bwd, const TensorView& dout, const TensorView& ids, int64_t vocab,
                                const Stream& s) {
  ScopedEnv env("SG_EMBEDDING_BWD", bwd);
  Tensor dt = Tensor::Empty({vocab, dout.shape().back()}, DType::kF32, dout.device()).value();
  Poison(dt);
  const absl::Status st = EmbeddingBackward(dout, ids, dt, s);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(s.Synchronize().ok());
  return ToHost(dt);
}

// Every other backward (kComparedBackwards) bitwise against the sorted one, and the sorted one
// bitwise against the CPU reference when every id is in range (the same f32 additions in the same
// order).
void CheckBackwardsBitwise(const std::vector<double>& ids, int64_t vocab, int64_t dim, DType dtype, DType id_dtype) {
  const int64_t n = int64_t(ids.size());
  SCOPED_TRACE(std::to_string(n) + " tokens, vocab " + std::to_string(vocab) + " dim " + std::to_string(dim) + " " +
               std::string(DTypeName(dtype)) + " ids " + std::string(DTypeName(id_dtype)));
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  Tensor ids_gpu = FromHost(ids, {n}, id_dtype, d);
  Tensor dout_cpu = RandomTensor({n, dim}, dtype, Device::Cpu(), Rng());
  Tensor dout = FromHost(ToHost(dout_cpu), {n, dim}, dtype, d);
  const std::vector<double> want = GpuBackward("rows", dout, ids_gpu, vocab, s);
  if (std::all_of(ids.begin(), ids.end(), [&](double id) { return id >= 0 && id < double(vocab); })) {
    Tensor dref = Tensor::Empty({vocab, dim}, DType::kF32, Device::Cpu()).value();
    Poison(dref);
    ASSERT_TRUE(EmbeddingBackward(dout_cpu, FromHost(ids, {n}, id_dtype, Device::Cpu()), dref, Stream::Cpu()).ok());
    ExpectBitwise(want, ToHost(dref));
  }
  for (const char* bwd : kComparedBackwards) {
    SCOPED_TRACE(bwd);
    ExpectBitwise(GpuBackward(bwd, dout, ids_gpu, vocab, s), want);
  }
}

// `lengths[k]` copies of id k, then `singles` ids drawn from [lengths.size(), vocab); shuffled.
std::vector<double> RunIds(const std::vector<int>& lengths, int64_t vocab, int singles) {
  std::vector<double> ids;
  for (size_t k = 0; k < lengths.size(); ++k) ids.insert(ids.end(), size_t(lengths[k]), double(k));
  const uint64_t rest = uint64_t(vocab) - lengths.size();
  for (int i = 0; i < singles; ++i) ids.push_back(double(lengths.size() + Rng()() % rest));
  std::shuffle(ids.begin(), ids.end(), Rng());
  return ids;
}

// Runs of every length class of the atomic path's in-place sort (embedding_atomic.cu): 2..32 (one
// warp per row), 33..2048 (bitonic in shared memory), longer (bitmap windows), at the edges of
// each, with the four rows of one CTA mixing classes; 16-byte rows and the general row sum.
TEST(EmbeddingCudaBackwardTest, SortsRunsOfEveryLength) {
  SG_SKIP_WITHOUT_CUDA();
  const std::vector<int> lengths = {2, 31, 32, 33, 64, 65, 2048, 2049, 1, 0, 3, 5000, 4097, 1000, 0, 17};
  CheckBackwardsBitwise(RunIds(lengths, 100, 300), 100, 8, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(RunIds(lengths, 101, 300), 101, 24, DType::kF16, DType::kI64);
  CheckBackwardsBitwise(RunIds(lengths, 99, 300), 99, 5, DType::kF32, DType::kI32);  // not 16-byte rows
  CheckBackwardsBitwise(RunIds(lengths, 1000, 3000), 1000, 2056, DType::kBF16, DType::kI32);
  // Sparse lists of touched rows: most CTAs of atomic2s's sums hold runs of 1-3 only, some one of
  // 4 or more.
  CheckBackwardsBitwise(RunIds({2, 3, 4, 5, 3, 2, 40}, 20000, 9000), 20000, 64, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(RunIds({3, 4, 2}, 5003, 2500), 5003, 2048, DType::kF32, DType::kI64);
}

// One id for every token: one run of all tokens, sorted through one (16384) or two bitmap windows
// (70000 tokens, window 65536); two windowed runs in one CTA; one long run of wide rows.
TEST(EmbeddingCudaBackwardTest, AllTokensEqual) {
  SG_SKIP_WITHOUT_CUDA();
  CheckBackwardsBitwise(std::vector<double>(16384, 5.0), 7, 8, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(std::vector<double>(70000, 0.0), 3, 8, DType::kF32, DType::kI64);
  std::vector<double> two(70001);
  for (size_t i = 0; i < two.size(); ++i) two[i] = double(1 + i % 2);
  CheckBackwardsBitwise(two, 4, 8, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(std::vector<double>(16384, 3.0), 4, 2048, DType::kBF16, DType::kI32);
}

// Every token its own id: every run one token, and for "atomic2s" a touched list as long as it can
// be (min(tokens, vocab) rows, the sum kernel's whole worst-case grid busy): every row of the
// table (16-byte rows: no zero fill left), all but a few rows with the list's last CTA partial
// (4097 of 5001), and a Llama-like spread (16384 of 32000) with wide rows; then every row three
// times (the list again the whole table, fewer entries than tokens).
TEST(EmbeddingCudaBackwardTest, EveryIdDistinct) {
  SG_SKIP_WITHOUT_CUDA();
  auto distinct = [](int64_t n, int64_t vocab) {
    std::vector<double> all(static_cast<size_t>(vocab));
    for (size_t i = 0; i < all.size(); ++i) all[i] = double(i);
    std::shuffle(all.begin(), all.end(), Rng());
    all.resize(static_cast<size_t>(n));
    return all;
  };
  CheckBackwardsBitwise(distinct(4096, 4096), 4096, 8, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(distinct(4097, 5001), 5001, 24, DType::kF32, DType::kI64);
  CheckBackwardsBitwise(distinct(16384, 32000), 32000, 256, DType::kBF16, DType::kI32);
  std::vector<double> thrice;
  for (int k = 0; k < 3; ++k) {
    const std::vector<double> once = distinct(999, 999);
    thrice.insert(thrice.end(), once.begin(), once.end());
  }
  CheckBackwardsBitwise(thrice, 999, 16, DType::kF16, DType::kI32);
}

// Runs of 1..9 tokens in CTAs mixing lengths, at 16-byte rows of one pack and of 2048 columns and
// at f32 rows of 1032; a Zipf-like spread over a Llama vocabulary (many rows of a few tokens, a few
// of hundreds), as real text gives; one id at both ends of 1024-id chunks and far apart. (Written for
// "bucket", a backward that kept each row's first four positions with its count; it measured
// slower than atomic2s and was removed, see embedding_atomic.cu.)
TEST(EmbeddingCudaBackwardTest, ShortRunsAndAZipfSpread) {
  SG_SKIP_WITHOUT_CUDA();
  const std::vector<int> lengths = {1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 5, 1, 4, 3};
  CheckBackwardsBitwise(RunIds(lengths, 300, 200), 300, 8, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(RunIds(lengths, 3001, 1500), 3001, 2048, DType::kBF16, DType::kI64);
  CheckBackwardsBitwise(RunIds(lengths, 3001, 1500), 3001, 1032, DType::kF32, DType::kI32);
  std::vector<double> zipf(16384);
  for (double& id : zipf) {
    const double u = double(Rng()() % 1000000 + 1) / 1e6;
    id = std::floor(std::pow(32000.0, u)) - 1;  // log-uniform: P(id) ~ 1 / (id + 1)
  }
  CheckBackwardsBitwise(zipf, 32000, 64, DType::kBF16, DType::kI32);
  std::vector<double> ends(5000);
  for (size_t i = 0; i < ends.size(); ++i) ends[i] = double(Rng()() % 2000);
  ends[0] = ends[1023] = ends[1024] = ends[4999] = ends[2500] = ends[3333] = 77.0;
  CheckBackwardsBitwise(ends, 2000, 16, DType::kF16, DType::kI64);
}

// The benchmark's "hot" case: 5% of the tokens one id, the rest spread over a Llama vocabulary.
TEST(EmbeddingCudaBackwardTest, HotId) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<double> ids(16384);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 20 == 0 ? 12345.0 : double(Rng()() % 32000);
  CheckBackwardsBitwise(ids, 32000, 64, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(ids, 128256, 16, DType::kF32, DType::kI64);  // 32 tiles of the count scan
}

// A hot range (written for the removed one-kernel "scan3", whose CTA lists overflowed on it; kept
// for the sorts): ids 0 and 1 on most of 20000 tokens (runs past kBitonicCap, sorted by position
// windows), ids 3 and 4 only among the first and the last 1000 tokens, runs of a few tokens (ids
// 6..); rows of 2056 bf16 (257 packs: more than one per thread), and rows without the 16-byte
// layout (the atomic path).
TEST(EmbeddingCudaBackwardTest, ScanPassesOverAHotRange) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<double> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 13 == 0) {
      ids[i] = double(6 + Rng()() % 294);
    } else if (i < 1000) {
      ids[i] = i % 10 == 0 ? 3.0 : 0.0;
    } else if (i >= 19000) {
      ids[i] = i % 10 == 0 ? 4.0 : 0.0;
    } else {
      ids[i] = i % 7 == 0 ? 5.0 : double(i % 2);
    }
  }
  CheckBackwardsBitwise(ids, 300, 64, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(ids, 300, 24, DType::kF32, DType::kI64);
  CheckBackwardsBitwise(ids, 300, 5, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(ids, 300, 2056, DType::kBF16, DType::kI32);
}

// Wide rows (written for the removed "scan3"'s ring segments of 2048 columns; kept for the row
// sums' loops over packs): bf16 4096 and f32 2056 / 2048 columns, f32 dout, hot ids with wide
// rows, and one id on 3000 tokens of f16 rows of 4104 columns.
TEST(EmbeddingCudaBackwardTest, WideRows) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<double> ids(6000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = double(Rng()() % 700);
  CheckBackwardsBitwise(ids, 700, 4096, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(ids, 700, 2056, DType::kF32, DType::kI64);
  CheckBackwardsBitwise(ids, 700, 2048, DType::kF32, DType::kI32);
  std::vector<double> hot(9000);
  for (size_t i = 0; i < hot.size(); ++i) hot[i] = i % 5 == 0 ? double(Rng()() % 200) : double(i % 3);
  CheckBackwardsBitwise(hot, 200, 4096, DType::kF32, DType::kI32);
  CheckBackwardsBitwise(hot, 129, 2048, DType::kBF16, DType::kI64);
  CheckBackwardsBitwise(std::vector<double>(3000, 1.0), 2, 4104, DType::kF16, DType::kI32);
}

// The zero fill of "atomic2s" (embedding_atomic.cu: ZeroUntouchedKernel, about 1024 float4 per
// CTA in whole rows) over poisoned tables where most rows have no token: 512 rows a CTA and a
// partial last CTA (dim 8, vocab 3001), 170 rows a CTA (dim 24, 6 float4 a row), one row a CTA
// wider than the CTA's share (dim 8200: 2050 float4); a table with no token at all.
TEST(EmbeddingCudaBackwardTest, ZeroesUntouchedRows) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<double> ids(500);
  for (double& id : ids) id = double(Rng()() % 3001);
  CheckBackwardsBitwise(ids, 3001, 8, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(ids, 3001, 24, DType::kF32, DType::kI64);
  ids.resize(40);
  for (double& id : ids) id = double(Rng()() % 97);
  CheckBackwardsBitwise(ids, 97, 8200, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(std::vector<double>(64, 5000.0), 3001, 8, DType::kBF16, DType::kI32);  // all out of range
  CheckBackwardsBitwise({42.0}, 3001, 8, DType::kBF16, DType::kI32);  // one token: no row can have two
}

// atomic2s's early fill (embedding_atomic.cu): the side stream zeroes the table's first rows (one
// fill CTA's, 16 KB) before the counts exist, and the fill after the count starts past them. On by
// default from 64 MiB of table: 16400 x 1024 f32 (67 MB, 4 early rows), with rows 0 and 2 touched
// (zeroed early, then summed) and rows 1 and 3 not; forced on for small tables (all 100 rows
// early at dim 8; 512 of 3001; one row of 8200 floats) and off for the large one.
TEST(EmbeddingCudaBackwardTest, EarlyFill) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<double> ids = {0.0, 2.0, 0.0};
  for (int i = 0; i < 3000; ++i) ids.push_back(double(4 + Rng()() % (16400 - 4)));
  std::shuffle(ids.begin(), ids.end(), Rng());
  CheckBackwardsBitwise(ids, 16400, 1024, DType::kBF16, DType::kI32);
  {
    ScopedEnv off("SG_EMBEDDING_EARLY_FILL", "0");
    CheckBackwardsBitwise(ids, 16400, 1024, DType::kBF16, DType::kI32);
  }
  ScopedEnv on("SG_EMBEDDING_EARLY_FILL", "1");
  CheckBackwardsBitwise(RunIds({3, 0, 1, 40}, 100, 50), 100, 8, DType::kBF16, DType::kI64);
  ids.resize(500);
  for (double& id : ids) id = double(Rng()() % 3001);
  CheckBackwardsBitwise(ids, 3001, 8, DType::kF32, DType::kI32);
  ids.resize(40);
  for (double& id : ids) id = double(1 + Rng()() % 96);  // row 0, the early one, untouched
  CheckBackwardsBitwise(ids, 97, 8200, DType::kBF16, DType::kI32);
}

// "atomic2s" shares one side stream and its fork / join events among all callers on a device:
// back-to-back calls on two streams without a synchronization in between, first from one host
// thread, then from two at once (one a stream), each result bitwise the CPU reference's. The caching
// allocator reuses scratch in the order of one stream only, so the two streams' vocabularies (5000,
// 20000) give scratch sizes too far apart (122 KB, 270 KB) for one's block to serve the other.
TEST(EmbeddingCudaBackwardTest, Atomic2sOnSeveralStreamsAndThreads) {
  SG_SKIP_WITHOUT_CUDA();
  ScopedEnv env("SG_EMBEDDING_BWD", "atomic2s");
  const Device d = Device::Cuda(0);
  constexpr int kStreams = 2, kCalls = 3, kAll = kStreams * kCalls;
  const int64_t n = 3000, dim = 64, vocabs[kStreams] = {5000, 20000};
  std::vector<Tensor> ids_cpu, dout_cpu, ids, dout, got;
  for (int k = 0; k < kAll; ++k) {
    const int64_t vocab = vocabs[k % kStreams];
    std::vector<double> v(static_cast<size_t>(n));
    for (double& id : v) id = double(Rng()() % uint64_t(k < kStreams ? vocab : 50));  // sparse, or long runs
    ids_cpu.push_back(FromHost(v, {n}, DType::kI32, Device::Cpu()));
    ids.push_back(FromHost(v, {n}, DType::kI32, d));
    dout_cpu.push_back(RandomTensor({n, dim}, DType::kBF16, Device::Cpu(), Rng()));
    dout.push_back(FromHost(ToHost(dout_cpu.back()), {n, dim}, DType::kBF16, d));
    got.push_back(Tensor::Empty({vocab, dim}, DType::kF32, d).value());
    Poison(got.back());
  }
  std::vector<Stream> streams;
  for (int t = 0; t < kStreams; ++t) streams.push_back(Stream::Create(d).value());
  std::vector<std::vector<double>> want;
  for (int k = 0; k < kAll; ++k) {
    Tensor dref = Tensor::Empty({vocabs[k % kStreams], dim}, DType::kF32, Device::Cpu()).value();
    ASSERT_TRUE(EmbeddingBackward(dout_cpu[size_t(k)], ids_cpu[size_t(k)], dref, Stream::Cpu()).ok());
    want.push_back(ToHost(dref));
  }
  // Call k on stream k % kStreams.
  auto run = [&](int k) {
    return EmbeddingBackward(dout[size_t(k)], ids[size_t(k)], got[size_t(k)], streams[size_t(k % kStreams)]);
  };
  for (int k = 0; k < kAll; ++k) ASSERT_TRUE(run(k).ok());
  for (const Stream& s : streams) ASSERT_TRUE(s.Synchronize().ok());
  for (int k = 0; k < kAll; ++k) {
    SCOPED_TRACE("one thread, call " + std::to_string(k));
    ExpectBitwise(ToHost(got[size_t(k)]), want[size_t(k)]);
    Poison(got[size_t(k)]);
  }
  std::vector<absl::Status> status(static_cast<size_t>(kAll));
  std::vector<std::thread> threads;
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      for (int k = t; k < kAll; k += kStreams) status[size_t(k)] = run(k);
    });
  }
  for (std::thread& th : threads) th.join();  // a few kernel launches each: no wait on the device
  for (const Stream& s : streams) ASSERT_TRUE(s.Synchronize().ok());
  for (int k = 0; k < kAll; ++k) {
    SCOPED_TRACE("two threads, call " + std::to_string(k));
    EXPECT_TRUE(status[size_t(k)].ok()) << status[size_t(k)];
    ExpectBitwise(ToHost(got[size_t(k)]), want[size_t(k)]);
  }
}

// Token ids not 16-byte aligned (a view one id into the buffer) and a count no multiple of a
// 16-byte load; every backward against the CPU.
TEST(EmbeddingCudaBackwardTest, UnalignedIds) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  for (DType id_dtype : {DType::kI32, DType::kI64}) {
    SCOPED_TRACE(DTypeName(id_dtype));
    const int64_t n = 1001, vocab = 97, dim = 16;
    std::vector<double> all(size_t(n + 1));
    for (double& id : all) id = double(Rng()() % uint64_t(vocab));
    Tensor ids_buf = FromHost(all, {n + 1}, id_dtype, d);
    const TensorView ids = ids_buf.view().Slice0(1, n + 1).value();
    Tensor dout_cpu = RandomTensor({n, dim}, DType::kBF16, Device::Cpu(), Rng());
    Tensor dout = FromHost(ToHost(dout_cpu), {n, dim}, DType::kBF16, d);
    Tensor dref = Tensor::Empty({vocab, dim}, DType::kF32, Device::Cpu()).value();
    const std::vector<double> tail(all.begin() + 1, all.end());
    ASSERT_TRUE(EmbeddingBackward(dout_cpu, FromHost(tail, {n}, id_dtype, Device::Cpu()), dref, Stream::Cpu()).ok());
    for (const char* bwd : kBackwards) {
      SCOPED_TRACE(bwd);
      ExpectBitwise(GpuBackward(bwd, dout, ids, vocab, s), ToHost(dref));
    }
  }
}

// Out-of-range ids (repeated, and next to repeated valid ones) drop, as in the sorted path.
TEST(EmbeddingCudaBackwardTest, OutOfRangeIds) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<double> ids = RunIds({40, 0, 3, 2500}, 50, 200);
  for (int i = 0; i < 3000; ++i) ids.push_back(i % 3 == 0 ? -1.0 : i % 3 == 1 ? 50.0 : 1e6);
  std::shuffle(ids.begin(), ids.end(), Rng());
  CheckBackwardsBitwise(ids, 50, 16, DType::kF32, DType::kI64);
  CheckBackwardsBitwise(ids, 50, 16, DType::kBF16, DType::kI32);
  CheckBackwardsBitwise(std::vector<double>(5000, -7.0), 50, 8, DType::kBF16, DType::kI32);  // no valid id
}

TEST(EmbeddingCudaBackwardTest, NoTokens) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  Tensor ids = Tensor::Empty({0}, DType::kI32, d).value();
  Tensor dout = Tensor::Empty({0, 8}, DType::kBF16, d).value();
  for (const char* bwd : kBackwards) {
    SCOPED_TRACE(bwd);
    ExpectBitwise(GpuBackward(bwd, dout, ids, 9, s), std::vector<double>(72, 0.0));
  }
}

#ifdef SG_WITH_CUDA
// The forward and a backward (atomic: its scratch held by the allocator for the graph's life;
// atomic2s: the same, with a fork to its side stream and a join back), chained by programmatic dependent launch, captured in a CUDA graph and replayed twice
// over poisoned outputs: the same bits as the eager calls.
class EmbeddingCudaGraphTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Backward, EmbeddingCudaGraphTest,
                         ::testing::Values("atomic", "atomic2s"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

TEST_P(EmbeddingCudaGraphTest, CapturesInACudaGraph) {
  SG_SKIP_WITHOUT_CUDA();
  ScopedEnv bwd("SG_EMBEDDING_BWD", GetParam());
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  const Case c{4, 1000, 1000, 256, DType::kBF16, DType::kI32};
  Tensor ids = RandomIds(c, d);
  Tensor table = RandomTensor({c.vocab, c.dim}, c.dtype, d, Rng());
  Tensor dout = RandomTensor({c.batch, c.seq, c.dim}, c.dtype, d, Rng());
  Tensor out = Tensor::Empty({c.batch, c.seq, c.dim}, c.dtype, d).value();
  Tensor dtable = Tensor::Empty({c.vocab, c.dim}, DType::kF32, d).value();
  ASSERT_TRUE(EmbeddingForward(ids, table, out, s).ok());
  ASSERT_TRUE(EmbeddingBackward(dout, ids, dtable, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const std::vector<double> want_out = ToHost(out), want_dt = ToHost(dtable);
  Allocator* alloc = AllocatorFor(d).value();
  cudaStream_t cs = static_cast<cudaStream_t>(s.native());
  alloc->BeginHoldingFrees();
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status f = EmbeddingForward(ids, table, out, s);
  const absl::Status b = EmbeddingBackward(dout, ids, dtable, s);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(cs, &graph);
  const std::vector<void*> held = alloc->EndHoldingFrees();
  ASSERT_TRUE(f.ok()) << f;
  ASSERT_TRUE(b.ok()) << b;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    Poison(out);
    Poison(dtable);
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    ASSERT_TRUE(s.Synchronize().ok());
    ExpectBitwise(ToHost(out), want_out);
    ExpectBitwise(ToHost(dtable), want_dt);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  alloc->ReleaseHeld(held);
}
#endif  // SG_WITH_CUDA

}  // namespace
}  // namespace sg::kernels
