#include "trainer/data/data_loader.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::trainer {
namespace {

// tokens[i] == i, so a row's first token tells which window it is.
TokenStream Iota(int64_t n) {
  auto t = std::make_shared<std::vector<int32_t>>(size_t(n));
  std::iota(t->begin(), t->end(), 0);
  return t;
}

DataLoaderOptions Options(int64_t batch, int64_t seq, int rank, int world, uint64_t seed) {
  DataLoaderOptions o;
  o.batch_size = batch;
  o.seq_len = seq;
  o.rank = rank;
  o.world_size = world;
  o.seed = seed;
  return o;
}

std::vector<int32_t> Rows(const Tensor& t) { return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel()); }

// Over one epoch, the ranks together see each window at most once, every row is a real window
// (seq_len + 1 consecutive tokens starting at a multiple of seq_len), and the unvisited windows
// number fewer than one global batch.
TEST(DataLoaderTest, RanksPartitionEachEpochIntoRealWindows) {
  auto& rng = testing::Rng();
  const int64_t seq = 3 + int64_t(rng() % 12), batch = 1 + int64_t(rng() % 4);
  const int world = 1 + int(rng() % 4);
  // At least two global batches of windows: with fewer than one Create refuses the stream (its
  // own test below), which a seed with n = 200, seq 14, batch 4 x world 4 had hit here.
  const int64_t n = std::max<int64_t>(200 + int64_t(rng() % 2000), 2 * batch * world * seq + 1);
  const uint64_t seed = rng();
  TokenStream tokens = Iota(n);
  const int64_t windows = (n - 1) / seq;
  std::vector<DataLoader> loaders;
  for (int r = 0; r < world; ++r) loaders.push_back(*DataLoader::Create(tokens, Options(batch, seq, r, world, seed)));
  ASSERT_EQ(loaders[0].num_windows(), windows);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < loaders[0].steps_per_epoch(); ++step) {
    for (int r = 0; r < world; ++r) {
      auto b = loaders[size_t(r)].Next();
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_EQ(b->shape(), (Shape{batch, seq + 1}));
      ASSERT_EQ(b->dtype(), DType::kI32);
      const std::vector<int32_t> v = Rows(*b);
      for (int64_t row = 0; row < batch; ++row) {
        const int32_t first = v[size_t(row * (seq + 1))];
        ASSERT_EQ(first % seq, 0);
        for (int64_t k = 0; k <= seq; ++k) ASSERT_EQ(v[size_t(row * (seq + 1) + k)], first + k);
        EXPECT_TRUE(seen.insert(first / seq).second) << "window " << first / seq << " twice";
      }
    }
  }
  EXPECT_GT(int64_t(seen.size()), windows - batch * world);
  EXPECT_EQ(loaders[0].position().epoch, 0);
  // The next batch starts epoch 1, whose order differs from epoch 0's (the chance that two
  // permutations of >= 14 windows agree is negligible).
  auto e1 = loaders[0].Next();
  ASSERT_TRUE(e1.ok());
  EXPECT_EQ(loaders[0].position().epoch, 1);
  DataLoader one = *DataLoader::Create(tokens, Options(1, seq, 0, 1, seed));
  std::vector<int32_t> epoch0, epoch1;
  for (int64_t i = 0; i < 2 * windows; ++i) (i < windows ? epoch0 : epoch1).push_back(Rows(*one.Next())[0]);
  EXPECT_NE(epoch0, epoch1);
  std::sort(epoch1.begin(), epoch1.end());
  for (int64_t w = 0; w < windows; ++w) EXPECT_EQ(epoch1[size_t(w)], w * seq);
}

TEST(DataLoaderTest, SameSeedSameBatchesAndShuffleOffIsStreamOrder) {
  TokenStream tokens = Iota(5000);
  DataLoader a = *DataLoader::Create(tokens, Options(4, 16, 0, 1, 42));
  DataLoader b = *DataLoader::Create(tokens, Options(4, 16, 0, 1, 42));
  DataLoader c = *DataLoader::Create(tokens, Options(4, 16, 0, 1, 43));
  bool differs = false;
  for (int i = 0; i < 20; ++i) {
    const std::vector<int32_t> ra = Rows(*a.Next());
    EXPECT_EQ(ra, Rows(*b.Next()));
    differs |= ra != Rows(*c.Next());
  }
  EXPECT_TRUE(differs);
  DataLoaderOptions o = Options(2, 16, 0, 1, 0);
  o.shuffle = false;
  DataLoader ordered = *DataLoader::Create(tokens, o);
  EXPECT_EQ(Rows(*ordered.Next())[17], 16);  // row 1 = window 1
  EXPECT_EQ(Rows(*ordered.Next())[0], 32);   // window 2
}

