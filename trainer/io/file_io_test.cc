#include "trainer/io/file_io.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "gtest/gtest.h"

namespace sg::trainer {
namespace {

std::string TmpDir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

std::string ReadWithStream(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(FileIoTest, AtomicWriteReplacesContentsAndLeavesNoTempFile) {
  const std::string dir = JoinPath(TmpDir(), "atomic");
  ASSERT_TRUE(MakeDirectories(dir).ok());
  const std::string path = JoinPath(dir, "f.bin");
  std::mt19937 rng(std::random_device{}());
  std::string first(1000 + rng() % 1000, '\0'), second(10 + rng() % 10, '\0');
  for (char& c : first) c = char(rng());
  for (char& c : second) c = char(rng());
  ASSERT_TRUE(WriteFileAtomic(path, first).ok());
  EXPECT_EQ(ReadWithStream(path), first);
  ASSERT_TRUE(WriteFileAtomic(path, second).ok());
  EXPECT_EQ(ReadWithStream(path), second);
  auto read = ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, second);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(FileIoTest, ErrorsNameThePath) {
  auto missing = ReadFile(JoinPath(TmpDir(), "does-not-exist"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does-not-exist"), std::string::npos);

  auto dir = ReadFile(TmpDir());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos);

  const std::string big = JoinPath(TmpDir(), "big");
  ASSERT_TRUE(WriteFileAtomic(big, std::string(100, 'x')).ok());
  auto limited = ReadFile(big, 99);
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(limited.status().message().find("100 bytes"), std::string::npos) << limited.status();

  auto bad = WriteFileAtomic(JoinPath(TmpDir(), "no/such/dir/file"), "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("no/such/dir"), std::string::npos);
}

TEST(FileIoTest, UncommittedStreamingWriterLeavesThePreviousFile) {
  const std::string dir = JoinPath(TmpDir(), "stream");
  ASSERT_TRUE(MakeDirectories(dir).ok());
  const std::string path = JoinPath(dir, "f");
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append("new contents").ok());
    EXPECT_EQ((*w)->bytes_written(), 12);
    EXPECT_EQ(ReadWithStream(path), "old");  // nothing visible before Commit
  }  // dropped without Commit (as when an error stops a save)
  EXPECT_EQ(ReadWithStream(path), "old");
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  auto w = AtomicFileWriter::Open(path);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("new").ok());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ(ReadWithStream(path), "new");
  EXPECT_FALSE((*w)->Append("x").ok());
  EXPECT_FALSE((*w)->Commit().ok());
}

TEST(FileIoTest, PathHelpers) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  const std::string nested = JoinPath(TmpDir(), "x/y/z");
  ASSERT_TRUE(MakeDirectories(nested).ok());
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  ASSERT_TRUE(RemoveAll(JoinPath(TmpDir(), "x")).ok());
  EXPECT_FALSE(std::filesystem::exists(nested));
  EXPECT_TRUE(RemoveAll(JoinPath(TmpDir(), "x")).ok());
}

}  // namespace
}  // namespace sg::trainer
