// Helpers for kernel tests: seeded random tensors, poisoned outputs, host copies and error norms.
//
//   absl::BitGen& rng = sg::testing::Rng();                  // seed printed; SG_TEST_SEED replays it
//   sg::Tensor x = sg::testing::RandomTensor({7, 33}, sg::DType::kBF16, device, rng);
//   sg::testing::Poison(y);                                    // NaN everywhere before the kernel
//   EXPECT_LT(sg::testing::RelativeError(ToHost(y), ref), 1e-2);
#ifndef SGTRAIN_KERNELS_CORE_TESTING_H_
#define SGTRAIN_KERNELS_CORE_TESTING_H_

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/tensor.h"

namespace sg::testing {

// The test binary's random generator, seeded from SG_TEST_SEED or a fresh random seed that is
// printed, so a failure can be replayed.
std::mt19937_64& Rng();

// A tensor on `device` with values uniform in [-scale, scale) (rounded to its dtype).
Tensor RandomTensor(const Shape& shape, DType dtype, Device device, std::mt19937_64& rng,
                    float scale = 1.0f);
// Fills with NaN (floating types) or 0x7f7f... (integers), so an unwritten element is seen.
void Poison(const TensorView& t);
// Values as doubles on the host (copies from the device when needed).
std::vector<double> ToHost(const TensorView& t);
// A tensor on `device` holding `values` converted to `dtype`.
Tensor FromHost(const std::vector<double>& values, const Shape& shape, DType dtype, Device device);
// ||a - b|| / ||b|| (L2); infinity if any value of `a` is NaN or the sizes differ.
double RelativeError(const std::vector<double>& a, const std::vector<double>& b);
// max |a - b|; infinity if any value of `a` is NaN or the sizes differ.
double MaxAbsError(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace sg::testing

// Skips the current test with the reason when no CUDA device can be used.
#define SG_SKIP_WITHOUT_CUDA()                                              \
  do {                                                                      \
    if (!::sg::CudaAvailable()) GTEST_SKIP() << ::sg::CudaUnavailableReason(); \
  } while (0)

#endif  // SGTRAIN_KERNELS_CORE_TESTING_H_
