// CUDA fused cross-entropy, three launches on one stream, no host synchronization:
//   1. CountKernel: valid = number of targets != ignore_index (one block, __syncthreads_count);
//   2. a row kernel, one block of kThreads per token row:
//      RegisterRowKernel (the row fits kK <= 8 16-byte packs per thread): the row is loaded into registers
//        once, reduced to (max, sum-exp) per thread and across the block, and dlogits are written
//        from the registers: exactly one HBM read and one write per logit (RegisterRowKernelV1, the
//        first version with twice the ALU work per logit, stays selectable by SG_CE_KERNEL until
//        the GPU run compares them);
//      ChunkedRowKernel (longer or unaligned rows): an online max/sum-exp sweep over the row, then a
//        second sweep (mostly L2 hits) writing dlogits;
//      both write the row's loss to a scratch f32 [rows];
//      or, selected by SG_CE_KERNEL=ring|ring2|ring512 (replacing launches 1 and 2 where the row
//      fits), RingRowKernel: persistent CTAs streaming rows through a shared-memory ring;
//   3. FinishKernel: loss = sum of row losses in a fixed order (f64) / valid: deterministic.
// The target logit is read before the block's first barrier, so dlogits may overwrite logits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/cross_entropy/cross_entropy_internal.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::cross_entropy_internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// 8 packs of 16 bytes per thread keeps RegisterRowKernel within 64 registers, so two 512-thread
// blocks share an SM and one block's loads overlap the other's reduction and stores. Capacity:
// 512 * 8 * 8 = 32768 bf16 logits (Llama-2's 32000) or 16384 f32 per row.
constexpr int kMaxPacksPerThread = 8;
constexpr float kLog2e = 1.4426950408889634f;