TEST(DataLoaderTest, SeekResumesExactlyAndAcrossWorldSizes) {
  auto& rng = testing::Rng();
  TokenStream tokens = Iota(3000);
  const uint64_t seed = rng();
  DataLoader run = *DataLoader::Create(tokens, Options(4, 8, 0, 1, seed));
  const int stop = 5 + int(rng() % 200);  // may cross an epoch boundary (93 steps per epoch)
  for (int i = 0; i < stop; ++i) ASSERT_TRUE(run.Next().ok());
  const DataPosition saved = run.position();
  DataLoader resumed = *DataLoader::Create(tokens, Options(4, 8, 0, 1, seed));
  ASSERT_TRUE(resumed.Seek(saved).ok());
  // Same global batch on 2 ranks of 2: rank 0 then rank 1 == the single rank's 4 rows.
  DataLoader r0 = *DataLoader::Create(tokens, Options(2, 8, 0, 2, seed));
  DataLoader r1 = *DataLoader::Create(tokens, Options(2, 8, 1, 2, seed));
  ASSERT_TRUE(r0.Seek(saved).ok());
  ASSERT_TRUE(r1.Seek(saved).ok());
  for (int i = 0; i < 30; ++i) {
    const std::vector<int32_t> want = Rows(*run.Next());
    EXPECT_EQ(Rows(*resumed.Next()), want) << "step " << stop + i;
    std::vector<int32_t> both = Rows(*r0.Next());
    const std::vector<int32_t> second = Rows(*r1.Next());
    both.insert(both.end(), second.begin(), second.end());
    EXPECT_EQ(both, want) << "step " << stop + i;
  }
  EXPECT_EQ(resumed.position(), run.position());
  absl::Status bad = resumed.Seek({0, 100000});
  EXPECT_NE(bad.message().find("outside the stream's 374 windows"), std::string::npos) << bad;
}

TEST(DataLoaderTest, BadOptionsAreExplained) {
  auto small = DataLoader::Create(Iota(100), Options(4, 32, 0, 2, 0));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("100 tokens = 3 windows of seq_len + 1 = 33, fewer than one global batch "
                                          "of 8 (batch_size 4 x world_size 2)"),
            std::string::npos) << small.status();
  auto rank = DataLoader::Create(Iota(1000), Options(1, 8, 2, 2, 0));
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.status().message().find("rank 2 is not in [0, world_size = 2)"), std::string::npos);
}

TEST(TokenizeCorpusTest, WrapsDocumentsAndSendsEveryKthChunkToValidation) {
  TextCorpus corpus;
  auto& rng = testing::Rng();
  std::vector<int32_t> stream;  // BOS + bytes + EOS per document, the independent expectation
  for (int i = 0; i < 40; ++i) {
    std::string text(size_t(200 + rng() % 300), ' ');
    for (char& c : text) c = char('a' + rng() % 26);
    corpus.documents.push_back({"d", text});
    stream.push_back(256);
    for (char c : text) stream.push_back(int32_t(uint8_t(c)));
    stream.push_back(257);
  }
  ByteTokenizer bytes;
  auto split = TokenizeCorpus(corpus, bytes, 0.1);
  ASSERT_TRUE(split.ok()) << split.status();
  // ~14k tokens: at least 10 chunks of kValChunkTokens do not fit, so chunks are n / 10 tokens.
  const int64_t n = int64_t(stream.size()), chunk = std::min<int64_t>(kValChunkTokens, n / 10);
  std::vector<int32_t> want_train, want_val;
  for (int64_t i = 0; i < n; ++i) ((i / chunk) % 10 == 9 ? want_val : want_train).push_back(stream[size_t(i)]);
  EXPECT_EQ(*split->train, want_train);
  EXPECT_EQ(*split->val, want_val);
  EXPECT_FALSE(TokenizeCorpus(corpus, bytes, 0.9).ok());
  auto all_train = TokenizeCorpus(corpus, bytes, 0.0);
  ASSERT_TRUE(all_train.ok()) << all_train.status();
  EXPECT_EQ(*all_train->train, stream);
  EXPECT_TRUE(all_train->val->empty());
  TextCorpus one;
  one.documents.push_back({"d", "x"});
  auto tiny = TokenizeCorpus(one, bytes, 0.1);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("too few for a validation split"), std::string::npos) << tiny.status();
}

// The GPU machine's default corpus is a handful of license files: a few long documents must still
// give a validation split that holds whole batches, the same one on every call.
TEST(TokenizeCorpusTest, FewLongDocumentsSplitForValidation) {
  TextCorpus corpus;
  auto& rng = testing::Rng();
  for (int i = 0; i < 3; ++i) {
    std::string text(size_t(30000 + rng() % 5000), ' ');
    for (char& c : text) c = char('a' + rng() % 26);
    corpus.documents.push_back({"license" + std::to_string(i), text});
  }
  ByteTokenizer bytes;
  auto split = TokenizeCorpus(corpus, bytes, 0.05);
  ASSERT_TRUE(split.ok()) << split.status();
  const int64_t n = int64_t(split->train->size() + split->val->size());
  EXPECT_EQ(n, int64_t(corpus.total_bytes()) + 6);
  EXPECT_NEAR(double(split->val->size()) / double(n), 0.05, 0.02);
  auto again = TokenizeCorpus(corpus, bytes, 0.05);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again->val, *split->val);
  EXPECT_EQ(*again->train, *split->train);
  auto val = DataLoader::Create(split->val, Options(8, 128, 0, 1, 0));
  ASSERT_TRUE(val.ok()) << val.status();
  auto batch = val->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->shape(), Shape({8, 129}));
  auto train = DataLoader::Create(split->train, Options(8, 128, 0, 1, 0));
  ASSERT_TRUE(train.ok()) << train.status();
}

}  // namespace
}  // namespace sg::trainer
