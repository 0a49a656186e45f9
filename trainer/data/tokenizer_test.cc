#include "trainer/data/tokenizer.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string TmpPath(const std::string& name) {
  return JoinPath(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", name);
}

TEST(ByteTokenizerTest, EveryByteStringRoundTrips) {
  ByteTokenizer tok;
  std::string text(1000, '\0');
  for (char& c : text) c = char(testing::Rng()());  // includes invalid UTF-8 and NULs
  auto ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) ASSERT_EQ((*ids)[i], int32_t(uint8_t(text[i])));
  std::vector<int32_t> with_specials = {ByteTokenizer::kBos};
  with_specials.insert(with_specials.end(), ids->begin(), ids->end());
  with_specials.push_back(ByteTokenizer::kEos);
  auto back = tok.Decode(with_specials);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  auto bad = tok.Decode({65, 258});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("id 258 at position 1 is out of range"), std::string::npos);
  EXPECT_EQ(tok.vocab_size(), 258);
}

TextCorpus SmallCorpus() {
  static const char* kWords[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and",
                                 "a",   "cat",   "sat",   "on",  "mat",   "with", "hat",  "in",  "sun"};
  TextCorpus c;
  std::mt19937_64 rng(7);  // fixed: the determinism check trains twice on the same text
  for (int d = 0; d < 200; ++d) {
    std::string text;
    for (int w = 0; w < 40; ++w) {
      text += kWords[rng() % 18];
      text += (w % 10 == 9) ? ".\n" : " ";
    }
    c.documents.push_back({"doc" + std::to_string(d), text});
  }
  return c;
}

TEST(SentencePieceTokenizerTest, TrainsLoadsAndRoundTripsUnseenText) {
  const std::string dir = TmpPath("sp");
  auto tok = SentencePieceTokenizer::Train(SmallCorpus(), 320, dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 320);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);

  // Merges learned: frequent words take fewer ids than bytes.
  auto common = (*tok)->Encode("the quick brown fox jumps over the lazy dog.");
  ASSERT_TRUE(common.ok());
  EXPECT_LT(common->size(), 25u);

  // Any text, including characters never seen in training, comes back exactly (byte fallback).
  std::string text = "Zebra! \xc3\xa9t\xc3\xa9 -- 42   spaces\n\ttab ";
  for (int i = 0; i < 50; ++i) text.push_back(char(32 + testing::Rng()() % 95));
  auto ids = (*tok)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < 320);
  auto back = (*tok)->Decode(*ids);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);

  // The saved model loads and encodes identically; training again gives the same model.
  auto loaded = SentencePieceTokenizer::Load(JoinPath(dir, "tokenizer.model"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*(*loaded)->Encode(text), *ids);
  // (The model records its training-text path, so train again in the same directory.)
  const std::string first = *ReadFile(JoinPath(dir, "tokenizer.model"));
  auto again = SentencePieceTokenizer::Train(SmallCorpus(), 320, dir);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*ReadFile(JoinPath(dir, "tokenizer.model")), first);

  auto out_of_range = (*tok)->Decode({5, 320});
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("id 320 at position 1 is out of range, expected 0..319"),
            std::string::npos) << out_of_range.status();
}

TEST(SentencePieceTokenizerTest, BadModelFilesNameTheFile) {
  auto missing = SentencePieceTokenizer::Load(TmpPath("none/tokenizer.model"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none/tokenizer.model"), std::string::npos);

  ASSERT_TRUE(WriteFileAtomic(TmpPath("garbage.model"), "this is not a protobuf \xff\xff\xff").ok());
  auto garbage = SentencePieceTokenizer::Load(TmpPath("garbage.model"));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("garbage.model': expected a SentencePiece model"), std::string::npos)
      << garbage.status();

  auto small = SentencePieceTokenizer::Train(SmallCorpus(), 100, TmpPath("sp_small"));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("vocab_size 100 is too small"), std::string::npos);
}

}  // namespace
}  // namespace sg::trainer
