// The CUDA embedding backward's paths (embedding_internal.h: rows, packs, fused) stage by stage:
// the preparation's order / offsets against a CPU stable sort (and the one-CTA preparation against
// CUB's bit for bit), the row sums against an f32 loop in token order (the bits every path must
// give), at odd sizes, one id repeated thousands of times, all ids equal, out-of-range ids, i32 /
// i64 ids, bf16 / f16 / f32, the one-CTA preparation's capacity and one past it, and every fused
// launch shape (early zeros included, and with a garbage bitmap); and the fused backward inside a
// captured CUDA graph. Skips without a GPU.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/allocator.h"
#include "kernels/core/testing.h"
#include "kernels/embedding/embedding.h"
#include "kernels/embedding/embedding_internal.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::kernels {
namespace {

using embedding_internal::BackwardConfig;
using embedding_internal::BackwardPath;
using embedding_internal::Problem;
using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::Rng;
using testing::ToHost;

// How a case draws its ids: random over the vocabulary, a third of it (repeats), 45% one hot id
// (thousands of repeats at 16k tokens), all the last id, or a mix with out-of-range ids.
enum class Ids { kRandom, kThird, kHot, kAllEqual, kOutOfRange };

struct Case {
  int64_t n, vocab, dim;
  DType dtype, id_dtype;
  Ids ids;
  std::string Name() const {
    return std::to_string(n) + " tokens, vocab " + std::to_string(vocab) + ", dim " + std::to_string(dim) + ", " +
           std::string(DTypeName(dtype)) + ", ids " + std::string(DTypeName(id_dtype)) + " kind " +
           std::to_string(int(ids));
  }
};

std::vector<int64_t> DrawIds(const Case& c) {
  std::vector<int64_t> ids(static_cast<size_t>(c.n));
  const int64_t hot = c.vocab / 2;
  for (int64_t& id : ids) {
    const uint64_t r = Rng()();
    switch (c.ids) {
      case Ids::kRandom: id = int64_t(r % uint64_t(c.vocab)); break;
      case Ids::kThird: id = int64_t(r % uint64_t(std::max<int64_t>(1, c.vocab / 3))); break;
      case Ids::kHot: id = r % 100 < 45 ? hot : int64_t((r >> 8) % uint64_t(c.vocab)); break;
      case Ids::kAllEqual: id = c.vocab - 1; break;
      case Ids::kOutOfRange: {
        const int64_t huge = c.id_dtype == DType::kI64 ? int64_t(1) << 40 : int64_t(1) << 30;
        const int64_t bad[] = {-1, c.vocab, c.vocab + 7, -1000, huge};
        id = r % 4 == 0 ? bad[(r >> 8) % 5] : int64_t((r >> 8) % uint64_t(c.vocab));
        break;
      }
    }
  }
  return ids;
}

// Positions stably sorted by id (out-of-range last) and the first sorted position of each id.
void CpuPrepare(const std::vector<int64_t>& ids, int64_t vocab, std::vector<int32_t>* order,
                std::vector<int32_t>* offsets) {
  auto key = [&](int32_t i) { return ids[size_t(i)] >= 0 && ids[size_t(i)] < vocab ? ids[size_t(i)] : vocab; };
  order->resize(ids.size());
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(), [&](int32_t a, int32_t b) { return key(a) < key(b); });
  offsets->assign(size_t(vocab + 1), 0);
  for (int64_t v = 0, j = 0; v <= vocab; ++v) {
    while (j < int64_t(order->size()) && key((*order)[size_t(j)]) < v) ++j;
    (*offsets)[size_t(v)] = int32_t(j);
  }
}

// dtable as every CUDA path must produce it: per id, 0 + the dout rows in token order, in f32.
std::vector<double> TokenOrderSums(const std::vector<int64_t>& ids, const std::vector<double>& dout, int64_t vocab,
                                   int64_t dim) {
  std::vector<float> acc(size_t(vocab * dim), 0.f);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) continue;
    for (int64_t c = 0; c < dim; ++c) {
      float& a = acc[size_t(ids[i] * dim + c)];
      a += float(dout[i * size_t(dim) + size_t(c)]);
    }
  }
  return std::vector<double>(acc.begin(), acc.end());
}

// got == want element for element (as doubles: f32 and int32 values are exact), reporting the
// count and the first few mismatches instead of two whole vectors.
template <typename A, typename B>
void ExpectSame(const std::vector<A>& got, const std::vector<B>& want) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (double(got[i]) == double(want[i])) continue;
    if (++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0) << "mismatches out of " << got.size();
}