// 16 bytes of T <-> kE floats.
template <typename T> struct Raw16;
template <> struct Raw16<float> {
  static constexpr int kE = 4;
  __device__ static void Unpack(const uint4& r, float (&f)[kE]) {
    f[0] = __uint_as_float(r.x); f[1] = __uint_as_float(r.y); f[2] = __uint_as_float(r.z); f[3] = __uint_as_float(r.w);
  }
  __device__ static uint4 Pack(const float (&f)[kE]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
};
template <> struct Raw16<__nv_bfloat16> {
  static constexpr int kE = 8;
  __device__ static void Unpack(const uint4& r, float (&f)[kE]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __bfloat1622float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
  __device__ static uint4 Pack(const float (&f)[kE]) {
    uint4 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    return r;
  }
};
template <> struct Raw16<__half> {
  static constexpr int kE = 8;
  __device__ static void Unpack(const uint4& r, float (&f)[kE]) {
    const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __half22float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
  __device__ static uint4 Pack(const float (&f)[kE]) {
    uint4 r;
    __half2* h = reinterpret_cast<__half2*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
    return r;
  }
};

// (m, s) <- the pair for the union: max, and sum of exp relative to that max.
__device__ __forceinline__ void Merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * exp2f((m - mx) * kLog2e) + s2 * exp2f((m2 - mx) * kLog2e);
  m = mx;
}

// Combines every thread's (m, s); all threads return the block's pair. Ends with a barrier, so
// shared memory written before the call is visible after it.
template <int kW = kWarps>
__device__ void BlockMerge(float& m, float& s, float* sm_m, float* sm_s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    Merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();
  m = -INFINITY;
  s = 0.f;
  for (int w = 0; w < kW; ++w) Merge(m, s, sm_m[w], sm_s[w]);
}

struct RowInfo {
  int64_t target;
  bool ignored, bad;
};

template <typename I>
__device__ __forceinline__ RowInfo InfoFor(const I* targets, int64_t row, int64_t vocab, int64_t ignore) {
  const int64_t t = int64_t(targets[row]);
  const bool ignored = t == ignore;
  return RowInfo{t, ignored, !ignored && (t < 0 || t >= vocab)};
}

// Row epilogue shared by both row kernels: the row's loss (thread 0) and the gradient scale.
__device__ __forceinline__ float FinishRow(const RowInfo& info, float lse, float target_logit, float* row_loss,
                                           int64_t row, const int32_t* valid, float grad_scale,
                                           const float* grad_scale_from) {
  if (threadIdx.x == 0) row_loss[row] = info.ignored ? 0.f : info.bad ? NAN : lse - target_logit;
  const int32_t count = *valid;
  if (grad_scale_from != nullptr) grad_scale *= *grad_scale_from;
  return info.ignored || count == 0 ? 0.f : grad_scale / float(count);
}

template <typename T, typename I, int kK>
__global__ void __launch_bounds__(kThreads, 2)
    RegisterRowKernelV1(const T* logits, const I* __restrict__ targets, T* dlogits, float* __restrict__ row_loss,
                      const int32_t* __restrict__ valid, int64_t vocab, int64_t ignore, float grad_scale,
                      const float* __restrict__ grad_scale_from) {
  using R = Raw16<T>;
  constexpr int kE = R::kE;
  __shared__ float sm_m[kWarps], sm_s[kWarps], sm_target;
  const int64_t row = blockIdx.x;
  const int packs = int(vocab / kE);  // 32-bit indices inside the row: fewer registers
  const T* x = logits + row * vocab;
  const RowInfo info = InfoFor(targets, row, vocab, ignore);
  uint4 raw[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int p = int(threadIdx.x) + j * kThreads;
    if (p < packs) raw[j] = reinterpret_cast<const uint4*>(x)[p];
  }
  if (threadIdx.x == 0) sm_target = info.ignored || info.bad ? 0.f : cuda_vec::ToF(x[info.target]);
  // Online (max, sum-exp) pack by pack, so each pack's unpacked floats die at once (a two-pass
  // max-then-sum kept all of them live and spilled at 64 registers).
  float m = -INFINITY, s = 0.f;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    if (int(threadIdx.x) + j * kThreads < packs) {
      float f[kE];
      R::Unpack(raw[j], f);
      float cm = f[0];
#pragma unroll
      for (int k = 1; k < kE; ++k) cm = fmaxf(cm, f[k]);
      const float cm_scaled = cm * kLog2e;
      float cs = 0.f;
#pragma unroll
      for (int k = 0; k < kE; ++k) cs += exp2f(fmaf(f[k], kLog2e, -cm_scaled));
      Merge(m, s, cm, cs);
    }
  }
  BlockMerge(m, s, sm_m, sm_s);
  const float lse = m + logf(s);
  const float scale = FinishRow(info, lse, sm_target, row_loss, row, valid, grad_scale, grad_scale_from);
  if (dlogits == nullptr) return;
  const float lse_scaled = lse * kLog2e;
  const int target = info.ignored || info.bad ? -1 : int(info.target);
  uint4* out = reinterpret_cast<uint4*>(dlogits + row * vocab);
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int p = int(threadIdx.x) + j * kThreads;
    if (p < packs) {
      float f[kE];
      R::Unpack(raw[j], f);
#pragma unroll
      for (int k = 0; k < kE; ++k) {
        const float onehot = p * kE + k == target ? 1.f : 0.f;
        f[k] = (exp2f(fmaf(f[k], kLog2e, -lse_scaled)) - onehot) * scale;
      }
      out[p] = R::Pack(f);
    }
  }
}

