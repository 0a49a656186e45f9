// The toy trainer's update rule (toy_trainer_main.cc), shared with its tests as the single-process
// reference. Gradients are small integers, so their all-reduced sum is exact in f32 for any world
// size; the update is elementwise, so the state does not depend on how P is sharded.
//
//   std::vector<float> want = ToyExpectedState(/*steps=*/30, /*size=*/1000, /*samples=*/24);
#ifndef SGTRAIN_TRAINER_ELASTIC_TOY_MODEL_H_
#define SGTRAIN_TRAINER_ELASTIC_TOY_MODEL_H_

#include <cstdint>
#include <vector>

namespace sg::trainer {

inline float ToyInit(int64_t i) { return float((i * 37) % 101) / 64.0f - 0.75f; }

// Rank `rank`'s partial gradient of step `t` (all `size` elements): the sum over its samples
// (k % world == rank) of an integer in [-8, 8].
inline void ToyGradient(int64_t t, int64_t samples, int rank, int world, float* g, int64_t size) {
  for (int64_t i = 0; i < size; ++i) g[i] = 0.0f;
  for (int64_t k = rank; k < samples; k += world) {
    for (int64_t i = 0; i < size; ++i) g[i] += float((t * 131 + k * 31 + i * 7) % 17) - 8.0f;
  }
}

inline void ToyUpdate(float* p, const float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = 0.875f * p[i] + g[i] * (1.0f / 1024.0f);
}

// P after `steps` steps, computed in one process.
inline std::vector<float> ToyExpectedState(int64_t steps, int64_t size, int64_t samples) {
  std::vector<float> p(static_cast<size_t>(size)), g(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) p[size_t(i)] = ToyInit(i);
  for (int64_t t = 1; t <= steps; ++t) {
    ToyGradient(t, samples, 0, 1, g.data(), size);
    ToyUpdate(p.data(), g.data(), size);
  }
  return p;
}

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_ELASTIC_TOY_MODEL_H_
