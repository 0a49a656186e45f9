// The embedded tables against the JSON file they are built from (read from the runfiles, parsed on
// its own), and what every shipped choice must be: an H200 cuBLASLt algorithm (64 bytes) chosen by
// the energy meter, no costlier than the fastest candidate it was ranked against.
#include "kernels/gemm/shipped_tuning.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace sg::kernels {
namespace {

std::string ReadRunfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::ifstream in(std::string(srcdir != nullptr ? srcdir : ".") + "/" + (workspace != nullptr ? workspace : "") + "/" +
                   path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ShippedGemmTuning, IsTheFileItIsBuiltFrom) {
  const std::string text = ReadRunfile("kernels/gemm/tuned/nvidia_h200.json");
  ASSERT_FALSE(text.empty()) << "kernels/gemm/tuned/nvidia_h200.json not in the runfiles";
  absl::StatusOr<autotune::TuningTable> file = autotune::TuningTable::Parse(text);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<autotune::TuningTable> shipped = ShippedGemmTuning();
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_GT(shipped->size(), 0u);
  EXPECT_EQ(shipped->Serialize(), file->Serialize());
}

TEST(ShippedGemmTuning, EveryChoiceIsAnEnergyRankedH200Algorithm) {
  absl::StatusOr<autotune::TuningTable> shipped = ShippedGemmTuning();
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  for (const auto& [key, c] : shipped->entries()) {
    SCOPED_TRACE(key.problem);
    EXPECT_EQ(key.kernel, "gemm.cublaslt");
    EXPECT_EQ(key.device, "NVIDIA H200");
    EXPECT_EQ(key.library.rfind("cublasLt ", 0), 0u) << key.library;
    EXPECT_EQ(c.variant.size(), 64u) << "sizeof(cublasLtMatmulAlgo_t)";
    EXPECT_GT(c.microseconds, 0);
    EXPECT_GE(c.candidates, 1);
    EXPECT_EQ(c.cost_unit, "J");
    EXPECT_GT(c.cost, 0);
    EXPECT_LE(c.cost, c.fastest_cost);
    // At most the 700 W limit, with the counter's slack: joules a call over its time.
    EXPECT_LT(c.cost / (c.microseconds * 1e-6), 1.3 * 700) << c.cost << " J in " << c.microseconds << " us";
  }
}

}  // namespace
}  // namespace sg::kernels