// ex2.approx with denormal results flushed to zero: one MUFU op (exp2f adds range fix-ups for
// denormals, about three ALU ops per logit). Probabilities below 2^-126 become 0, far under bf16's
// and f32's resolution of a softmax gradient.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The row in registers as in RegisterRowKernelV1, with about half the ALU work per logit (V1 was
// ALU-bound next to its HBM traffic at 2.29 TB/s: ~18 ALU ops per logit): the thread's max first,
// then one exp per logit against it (no per-pack merges), flush-to-zero exp2, and the one-hot
// correction applied only in the pack that holds the target instead of a compare per logit. The
// raw packs are unpacked again in each pass (cheap) so the floats never all live at once.
template <typename T, typename I, int kK>
__global__ void __launch_bounds__(kThreads, 2)
    RegisterRowKernel(const T* logits, const I* __restrict__ targets, T* dlogits, float* __restrict__ row_loss,
                      const int32_t* __restrict__ valid, int64_t vocab, int64_t ignore, float grad_scale,
                      const float* __restrict__ grad_scale_from) {
  using R = Raw16<T>;
  constexpr int kE = R::kE;
  // With 8 packs a thread, 4 go to shared memory (cp.async, no registers while in flight) and 4 stay
  // in registers: all 8 in registers needs 80 registers, and the 64 that two CTAs per SM allow
  // spilled (V1 too). 32 KiB per CTA.
  constexpr int kInSmem = kK == 8 ? 4 : 0;
  constexpr int kInRegs = kK - kInSmem;
  __shared__ uint4 sm_row[kInSmem > 0 ? kInSmem : 1][kThreads];
  __shared__ float sm_m[kWarps], sm_s[kWarps], sm_target;
  // Thread 0 alone reads the target (its row info reaches the others through shared memory after
  // BlockMerge's barrier): fewer registers live while the row's loads are in flight (zero spills).
  __shared__ int sm_target_index, sm_ignored;
  const int64_t row = blockIdx.x;
  const int packs = int(vocab / kE);
  const T* x = logits + row * vocab;
  uint4 raw[kInRegs];
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int p = int(threadIdx.x) + j * kThreads;
    if (p < packs) {
      if (j < kInRegs) {
        raw[j < kInRegs ? j : 0] = reinterpret_cast<const uint4*>(x)[p];
      } else {
        const unsigned dst = unsigned(__cvta_generic_to_shared(&sm_row[j - kInRegs][threadIdx.x]));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(reinterpret_cast<const uint4*>(x) + p)
                     : "memory");
      }
    }
  }
  if constexpr (kInSmem > 0) {
    // Each thread reads back only its own slots: waiting for its own copies is enough.
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  }
  // Pack j of this thread (j a compile-time index after unrolling).
  auto pack = [&](int j) -> uint4 { return j < kInRegs ? raw[j < kInRegs ? j : 0] : sm_row[j - kInRegs][threadIdx.x]; };
  if (threadIdx.x == 0) {
    const RowInfo info = InfoFor(targets, row, vocab, ignore);
    const bool has_target = !info.ignored && !info.bad;
    const float target_logit = has_target ? cuda_vec::ToF(x[info.target]) : 0.f;
    sm_target = target_logit;
    sm_target_index = has_target ? int(info.target) : -1;
    sm_ignored = info.ignored;
  }
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    if (int(threadIdx.x) + j * kThreads < packs) {
      float f[kE];
      R::Unpack(pack(j), f);
#pragma unroll
      for (int k = 0; k < kE; ++k) m = fmaxf(m, f[k]);
    }
  }
  float s = 0.f;
  if (m != -INFINITY) {
    const float m_scaled = m * kLog2e;
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (int(threadIdx.x) + j * kThreads < packs) {
        float f[kE];
        R::Unpack(pack(j), f);
#pragma unroll
        for (int k = 0; k < kE; ++k) s += Exp2Ftz(fmaf(f[k], kLog2e, -m_scaled));
      }
    }
  }
  BlockMerge(m, s, sm_m, sm_s);  // ends with a barrier: sm_target* are visible
  const float lse = m + logf(s);
  const int target = sm_target_index;
  const bool ignored = sm_ignored != 0;
  if (threadIdx.x == 0) row_loss[row] = ignored ? 0.f : target < 0 ? NAN : lse - sm_target;  // < 0: bad target
  const int32_t count = *valid;
  if (grad_scale_from != nullptr) grad_scale *= *grad_scale_from;
  const float scale = ignored || count == 0 ? 0.f : grad_scale / float(count);
  if (dlogits == nullptr) return;
  const float lse_scaled = lse * kLog2e;
  const int target_pack = target < 0 ? -1 : target / kE;
  uint4* out = reinterpret_cast<uint4*>(dlogits + row * vocab);
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int p = int(threadIdx.x) + j * kThreads;
    if (p < packs) {
      float f[kE];
      R::Unpack(pack(j), f);
#pragma unroll
      for (int k = 0; k < kE; ++k) f[k] = Exp2Ftz(fmaf(f[k], kLog2e, -lse_scaled));
      if (p == target_pack) {
#pragma unroll
        for (int k = 0; k < kE; ++k) f[k] -= p * kE + k == target ? 1.f : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kE; ++k) f[k] *= scale;
      out[p] = R::Pack(f);
    }
  }
}

// Valid targets (!= ignore) of all rows, by every thread of a kT-thread block; all threads return
// the total. Loads are independent (no barrier between them) so they overlap.
template <typename I, int kT>
__device__ int BlockCountValid(const I* targets, int64_t rows, int64_t ignore, int* sm_count) {
  int c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kT) c += int64_t(targets[r]) != ignore;
  c = __reduce_add_sync(0xffffffffu, c);
  if (threadIdx.x % 32 == 0) sm_count[threadIdx.x / 32] = c;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < kT / 32; ++w) total += sm_count[w];
  return total;
}

