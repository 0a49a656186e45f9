// Helpers for kernel tests: seeded random tensors, poisoned outputs, host copies and error norms.
//
//   absl::BitGen& rng = sg::testing::Rng();                  // seed printed; SG_TEST_SEED replays it
//   sg::Tensor x = sg::testing::RandomTensor({7, 33}, sg::DType::kBF16, device, rng);
//   sg::testing::Poison(y);                                    // NaN everywhere before the kernel
//   EXPECT_LT(sg::testing::RelativeError(ToHost(y), ref), 1e-2);
#ifndef SGTRAIN_KERNELS_CORE_TESTING_H_
#define SGTRAIN_KERNELS_CORE_TESTING_H_

#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/tensor.h"

namespace sg::testing {

// The test binary's random generator, seeded from SG_TEST_SEED or a fresh random seed that is
// printed, so a failure can be replayed.
std::mt19937_64& Rng();

// A tensor on `device` with values uniform in [-scale, scale) (rounded to its dtype), complete on
// return (usable from any stream).
Tensor RandomTensor(const Shape& shape, DType dtype, Device device, std::mt19937_64& rng,
                    float scale = 1.0f);
// Fills with NaN (floating types) or 0x7f7f... (integers), so an unwritten element is seen. On a
// device it first waits for the device's queued work, so no earlier kernel writes after it.
void Poison(const TensorView& t);
// Values as doubles on the host (copies from the device when needed, after the device's queued work:
// a kernel on any stream of this process has finished writing `t`).
std::vector<double> ToHost(const TensorView& t);
// A tensor on `device` holding `values` converted to `dtype`.
Tensor FromHost(const std::vector<double>& values, const Shape& shape, DType dtype, Device device);
// ||a - b|| / ||b|| (L2); infinity if any value of `a` is NaN or the sizes differ.
double RelativeError(const std::vector<double>& a, const std::vector<double>& b);
// max |a - b|; infinity if any value of `a` is NaN or the sizes differ.
double MaxAbsError(const std::vector<double>& a, const std::vector<double>& b);

// The median of `values` (the mean of the middle two for an even count; 0 when empty). Benchmarks
// report it next to Google Benchmark's mean of iteration times, as the PyTorch peers report medians.
double Median(std::vector<double> values);

// For benchmarks on a GPU: Hold() enqueues a kernel that spins until Release() (or `limit_s` of GPU
// time, so nothing can hang), so work enqueued in between waits and then runs back to back, with no
// host launch gaps in what the events around it measure. Create() fails on the CPU.
//
//   SG_ASSIGN_OR_RETURN(auto hold, StreamHold::Create());
//   SG_RETURN_IF_ERROR(hold->Hold(stream));
//   ... start.Record(stream); enqueue the batch; stop.Record(stream) ...
//   hold->Release();
class StreamHold {
 public:
  static absl::StatusOr<std::unique_ptr<StreamHold>> Create();
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  absl::Status Hold(const Stream& stream, double limit_s = 1.0);
  void Release();

 private:
  StreamHold() = default;
  volatile int* host_flag_ = nullptr;    // pinned, mapped
  const volatile int* device_flag_ = nullptr;
};

}  // namespace sg::testing

// Skips the current test with the reason when no CUDA device can be used.
#define SG_SKIP_WITHOUT_CUDA()                                              \
  do {                                                                      \
    if (!::sg::CudaAvailable()) GTEST_SKIP() << ::sg::CudaUnavailableReason(); \
  } while (0)

#endif  // SGTRAIN_KERNELS_CORE_TESTING_H_
