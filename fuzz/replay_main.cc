// The corpus-replay test for one fuzz entry point (see replay.h).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "fuzz/replay.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

#ifndef SG_FUZZ_CORPUS
#error "SG_FUZZ_CORPUS must name the corpus directory (relative to the workspace)"
#endif

namespace {

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Saved before running, so a crash leaves the input behind.
void Stash(const std::string& input) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  std::ofstream f(std::string(dir ? dir : "/tmp") + "/last_fuzz_input", std::ios::binary | std::ios::trunc);
  f.write(input.data(), std::streamsize(input.size()));
}

void RunOne(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// One of the mutations libFuzzer also makes: bit flips, interesting bytes, insertions, deletions,
// duplicated or spliced chunks, truncation.
std::string Mutate(std::string s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  const int rounds = 1 + int(rng() % 4);
  for (int k = 0; k < rounds; ++k) {
    const size_t n = s.size();
    auto pos = [&](size_t bound) { return bound == 0 ? 0 : size_t(rng() % bound); };
    switch (rng() % 7) {
      case 0:
        if (n) s[pos(n)] ^= char(1 << (rng() % 8));
        break;
      case 1: {
        static const unsigned char kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, '"', '[', '{', '%', '-', '9'};
        if (n) s[pos(n)] = char(kInteresting[rng() % sizeof(kInteresting)]);
        break;
      }
      case 2:
        s.insert(pos(n + 1), 1, char(rng()));
        break;
      case 3:
        if (n) s.erase(pos(n), 1 + pos(std::min<size_t>(n, 16)));
        break;
      case 4:
        if (n) {
          size_t a = pos(n), len = 1 + pos(std::min<size_t>(n - a, 64));
          s.insert(pos(n + 1), s.substr(a, len));
        }
        break;
      case 5: {
        const std::string& o = corpus[pos(corpus.size())];
        if (!o.empty()) s = s.substr(0, pos(n + 1)) + o.substr(pos(o.size()));
        break;
      }
      default:
        s.resize(pos(n + 1));
        break;
    }
    if (s.size() > (1 << 20)) s.resize(1 << 20);
  }
  return s;
}

TEST(FuzzReplay, CorpusAndMutations) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(SG_FUZZ_CORPUS)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << "empty corpus " << SG_FUZZ_CORPUS;
  std::vector<std::string> corpus;
  for (const auto& f : files) {
    corpus.push_back(ReadAll(f));
    Stash(corpus.back());
    RunOne(corpus.back());
  }
  RunOne("");
  const char* secs = std::getenv("SG_FUZZ_REPLAY_SECONDS");
  const absl::Time end = absl::Now() + absl::Seconds(secs ? std::atof(secs) : 3.0);
  std::mt19937_64& rng = sg::testing::Rng();
  int64_t runs = 0;
  while (absl::Now() < end) {
    std::string input = Mutate(corpus[rng() % corpus.size()], corpus, rng);
    Stash(input);
    RunOne(input);
    ++runs;
  }
  std::cout << files.size() << " corpus files and " << runs << " mutations ran\n";
}

}  // namespace