// "ring" (RingRowKernel): persistent, one kT-thread CTA per SM taking rows blockIdx.x,
// blockIdx.x + gridDim.x, ...; each row is copied whole into a shared-memory ring of kStages row
// buffers by cp.async, kStages - 1 rows ahead of the one being reduced, so an SM always has one or
// two rows (64-128 KB at vocab 32000 bf16) of HBM reads in flight, including while it reduces and
// writes (the register kernel's two rows per SM load, then reduce, then store, with no reads in
// flight in between). Per logit one exp: pass 1 takes the thread's max m_t from shared memory,
// pass 2 keeps e = exp(x - m_t) in registers (kK packs: 32 floats at kT 1024) and sums it; after
// the block merge dlogits = e * exp(m_t - lse) * scale, written from the registers. Each CTA
// counts the valid targets itself while its first rows load (no count launch); CTA 0 stores the
// count. The target logit is read from the ring, so dlogits may overwrite logits.
template <typename T, typename I, int kT, int kK, int kStages>
__global__ void __launch_bounds__(kT, 1)
    RingRowKernel(const T* logits, const I* __restrict__ targets, T* dlogits, float* __restrict__ row_loss,
                  int32_t* __restrict__ valid, int64_t rows, int64_t vocab, int64_t ignore, float grad_scale,
                  const float* __restrict__ grad_scale_from) {
  using R = Raw16<T>;
  constexpr int kE = R::kE;
  constexpr int kW = kT / 32;
  extern __shared__ uint4 ring[];  // kStages x packs
  __shared__ float sm_m[kW], sm_s[kW];
  __shared__ int sm_count[kW];
  const int packs = int(vocab / kE);
  const int64_t n = rows > int64_t(blockIdx.x) ? (rows - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  // Copies the CTA's row i (if any) into its stage, and closes a commit group (empty past the
  // last row, so that the group count per iteration stays fixed).
  auto issue = [&](int64_t i) {
    if (i < n) {
      const uint4* src = reinterpret_cast<const uint4*>(logits + (blockIdx.x + i * gridDim.x) * vocab);
      uint4* dst = ring + int(i % kStages) * packs;
      for (int p = threadIdx.x; p < packs; p += kT) {
        const unsigned d = unsigned(__cvta_generic_to_shared(dst + p));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + p) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  const int count = BlockCountValid<I, kT>(targets, rows, ignore, sm_count);
  if (blockIdx.x == 0 && threadIdx.x == 0) *valid = count;
  if (grad_scale_from != nullptr) grad_scale *= *grad_scale_from;
  // The next row's target is loaded a row ahead: off the path to thread 0's target logit.
  int64_t next_target = n > 0 ? int64_t(targets[blockIdx.x]) : 0;
  for (int64_t i = 0; i < n; ++i) {
    // Row i - 1's buffer: every thread finished reading it before row i - 1's block merge.
    issue(i + kStages - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
    __syncthreads();
    const uint4* buf = ring + int(i % kStages) * packs;
    const int64_t row = blockIdx.x + i * gridDim.x;
    const int64_t t = next_target;
    if (i + 1 < n) next_target = int64_t(targets[row + gridDim.x]);
    const RowInfo info{t, t == ignore, t != ignore && (t < 0 || t >= vocab)};
    const bool has_target = !info.ignored && !info.bad;
    float target_logit = 0.f;
    if (threadIdx.x == 0 && has_target) {
      float f[kE];
      R::Unpack(buf[info.target / kE], f);
#pragma unroll
      for (int k = 0; k < kE; ++k) target_logit = k == int(info.target % kE) ? f[k] : target_logit;
    }
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      const int p = int(threadIdx.x) + j * kT;
      if (p < packs) {
        float f[kE];
        R::Unpack(buf[p], f);
#pragma unroll
        for (int k = 0; k < kE; ++k) mt = fmaxf(mt, f[k]);
      }
    }
    float e[kK][kE];
    float s = 0.f;
    const float mt_scaled = mt * kLog2e;
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      const int p = int(threadIdx.x) + j * kT;
      if (p < packs) {
        R::Unpack(buf[p], e[j]);
#pragma unroll
        for (int k = 0; k < kE; ++k) {
          e[j][k] = Exp2Ftz(fmaf(e[j][k], kLog2e, -mt_scaled));
          s += e[j][k];
        }
      }
    }
    float m = mt;
    BlockMerge<kW>(m, s, sm_m, sm_s);
    const float lse = m + logf(s);
    if (threadIdx.x == 0) row_loss[row] = info.ignored ? 0.f : info.bad ? NAN : lse - target_logit;
    if (dlogits == nullptr) continue;
    const float scale = info.ignored || count == 0 ? 0.f : grad_scale / float(count);
    // exp(x - lse) * scale = e * exp(m_t - lse) * scale; m_t = -inf (no packs) gives 0.
    const float factor = Exp2Ftz((mt - lse) * kLog2e) * scale;
    const int target_pack = has_target ? int(info.target / kE) : -1;
    uint4* out = reinterpret_cast<uint4*>(dlogits + row * vocab);
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      const int p = int(threadIdx.x) + j * kT;
      if (p < packs) {
        float f[kE];
#pragma unroll
        for (int k = 0; k < kE; ++k) f[k] = e[j][k] * factor;
        if (p == target_pack) {
#pragma unroll
          for (int k = 0; k < kE; ++k) f[k] -= k == int(info.target % kE) ? scale : 0.f;
        }
        out[p] = R::Pack(f);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");  // the trailing empty groups
}

// kVec: the row in 16-byte packs; otherwise one element per step.
template <typename T, typename I, bool kVec>
__global__ void __launch_bounds__(kThreads)
    ChunkedRowKernel(const T* logits, const I* __restrict__ targets, T* dlogits, float* __restrict__ row_loss,
                     const int32_t* __restrict__ valid, int64_t vocab, int64_t ignore, float grad_scale,
                      const float* __restrict__ grad_scale_from) {
  using R = Raw16<T>;
  constexpr int kE = kVec ? R::kE : 1;
  __shared__ float sm_m[kWarps], sm_s[kWarps], sm_target;
  const int64_t row = blockIdx.x;
  const int64_t steps = vocab / kE;
  const T* x = logits + row * vocab;
  const RowInfo info = InfoFor(targets, row, vocab, ignore);
  if (threadIdx.x == 0) sm_target = info.ignored || info.bad ? 0.f : cuda_vec::ToF(x[info.target]);
  auto load = [&](int64_t i, float (&f)[R::kE]) {
    if constexpr (kVec) {
      R::Unpack(reinterpret_cast<const uint4*>(x)[i], f);
    } else {
      f[0] = cuda_vec::ToF(x[i]);
    }
  };
  float m = -INFINITY, s = 0.f;
  for (int64_t i = threadIdx.x; i < steps; i += kThreads) {
    float f[R::kE];
    load(i, f);
    float cm = f[0];
#pragma unroll
    for (int k = 1; k < kE; ++k) cm = fmaxf(cm, f[k]);
    float cs = 0.f;
#pragma unroll
    for (int k = 0; k < kE; ++k) cs += exp2f((f[k] - cm) * kLog2e);
    Merge(m, s, cm, cs);
  }
  BlockMerge(m, s, sm_m, sm_s);
  const float lse = m + logf(s);
  const float scale = FinishRow(info, lse, sm_target, row_loss, row, valid, grad_scale, grad_scale_from);
  if (dlogits == nullptr) return;
  T* out = dlogits + row * vocab;
  for (int64_t i = threadIdx.x; i < steps; i += kThreads) {
    float f[R::kE];
    load(i, f);
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const float onehot = i * kE + k == info.target ? 1.f : 0.f;
      f[k] = (exp2f((f[k] - lse) * kLog2e) - onehot) * scale;
    }
    if constexpr (kVec) {
      reinterpret_cast<uint4*>(out)[i] = R::Pack(f);
    } else {
      out[i] = cuda_vec::FromF<T>(f[0]);
    }
  }
}

// One block: each thread counts its strided targets (independent loads; a barrier per 1024 targets
// serialized ~16 L2/HBM round trips at 16384 rows), then one block reduction.
template <typename I>
__global__ void __launch_bounds__(1024) CountKernel(const I* targets, int64_t rows, int64_t ignore, int32_t* valid) {
  __shared__ int sm_count[32];
  const int total = BlockCountValid<I, 1024>(targets, rows, ignore, sm_count);
  if (threadIdx.x == 0) *valid = total;
}

// loss = sum of row losses (f64, each thread a fixed strided subset, then fixed shuffle and warp
// trees: deterministic) / valid.
__global__ void __launch_bounds__(1024)
    FinishKernel(const float* row_loss, int64_t rows, const int32_t* valid, float* loss) {
  __shared__ double partial[32];
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += 1024) s += double(row_loss[r]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < 32; ++w) total += partial[w];
    *loss = *valid > 0 ? float(total / double(*valid)) : 0.f;
  }
}

// SG_CE_KERNEL picks the row kernel for rows that fit in registers, per call, until the GPU run
// picks the winner: "registers" (default), "registers_v1" (the first version), "chunked" (two
// sweeps, the second from L2: low registers, more rows in flight per SM), "ring" (RingRowKernel,
// 1024 threads, 3 row buffers), "ring2" (2 row buffers), "ring512" (512 threads, 3 buffers).
enum class RowKernel { kRegisters, kRegistersV1, kChunked, kRing, kRing2, kRing512 };
RowKernel RowKernelFromEnv() {
  const char* v = std::getenv("SG_CE_KERNEL");
  if (v == nullptr) return RowKernel::kRegisters;
  if (std::strcmp(v, "registers_v1") == 0) return RowKernel::kRegistersV1;
  if (std::strcmp(v, "chunked") == 0) return RowKernel::kChunked;
  if (std::strcmp(v, "ring") == 0) return RowKernel::kRing;
  if (std::strcmp(v, "ring2") == 0) return RowKernel::kRing2;
  if (std::strcmp(v, "ring512") == 0) return RowKernel::kRing512;
  return RowKernel::kRegisters;
}

// Launches RingRowKernel with kT threads and kStages row buffers when the row fits (16-byte
// aligned, at most kT * 4 (kT 1024) or kT * 8 packs, kStages rows within the opt-in shared memory):
// true; otherwise false and nothing is launched. It writes `valid` itself.
template <typename T, typename I, int kT, int kStages>
absl::StatusOr<bool> LaunchRing(const Problem& p, const T* x, const I* t, T* g, float* row_loss, int32_t* valid,
                                cudaStream_t s) {
  constexpr int kE = Raw16<T>::kE;
  constexpr int kMaxK = kT >= 1024 ? 4 : 8;  // e in registers: kMaxK * kE floats within 64 / 128 registers
  const int64_t packs = p.vocab / kE;
  const int64_t per_thread = (packs + kT - 1) / kT;
  if (p.vocab % kE != 0 || !cuda_vec::Aligned16(x) || !cuda_vec::Aligned16(g) || per_thread > kMaxK) return false;
  const size_t smem = size_t(kStages) * size_t(packs) * sizeof(uint4);
  int dev = 0, optin = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem + 1024 > size_t(optin)) return false;  // + the kernel's static reduction arrays
  auto launch = [&](auto kernel) -> absl::Status {
    SG_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const unsigned grid = cuda_vec::ResidentGrid(kernel, kT, p.rows, smem);
    kernel<<<grid, kT, smem, s>>>(x, t, g, row_loss, valid, p.rows, p.vocab, p.ignore_index, p.grad_scale,
                                  p.grad_scale_from);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RingRowKernel);
    return absl::OkStatus();
  };
  if (per_thread <= 1) {
    SG_RETURN_IF_ERROR(launch(RingRowKernel<T, I, kT, 1, kStages>));
  } else if (per_thread <= 2) {
    SG_RETURN_IF_ERROR(launch(RingRowKernel<T, I, kT, 2, kStages>));
  } else if (per_thread <= 4) {
    SG_RETURN_IF_ERROR(launch(RingRowKernel<T, I, kT, 4, kStages>));
  } else if constexpr (kMaxK >= 8) {
    SG_RETURN_IF_ERROR(launch(RingRowKernel<T, I, kT, 8, kStages>));
  }
  return true;
}

