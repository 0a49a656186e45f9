// CPU reference for AdamW, the gradient norm and scaling: the CUDA kernels' f32 formulas, chunks
// spread over the thread pool; the norm sums per-chunk f64 partials in chunk order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/adamw/adamw_internal.h"
#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"

namespace sg::kernels::adamw_internal {
namespace {

float GradAt(const Descriptor& d, int64_t i) {
  return d.grad_bf16 ? BFloat16{static_cast<const uint16_t*>(d.grad)[i]}.ToFloat() : static_cast<const float*>(d.grad)[i];
}

// Calls fn(descriptor, begin, end) for every chunk, chunks over the thread pool.
template <typename Fn>
void ForChunks(const Lists& l, const Fn& fn) {
  ParallelFor(l.chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Descriptor& d = l.desc[l.chunk_tensor[c]];
      const int64_t begin = (c - d.first_chunk) * l.chunk;
      fn(d, c, begin, std::min(d.numel, begin + l.chunk));
    }
  });
}

}  // namespace

void StepCpu(const Lists& l, const Hyper& h) {
  const int64_t prev = h.step_i64 ? *static_cast<const int64_t*>(h.step) : *static_cast<const int32_t*>(h.step);
  const float t = float(prev + 1);
  const float lr = *h.lr;
  const float gs = h.grad_scale != nullptr ? *h.grad_scale : 1.f;
  if (!std::isfinite(gs)) return;  // the loss scaler's overflow signal: skip the step
  const float step_size = lr / (1.f - std::pow(h.beta1, t));
  const float inv_sqrt_bc2 = 1.f / std::sqrt(1.f - std::pow(h.beta2, t));
  ForChunks(l, [&](const Descriptor& d, int64_t, int64_t begin, int64_t end) {
    const float decay = 1.f - lr * d.weight_decay;
    for (int64_t i = begin; i < end; ++i) {
      const float g = GradAt(d, i) * gs;
      const float m = h.beta1 * d.m[i] + (1.f - h.beta1) * g;
      const float v = h.beta2 * d.v[i] + (1.f - h.beta2) * g * g;
      const float p = d.param[i] * decay - step_size * m / (std::sqrt(v) * inv_sqrt_bc2 + h.eps);
      d.m[i] = m;
      d.v[i] = v;
      d.param[i] = p;
      if (d.param_copy != nullptr) d.param_copy[i] = d.copy_f16 ? Half::FromFloat(p).bits : BFloat16::FromFloat(p).bits;
    }
  });
  if (h.step_i64) {
    *static_cast<int64_t*>(const_cast<void*>(h.step)) = prev + 1;
  } else {
    *static_cast<int32_t*>(const_cast<void*>(h.step)) = int32_t(prev + 1);
  }
}

void GradNormCpu(const Lists& l, float max_norm, float* norm, float* clip) {
  std::vector<double> partial(static_cast<size_t>(l.chunks), 0.0);
  ForChunks(l, [&](const Descriptor& d, int64_t c, int64_t begin, int64_t end) {
    double s = 0;
    for (int64_t i = begin; i < end; ++i) s += double(GradAt(d, i)) * GradAt(d, i);
    partial[size_t(c)] = s;
  });
  double total = 0;
  for (double p : partial) total += p;
  *norm = float(std::sqrt(total));
  if (clip != nullptr) *clip = max_norm > 0 ? std::min(1.f, max_norm / (*norm + 1e-6f)) : 1.f;
}

void ScaleGradsCpu(const Lists& l, const float* scale) {
  const float s = *scale;
  ForChunks(l, [&](const Descriptor& d, int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (d.grad_bf16) {
        uint16_t& bits = static_cast<uint16_t*>(d.grad)[i];
        bits = BFloat16::FromFloat(BFloat16{bits}.ToFloat() * s).bits;
      } else {
        static_cast<float*>(d.grad)[i] *= s;
      }
    }
  });
}

void UpdateLossScaleCpu(const ScalerConfig& c, const ScalerValues& v) {
  const float s = *v.scale;
  const float norm = *v.norm / s;
  *v.norm = norm;
  if (!std::isfinite(norm)) {
    *v.grad_scale = NAN;
    *v.skipped = 1.f;
    *v.good_steps = 0.f;
    *v.scale = std::max(s * c.backoff, c.min_scale);
    if (v.step != nullptr) *v.step -= 1.f;
    return;
  }
  const float clip = c.max_norm > 0 ? std::min(1.f, c.max_norm / (norm + 1e-6f)) : 1.f;
  *v.grad_scale = clip / s;
  *v.skipped = 0.f;
  *v.good_steps += 1.f;
  if (*v.good_steps >= float(c.growth_interval)) {
    *v.good_steps = 0.f;
    if (std::isfinite(s * c.growth)) *v.scale = s * c.growth;
  }
}

}  // namespace sg::kernels::adamw_internal
