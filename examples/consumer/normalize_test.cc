// Normalizes rows with sgtrain's RMSNorm and checks each output row's root-mean-square is 1.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/rmsnorm/rmsnorm.h"

TEST(ConsumerTest, RowsHaveUnitRms) {
  const int64_t rows = 5, dim = 300;
  auto x = sg::Tensor::Empty({rows, dim}, sg::DType::kF32, sg::Device::Cpu()).value();
  auto w = sg::Tensor::Empty({dim}, sg::DType::kF32, sg::Device::Cpu()).value();
  auto y = sg::Tensor::Empty({rows, dim}, sg::DType::kF32, sg::Device::Cpu()).value();
  auto rstd = sg::Tensor::Empty({rows}, sg::DType::kF32, sg::Device::Cpu()).value();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.f, 3.f);
  for (int64_t i = 0; i < rows * dim; ++i) x.data<float>()[i] = n(rng);
  for (int64_t i = 0; i < dim; ++i) w.data<float>()[i] = 1.f;
  ASSERT_TRUE(sg::kernels::RmsNormForward(x, w, 0.f, y, rstd, sg::Stream::Cpu()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(y.data<float>()[r * dim + i]) * y.data<float>()[r * dim + i];
    EXPECT_NEAR(std::sqrt(ss / dim), 1.0, 1e-5) << "row " << r;
  }
}
