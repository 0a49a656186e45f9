#include "trainer/data/token_shard.h"

#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string TmpPath(const std::string& name) {
  return JoinPath(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", name);
}

// Writes a shard the way llm.c's write_datafile does (header of 256 int32, then the tokens), with
// Python's struct module as the independent writer.
void PythonWriteShard(const std::string& path, int magic, int version, const char* code,
                      const std::vector<int32_t>& tokens) {
  std::string list;
  for (int32_t t : tokens) list += std::to_string(t) + ",";
  const std::string cmd = "python3 -c 'import struct,sys; toks=[" + list +
                          "]; h=[0]*256; h[0]=" + std::to_string(magic) + "; h[1]=" + std::to_string(version) +
                          "; h[2]=len(toks); open(sys.argv[1],\"wb\").write(struct.pack(\"<256i\",*h)+"
                          "struct.pack(\"<%d" + code + "\" % len(toks),*toks))' " + path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

std::vector<int32_t> RandomTokens(size_t n, int32_t max) {
  std::uniform_int_distribution<int32_t> dist(0, max);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = dist(testing::Rng());
  return t;
}

TEST(TokenShardTest, ReadsShardsWrittenLikeLlmc) {
  const std::vector<int32_t> gpt2 = RandomTokens(1000, 50256);
  PythonWriteShard(TmpPath("gpt2.bin"), 20240520, 1, "H", gpt2);
  auto a = ReadTokenShard(TmpPath("gpt2.bin"), 50257);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, gpt2);

  const std::vector<int32_t> llama3 = RandomTokens(777, 128255);
  PythonWriteShard(TmpPath("llama3.bin"), 20240801, 7, "I", llama3);
  auto b = ReadTokenShard(TmpPath("llama3.bin"), 128256);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, llama3);
}

TEST(TokenShardTest, RoundTripsBothWidthsAndMatchesTheLayout) {
  const std::vector<int32_t> small = RandomTokens(513, 65535);
  ASSERT_TRUE(WriteTokenShard(TmpPath("u16.bin"), small, TokenWidth::kU16).ok());
  EXPECT_EQ(*ReadTokenShard(TmpPath("u16.bin")), small);
  auto raw = ReadFile(TmpPath("u16.bin"));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 1024u + 2u * 513u);
  EXPECT_EQ(uint8_t((*raw)[1024]) | (uint8_t((*raw)[1025]) << 8), small[0]);  // little-endian

  const std::vector<int32_t> big = RandomTokens(300, INT32_MAX);
  ASSERT_TRUE(WriteTokenShard(TmpPath("u32.bin"), big, TokenWidth::kU32).ok());
  EXPECT_EQ(*ReadTokenShard(TmpPath("u32.bin")), big);
  ASSERT_TRUE(WriteTokenShard(TmpPath("empty.bin"), {}, TokenWidth::kU16).ok());
  EXPECT_TRUE(ReadTokenShard(TmpPath("empty.bin"))->empty());
}

TEST(TokenShardTest, BadShardsAreRefusedWithTheReason) {
  const std::vector<int32_t> tokens = RandomTokens(100, 255);
  ASSERT_TRUE(WriteTokenShard(TmpPath("good.bin"), tokens, TokenWidth::kU16).ok());
  const std::string good = *ReadFile(TmpPath("good.bin"));
  struct Case {
    std::string name, bytes, want;
  };
  std::string bad_magic = good;
  bad_magic[0] = 1;
  std::string bad_version = good;
  bad_version[4] = 2;
  std::string negative = good;
  negative[11] = char(0x80);
  const std::vector<Case> cases = {
      {"short", good.substr(0, 1000), "expected at least the 1024-byte header, found 1000 bytes"},
      {"magic", bad_magic, "expected (20240520, 1) for uint16 tokens or (20240801, 7) for uint32"},
      {"version", bad_version, "is (20240520, 2)"},
      {"negative", negative, "expected >= 0"},
      {"truncated", good.substr(0, good.size() - 3), "expected 1224 (header + 100 16-bit tokens): truncated?"},
      {"trailing", good + "xx", "file has 1226 bytes, expected 1224"},
  };
  for (const Case& c : cases) {
    const std::string path = TmpPath("bad_" + c.name + ".bin");
    ASSERT_TRUE(WriteFileAtomic(path, c.bytes).ok());
    auto r = ReadTokenShard(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << c.name << ": " << r.status();
  }
  std::vector<int32_t> with_big = tokens;
  with_big[42] = 300;
  ASSERT_TRUE(WriteTokenShard(TmpPath("vocab.bin"), with_big, TokenWidth::kU16).ok());
  auto r = ReadTokenShard(TmpPath("vocab.bin"), 258);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 42 is 300, expected below the vocabulary size 258"), std::string::npos)
      << r.status();

  absl::Status w = WriteTokenShard(TmpPath("w.bin"), {1, 70000}, TokenWidth::kU16);
  EXPECT_NE(w.message().find("token 1 is 70000, expected 0..65535"), std::string::npos) << w;
  EXPECT_FALSE(ReadFile(TmpPath("w.bin")).ok());
}

}  // namespace
}  // namespace sg::trainer