template <typename T, typename I>
absl::Status LaunchRows(const Problem& p, const void* logits, const void* targets, float* row_loss,
                        const int32_t* valid, void* dlogits, cudaStream_t s) {
  const T* x = static_cast<const T*>(logits);
  const I* t = static_cast<const I*>(targets);
  T* g = static_cast<T*>(dlogits);
  constexpr int kE = Raw16<T>::kE;
  const bool aligned = p.vocab % kE == 0 && cuda_vec::Aligned16(logits) && cuda_vec::Aligned16(dlogits);
  const int64_t per_thread = (p.vocab / kE + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(p.rows);
  RowKernel kernel = RowKernelFromEnv();
  // The ring kernels fall back to the default where they do not apply.
  if (kernel == RowKernel::kRing || kernel == RowKernel::kRing2 || kernel == RowKernel::kRing512) {
    kernel = RowKernel::kRegisters;
  }
#define SG_ARGS x, t, g, row_loss, valid, p.vocab, p.ignore_index, p.grad_scale, p.grad_scale_from
  if (aligned && per_thread <= kMaxPacksPerThread && kernel == RowKernel::kRegisters) {
    if (per_thread <= 1) RegisterRowKernel<T, I, 1><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else if (per_thread <= 2) RegisterRowKernel<T, I, 2><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else if (per_thread <= 4) RegisterRowKernel<T, I, 4><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else RegisterRowKernel<T, I, 8><<<grid, kThreads, 0, s>>>(SG_ARGS);
  } else if (aligned && per_thread <= kMaxPacksPerThread && kernel == RowKernel::kRegistersV1) {
    if (per_thread <= 1) RegisterRowKernelV1<T, I, 1><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else if (per_thread <= 2) RegisterRowKernelV1<T, I, 2><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else if (per_thread <= 4) RegisterRowKernelV1<T, I, 4><<<grid, kThreads, 0, s>>>(SG_ARGS);
    else RegisterRowKernelV1<T, I, 8><<<grid, kThreads, 0, s>>>(SG_ARGS);
  } else if (aligned) {
    ChunkedRowKernel<T, I, true><<<grid, kThreads, 0, s>>>(SG_ARGS);
  } else {
    ChunkedRowKernel<T, I, false><<<grid, kThreads, 0, s>>>(SG_ARGS);
  }
#undef SG_ARGS
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowKernel);
  return absl::OkStatus();
}

