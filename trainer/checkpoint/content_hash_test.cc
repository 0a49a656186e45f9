#include "trainer/checkpoint/content_hash.h"

#include <cstdlib>
#include <set>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = char(testing::Rng()());
  return s;
}

TEST(ContentHashTest, StreamingEqualsOneShotForAnySplit) {
  auto& rng = testing::Rng();
  for (int trial = 0; trial < 50; ++trial) {
    const std::string data = RandomBytes(rng() % 300);
    const uint64_t whole = ContentHash(data.data(), data.size());
    ContentHasher h;
    size_t pos = 0;
    while (pos < data.size()) {
      const size_t n = std::min(data.size() - pos, size_t(rng() % 70));
      h.Update(data.data() + pos, n);
      pos += n;
    }
    EXPECT_EQ(h.Finish(), whole) << data.size();
  }
}

// Every single-bit flip, and every change of length, changes the hash.
TEST(ContentHashTest, EveryBitFlipAndLengthChangeIsDetected) {
  const std::string data = RandomBytes(517);
  const uint64_t base = ContentHash(data.data(), data.size());
  std::set<uint64_t> seen = {base};
  for (size_t i = 0; i < data.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      std::string flipped = data;
      flipped[i] = char(flipped[i] ^ (1 << b));
      EXPECT_TRUE(seen.insert(ContentHash(flipped.data(), flipped.size())).second) << i << ":" << b;
    }
  }
  const std::string zeros(64, '\0');
  std::set<uint64_t> lengths;
  for (size_t n = 0; n <= 64; ++n) EXPECT_TRUE(lengths.insert(ContentHash(zeros.data(), n)).second) << n;
}

TEST(ContentHashTest, HashFileMatchesTheBytes) {
  const std::string path = JoinPath(std::getenv("TEST_TMPDIR"), "f");
  const std::string data = RandomBytes(9 << 20);  // spans several read chunks
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  auto h = HashFile(path);
  ASSERT_TRUE(h.ok()) << h.status();
  char want[32];
  std::snprintf(want, sizeof(want), "sg64:%016llx", (unsigned long long)ContentHash(data.data(), data.size()));
  EXPECT_EQ(*h, want);
  EXPECT_EQ(HashFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sg::trainer