#ifdef SG_WITH_CUDA

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {16384, 32000, 64, DType::kBF16, DType::kI32, Ids::kRandom},     // the one-CTA capacity, 2 radix passes
      {16384, 32000, 40, DType::kBF16, DType::kI32, Ids::kHot},        // ~7400 repeats of one id
      {16384, 1000, 16, DType::kF16, DType::kI64, Ids::kAllEqual},     // one run of 16384
      {12345, 128256, 12, DType::kF32, DType::kI64, Ids::kRandom},     // 17-bit keys: 3 passes
      {1000, 33, 36, DType::kBF16, DType::kI64, Ids::kOutOfRange},     // dim % 8 != 0
      {999, 301, 24, DType::kF32, DType::kI32, Ids::kOutOfRange},
      {777, 50, 10, DType::kF32, DType::kI32, Ids::kThird},            // dim % 4 != 0: scalar row sums
      {3000, 20, 2056, DType::kBF16, DType::kI32, Ids::kThird},        // long runs, 514 quads per row
      {5, 1, 8, DType::kF16, DType::kI32, Ids::kAllEqual},             // vocab 1: 1-bit keys
      {1, 7, 4, DType::kF32, DType::kI64, Ids::kRandom},
      {16385, 3000, 16, DType::kBF16, DType::kI32, Ids::kHot},         // one past capacity: CUB preparation
      {40000, 20000, 8, DType::kBF16, DType::kI64, Ids::kRandom},
  };
  return cases;
}

BackwardConfig Path(BackwardPath path) {
  BackwardConfig cfg;
  cfg.path = path;
  return cfg;
}

TEST(EmbeddingBackwardStagesTest, PreparationMatchesStableSort) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.Name());
    const std::vector<int64_t> ids = DrawIds(c);
    Tensor tids = FromHost(std::vector<double>(ids.begin(), ids.end()), {c.n}, c.id_dtype, d);
    std::vector<int32_t> want_order, want_offsets;
    CpuPrepare(ids, c.vocab, &want_order, &want_offsets);
    const Problem p{c.n, c.vocab, c.dim, c.dtype, c.id_dtype == DType::kI64};
    for (int variant = 0; variant < 3; ++variant) {  // CUB, one CTA with ballots, with match_any
      BackwardConfig cfg = Path(variant == 0 ? BackwardPath::kRows : BackwardPath::kFused);
      cfg.prep_match_any = variant == 2;
      SCOPED_TRACE(cfg.ToString());
      Tensor order = Tensor::Empty({c.n}, DType::kI32, d).value();
      Tensor offsets = Tensor::Empty({embedding_internal::BackwardOffsetsInts(p)}, DType::kI32, d).value();
      Poison(order);
      Poison(offsets);
      ASSERT_TRUE(embedding_internal::BackwardPrepareCuda(p, cfg, tids.view().raw(), order.data<int32_t>(),
                                                          offsets.data<int32_t>(), 0, s.native())
                      .ok());
      ASSERT_TRUE(s.Synchronize().ok());
      const std::vector<double> ho = ToHost(order), hf = ToHost(offsets);
      ExpectSame(ho, want_order);
      ExpectSame(std::vector<double>(hf.begin(), hf.begin() + c.vocab + 1), want_offsets);
    }
  }
}

// Runs the whole backward with cfg into a fresh poisoned dtable.
std::vector<double> RunBackward(const Case& c, const BackwardConfig& cfg, const Tensor& dout, const Tensor& ids,
                                const Stream& s) {
  Tensor dtable = Tensor::Empty({c.vocab, c.dim}, DType::kF32, dout.device()).value();
  Poison(dtable);
  const Problem p{c.n, c.vocab, c.dim, c.dtype, c.id_dtype == DType::kI64};
  const absl::Status st = embedding_internal::BackwardCudaWith(p, cfg, dout.view().raw(), ids.view().raw(),
                                                               dtable.data<float>(), 0, s.native());
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(s.Synchronize().ok());
  return ToHost(dtable);
}

