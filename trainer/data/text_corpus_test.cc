#include "trainer/data/text_corpus.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string TmpPath(const std::string& name) {
  return JoinPath(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", name);
}

std::string RandomText(size_t n) {
  static const char kChars[] = "abcdefghij klmnop\nqrstuvwxyz.,";
  std::string s(n, ' ');
  for (char& c : s) c = kChars[testing::Rng()() % (sizeof(kChars) - 1)];
  return s;
}

TEST(TextCorpusTest, LoadsFilesAndDirectoriesInSortedOrder) {
  const std::string dir = TmpPath("texts");
  ASSERT_TRUE(MakeDirectories(JoinPath(dir, "sub")).ok());
  ASSERT_TRUE(MakeDirectories(JoinPath(dir, ".git")).ok());
  const std::string a = RandomText(100), b = RandomText(200), c = RandomText(50), single = RandomText(10);
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, "b.txt"), b).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, "a.txt"), a).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, "sub/c.txt"), c).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, ".git/HEAD"), "\0binary").ok());  // hidden: skipped
  ASSERT_TRUE(WriteFileAtomic(TmpPath("single.txt"), single).ok());
  auto corpus = LoadTextFiles({dir, TmpPath("single.txt")});
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  ASSERT_EQ(corpus->documents.size(), 4u);
  EXPECT_EQ(corpus->documents[0].text, a);
  EXPECT_EQ(corpus->documents[1].text, b);
  EXPECT_EQ(corpus->documents[2].text, c);
  EXPECT_EQ(corpus->documents[3].text, single);
  EXPECT_EQ(corpus->documents[2].source, JoinPath(dir, "sub/c.txt"));
  EXPECT_EQ(corpus->total_bytes(), 360);
  EXPECT_NE(corpus->description.find("4 text file(s)"), std::string::npos) << corpus->description;
}

TEST(TextCorpusTest, BadInputNamesThePath) {
  ASSERT_TRUE(WriteFileAtomic(TmpPath("bin.dat"), std::string("text\0more", 9)).ok());
  auto bin = LoadTextFiles({TmpPath("bin.dat")});
  ASSERT_FALSE(bin.ok());
  EXPECT_NE(bin.status().message().find("bin.dat': expected text, found binary data (a NUL byte at offset 4)"),
            std::string::npos) << bin.status();

  ASSERT_TRUE(WriteFileAtomic(TmpPath("empty.txt"), "").ok());
  auto empty = LoadTextFiles({TmpPath("empty.txt")});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty.txt' is empty"), std::string::npos) << empty.status();

  auto missing = LoadTextFiles({TmpPath("nope.txt")});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.txt"), std::string::npos);

  ASSERT_TRUE(MakeDirectories(TmpPath("emptydir")).ok());
  auto emptydir = LoadTextFiles({TmpPath("emptydir")});
  ASSERT_FALSE(emptydir.ok());
  EXPECT_NE(emptydir.status().message().find("holds no files"), std::string::npos);
  EXPECT_FALSE(LoadTextFiles({}).ok());
}

TEST(TextCorpusTest, SplitsFortuneFiles) {
  const std::string text = "First one,\ntwo lines.\n%\nSecond -- with 100% certainty.\n%\n%\nThird\n\tindented\n%\n";
  const std::vector<std::string> parts = SplitFortunes(text);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], "First one,\ntwo lines.\n");
  EXPECT_EQ(parts[1], "Second -- with 100% certainty.\n");
  EXPECT_EQ(parts[2], "Third\n\tindented\n");
  EXPECT_EQ(SplitFortunes("no separator").size(), 1u);
}

TEST(TextCorpusTest, LoadsAFortuneDirectorySkippingIndexesAndLinks) {
  const std::string dir = TmpPath("fortunes");
  ASSERT_TRUE(MakeDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, "wisdom"), "A.\n%\nB.\n").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, "art"), "C.\n").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, "art.dat"), std::string("\0\0\x02", 3)).ok());
  ASSERT_EQ(::symlink("art", JoinPath(dir, "art.u8").c_str()), 0);
  auto c = LoadFortunes(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->documents.size(), 3u);
  EXPECT_EQ(c->documents[0].text, "C.\n");
  EXPECT_EQ(c->documents[1].text, "A.\n");
  EXPECT_EQ(c->documents[2].source, JoinPath(dir, "wisdom#1"));

  auto missing = LoadFortunes(TmpPath("no-fortunes"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("apt-get install -y fortunes"), std::string::npos) << missing.status();
}

// The real default corpus: the fortunes when README's set-up installed them, else the licenses.
TEST(TextCorpusTest, DefaultCorpusIsRealEnglishText) {
  auto c = LoadDefaultCorpus();
  ASSERT_TRUE(c.ok()) << c.status();
  std::cerr << "default corpus: " << c->description << "\n";
  if (std::filesystem::is_directory(kDefaultCorpusDir)) {
    EXPECT_GT(c->documents.size(), 10000u);
    EXPECT_GT(c->total_bytes(), 2'000'000);
    EXPECT_NE(c->description.find("fortunes"), std::string::npos);
  } else {
    EXPECT_GT(c->total_bytes(), 100'000);
    EXPECT_NE(c->description.find("install Debian's 'fortunes'"), std::string::npos);
  }
  int64_t letters = 0;
  for (const TextDocument& d : c->documents) {
    for (char ch : d.text) letters += (ch >= 'a' && ch <= 'z') || ch == ' ';
  }
  EXPECT_GT(double(letters) / double(c->total_bytes()), 0.7);  // mostly lower-case prose
}

}  // namespace
}  // namespace sg::trainer
