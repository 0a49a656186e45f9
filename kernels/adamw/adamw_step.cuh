// Device code of adamw.cu's AdamW kernel: the per-call step constants and the per-element update,
// with each rounding spelled out (__fmul_rn, __fmaf_rn, ... are never contracted or reassociated
// by nvcc or ptxas), so the bits written do not depend on how a kernel orders its loads, stores
// and math: the vector and the scalar paths agree, and a change of memory schedule cannot change
// results.
//
//   const StepConsts c = LoadConsts(h);
//   const float decay = Decay(c, d.weight_decay);
//   UpdateElement(c, decay, g, m, v, p);  // m, v, p updated in registers
#ifndef SGTRAIN_KERNELS_ADAMW_ADAMW_STEP_CUH_
#define SGTRAIN_KERNELS_ADAMW_ADAMW_STEP_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/adamw/adamw_internal.h"

namespace sg::kernels::adamw_internal {

struct StepConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, lr, grad_scale, step_size, inv_sqrt_bc2;
};

// t = *step + 1; step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t).
__device__ __forceinline__ StepConsts LoadConsts(const Hyper& h) {
  const int64_t prev = h.step_i64 ? *static_cast<const int64_t*>(h.step) : *static_cast<const int32_t*>(h.step);
  const float t = float(prev + 1);
  StepConsts c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta1 = __fsub_rn(1.f, h.beta1);
  c.one_minus_beta2 = __fsub_rn(1.f, h.beta2);
  c.eps = h.eps;
  c.lr = *h.lr;
  c.grad_scale = h.grad_scale != nullptr ? *h.grad_scale : 1.f;
  c.step_size = __fdiv_rn(c.lr, __fsub_rn(1.f, powf(h.beta1, t)));
  c.inv_sqrt_bc2 = __fdiv_rn(1.f, __fsqrt_rn(__fsub_rn(1.f, powf(h.beta2, t))));
  return c;
}

// The decoupled weight decay factor 1 - lr wd, one rounding.
__device__ __forceinline__ float Decay(const StepConsts& c, float weight_decay) {
  return __fmaf_rn(-c.lr, weight_decay, 1.f);
}

// One element, in the order nvcc had contracted the plain expressions (adamw.h's formula):
//   g' = g s;  m = fma(b1, m, (1 - b1) g');  v = fma(g', (1 - b2) g', b2 v);
//   p = fma(p, decay, -(step_size m) / fma(sqrt(v), inv_sqrt_bc2, eps)).
__device__ __forceinline__ void UpdateElement(const StepConsts& c, float decay, float g, float& m, float& v,
                                              float& p) {
  const float gs = __fmul_rn(g, c.grad_scale);
  m = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, gs));
  v = __fmaf_rn(gs, __fmul_rn(c.one_minus_beta2, gs), __fmul_rn(c.beta2, v));
  const float denom = __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bc2, c.eps);
  p = __fmaf_rn(p, decay, -__fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

}  // namespace sg::kernels::adamw_internal

#endif  // SGTRAIN_KERNELS_ADAMW_ADAMW_STEP_CUH_