TEST(EmbeddingBackwardStagesTest, EveryPathGivesTheTokenOrderBits) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.Name());
    const std::vector<int64_t> ids = DrawIds(c);
    Tensor tids = FromHost(std::vector<double>(ids.begin(), ids.end()), {c.n}, c.id_dtype, d);
    Tensor dout = RandomTensor({c.n, c.dim}, c.dtype, d, Rng());
    const std::vector<double> want = TokenOrderSums(ids, ToHost(dout), c.vocab, c.dim);
    ASSERT_TRUE(std::any_of(want.begin(), want.end(), [](double x) { return x != 0; }));
    for (int variant = 0; variant < 4; ++variant) {  // rows, packs, fused, fused with early zeros
      BackwardConfig cfg = Path(variant == 0 ? BackwardPath::kRows
                                : variant == 1 ? BackwardPath::kPacks
                                               : BackwardPath::kFused);
      cfg.early_zeros = variant == 3;
      SCOPED_TRACE(cfg.ToString());
      ExpectSame(RunBackward(c, cfg, dout, tids, s), want);
    }
  }
}

// Every fused launch shape (rows per step, grid, store kind, programmatic launch) on a few cases.
TEST(EmbeddingBackwardStagesTest, FusedLaunchShapesAgree) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  for (const Case& c : {Cases()[0], Cases()[1], Cases()[4], Cases()[7]}) {
    SCOPED_TRACE(c.Name());
    const std::vector<int64_t> ids = DrawIds(c);
    Tensor tids = FromHost(std::vector<double>(ids.begin(), ids.end()), {c.n}, c.id_dtype, d);
    Tensor dout = RandomTensor({c.n, c.dim}, c.dtype, d, Rng());
    const std::vector<double> want = TokenOrderSums(ids, ToHost(dout), c.vocab, c.dim);
    for (int rows : {1, 8, 16, 31}) {
      for (int ctas : {0, 1, 3}) {
        for (bool streaming : {false, true}) {
          for (int launch = 0; launch < 3; ++launch) {  // plain, pdl, pdl + early zeros
            BackwardConfig cfg = Path(BackwardPath::kFused);
            cfg.rows_per_step = rows;
            cfg.ctas_per_sm = ctas;
            cfg.streaming_stores = streaming;
            cfg.pdl = launch > 0;
            cfg.early_zeros = launch == 2;
            SCOPED_TRACE(cfg.ToString());
            ExpectSame(RunBackward(c, cfg, dout, tids, s), want);
          }
        }
      }
    }
  }
}