template <typename T, typename I>
absl::Status Run(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid,
                 void* dlogits, float* row_loss, cudaStream_t s) {
  const T* x = static_cast<const T*>(logits);
  const I* t = static_cast<const I*>(targets);
  T* g = static_cast<T*>(dlogits);
  bool ring = false;
  switch (RowKernelFromEnv()) {
    case RowKernel::kRing: {
      SG_ASSIGN_OR_RETURN(ring, (LaunchRing<T, I, 1024, 3>(p, x, t, g, row_loss, valid, s)));
      break;
    }
    case RowKernel::kRing2: {
      SG_ASSIGN_OR_RETURN(ring, (LaunchRing<T, I, 1024, 2>(p, x, t, g, row_loss, valid, s)));
      break;
    }
    case RowKernel::kRing512: {
      SG_ASSIGN_OR_RETURN(ring, (LaunchRing<T, I, 512, 3>(p, x, t, g, row_loss, valid, s)));
      break;
    }
    default:
      break;
  }
  if (!ring) {
    CountKernel<I><<<1, 1024, 0, s>>>(t, p.rows, p.ignore_index, valid);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(CountKernel);
    SG_RETURN_IF_ERROR((LaunchRows<T, I>(p, logits, targets, row_loss, valid, dlogits, s)));
  }
  FinishKernel<<<1, 1024, 0, s>>>(row_loss, p.rows, valid, loss);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(FinishKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCuda(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid,
                     void* dlogits, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(p.rows * int64_t(sizeof(float))));
  float* row_loss = static_cast<float*>(scratch);
  auto run = [&]() -> absl::Status {
    if (p.dtype == DType::kBF16) {
      if (p.targets_i64) return Run<__nv_bfloat16, int64_t>(p, logits, targets, loss, valid, dlogits, row_loss, s);
      return Run<__nv_bfloat16, int32_t>(p, logits, targets, loss, valid, dlogits, row_loss, s);
    }
    if (p.dtype == DType::kF16) {
      if (p.targets_i64) return Run<__half, int64_t>(p, logits, targets, loss, valid, dlogits, row_loss, s);
      return Run<__half, int32_t>(p, logits, targets, loss, valid, dlogits, row_loss, s);
    }
    if (p.targets_i64) return Run<float, int64_t>(p, logits, targets, loss, valid, dlogits, row_loss, s);
    return Run<float, int32_t>(p, logits, targets, loss, valid, dlogits, row_loss, s);
  };
  const absl::Status st = run();
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

}  // namespace sg::kernels::cross_entropy_internal