// Early zeros' bitmap is only a hint: the row sums alone, on offsets prepared by CUB, with a
// random bitmap marked ready, still give the exact sums (rows it calls unused that have tokens are
// rewritten, rows it calls used that have none are zeroed after the wait).
TEST(EmbeddingBackwardStagesTest, EarlyZerosBitmapIsOnlyAHint) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  const Case c{4000, 3001, 64, DType::kBF16, DType::kI32, Ids::kThird};
  const Problem p{c.n, c.vocab, c.dim, c.dtype, false};
  const std::vector<int64_t> ids = DrawIds(c);
  Tensor tids = FromHost(std::vector<double>(ids.begin(), ids.end()), {c.n}, c.id_dtype, d);
  Tensor dout = RandomTensor({c.n, c.dim}, c.dtype, d, Rng());
  Tensor order = Tensor::Empty({c.n}, DType::kI32, d).value();
  Tensor offsets = Tensor::Empty({embedding_internal::BackwardOffsetsInts(p)}, DType::kI32, d).value();
  ASSERT_TRUE(embedding_internal::BackwardPrepareCuda(p, Path(BackwardPath::kRows), tids.view().raw(),
                                                      order.data<int32_t>(), offsets.data<int32_t>(), 0, s.native())
                  .ok());
  ASSERT_TRUE(s.Synchronize().ok());
  std::vector<double> host = ToHost(offsets);
  const int words = embedding_internal::HintWords(c.vocab);
  for (int w = 0; w < words; ++w) host[size_t(c.vocab + 1 + w)] = double(int32_t(Rng()() & 0x7fffffffu));
  host[size_t(c.vocab + 1 + words)] = 1;  // ready
  Tensor host_offsets = FromHost(host, offsets.shape(), DType::kI32, Device::Cpu());
  ASSERT_TRUE(CopyTensor(host_offsets, offsets, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  BackwardConfig cfg = Path(BackwardPath::kFused);
  cfg.early_zeros = true;
  ASSERT_TRUE(embedding_internal::UsesEarlyZeros(p, cfg));
  Tensor dtable = Tensor::Empty({c.vocab, c.dim}, DType::kF32, d).value();
  Poison(dtable);
  ASSERT_TRUE(embedding_internal::BackwardRowSumCuda(p, cfg, dout.view().raw(), order.data<int32_t>(),
                                                     offsets.data<int32_t>(), dtable.data<float>(), s.native())
                  .ok());
  ASSERT_TRUE(s.Synchronize().ok());
  ExpectSame(ToHost(dtable), TokenOrderSums(ids, ToHost(dout), c.vocab, c.dim));
}

// The fused backward (programmatic dependent launch included) captured in a CUDA graph and replayed
// twice with changed inputs, the way the executor runs a step: warm up eagerly, then capture.
TEST(EmbeddingBackwardStagesTest, FusedBackwardReplaysInACudaGraph) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  const Case c{16384, 32000, 64, DType::kBF16, DType::kI32, Ids::kHot};
  ASSERT_EQ(setenv("SG_EMBEDDING_BWD", "fused", 1), 0);
  Tensor tids = Tensor::Empty({c.n}, DType::kI32, d).value();
  Tensor dout = Tensor::Empty({c.n, c.dim}, c.dtype, d).value();
  Tensor dtable = Tensor::Empty({c.vocab, c.dim}, DType::kF32, d).value();
  // The inputs are refilled between replays: copies into the captured addresses.
  auto refill = [&](const std::vector<int64_t>& ids) {
    Tensor ids_src = FromHost(std::vector<double>(ids.begin(), ids.end()), {c.n}, DType::kI32, d);
    Tensor dout_src = RandomTensor({c.n, c.dim}, c.dtype, d, Rng());
    ASSERT_TRUE(CopyTensor(ids_src, tids, s).ok());
    ASSERT_TRUE(CopyTensor(dout_src, dout, s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
  };
  refill(std::vector<int64_t>(size_t(c.n), 3));
  ASSERT_TRUE(EmbeddingBackward(dout, tids, dtable, s).ok());  // warm-up: allocator cache, attributes
  ASSERT_TRUE(s.Synchronize().ok());
  Allocator* alloc = AllocatorFor(d).value();
  alloc->BeginHoldingFrees();
  cudaStream_t cs = static_cast<cudaStream_t>(s.native());
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = EmbeddingBackward(dout, tids, dtable, s);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(cs, &graph);
  const std::vector<void*> held = alloc->EndHoldingFrees();
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE(replay);
    const std::vector<int64_t> ids = DrawIds(c);
    refill(ids);
    Poison(dtable);
    ASSERT_TRUE(s.Synchronize().ok());
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    ASSERT_TRUE(s.Synchronize().ok());
    ExpectSame(ToHost(dtable), TokenOrderSums(ids, ToHost(dout), c.vocab, c.dim));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  alloc->ReleaseHeld(held);
  unsetenv("SG_EMBEDDING_BWD");
}

#endif  // SG_WITH_CUDA

// The references above against the public CPU backward (which rejects out-of-range ids), so a
// CPU-only build still checks them.
TEST(EmbeddingBackwardStagesTest, ReferencesAgreeWithTheCpuBackward) {
  for (const Case& c : {Case{500, 37, 12, DType::kBF16, DType::kI32, Ids::kHot},
                        Case{300, 5, 8, DType::kF32, DType::kI64, Ids::kThird}}) {
    SCOPED_TRACE(c.Name());
    const std::vector<int64_t> ids = DrawIds(c);
    Tensor tids = FromHost(std::vector<double>(ids.begin(), ids.end()), {c.n}, c.id_dtype, Device::Cpu());
    Tensor dout = RandomTensor({c.n, c.dim}, c.dtype, Device::Cpu(), Rng());
    Tensor dtable = Tensor::Empty({c.vocab, c.dim}, DType::kF32, Device::Cpu()).value();
    Poison(dtable);
    ASSERT_TRUE(EmbeddingBackward(dout, tids, dtable, Stream::Cpu()).ok());
    ExpectSame(ToHost(dtable), TokenOrderSums(ids, ToHost(dout), c.vocab, c.dim));
    std::vector<int32_t> order, offsets;
    CpuPrepare(ids, c.vocab, &order, &offsets);
    for (int64_t v = 0; v < c.vocab; ++v) {
      for (int32_t j = offsets[size_t(v)]; j < offsets[size_t(v + 1)]; ++j) {
        EXPECT_EQ(ids[size_t(order[size_t(j)])], v);
        if (j > offsets[size_t(v)]) {
          EXPECT_LT(order[size_t(j - 1)], order[size_t(j)]);
        }
      }
    }
    EXPECT_EQ(offsets[size_t(c.vocab)], c.n);
  }
}

}  // namespace
}  // namespace sg::kernels
