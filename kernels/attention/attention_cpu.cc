// CPU reference attention: one (batch, head) -- or (batch, kv head) group for the backward -- per
// task, f64 accumulation, tasks spread over std::threads. Written for clarity: it is the oracle the
// CUDA kernels are tested against, and the CPU trainer's kernel.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/attention/attention_internal.h"

namespace sg::kernels::internal {
namespace {

double Load(float v) { return v; }
double Load(double v) { return v; }
double Load(BFloat16 v) { return v.ToFloat(); }
double Load(Half v) { return v.ToFloat(); }
template <typename T> T Store(double v);
template <> float Store<float>(double v) { return float(v); }
template <> double Store<double>(double v) { return v; }
template <> BFloat16 Store<BFloat16>(double v) { return BFloat16::FromFloat(float(v)); }
template <> Half Store<Half>(double v) { return Half::FromFloat(float(v)); }

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Runs fn(0..n-1) on up to hardware_concurrency threads; each index runs exactly once.
void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& th : pool) th.join();
}

// Element offsets into [batch, seq, heads, head_dim] and [batch, heads, seq].
struct Index {
  const AttentionParams& p;
  int64_t Q(int64_t b, int64_t i, int64_t h) const {
    return ((b * p.seq_q + i) * p.heads + h) * p.head_dim;
  }
  int64_t K(int64_t b, int64_t j, int64_t kh) const {
    return ((b * p.seq_k + j) * p.kv_heads + kh) * p.head_dim;
  }
  int64_t Stat(int64_t b, int64_t h, int64_t i) const { return (b * p.heads + h) * p.seq_q + i; }
};

template <typename T>
double Dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t d = 0; d < n; ++d) s += Load(a[d]) * Load(b[d]);
  return s;
}

}  // namespace

template <typename T, typename S>
void AttentionForwardCpu(const AttentionParams& p, const T* q, const T* k, const T* v, T* out,
                         S* lse) {
  const Index ix{p};
  const int64_t group = p.heads / p.kv_heads, dim = p.head_dim;
  ParallelFor(p.batch * p.heads, [&](int64_t task) {
    const int64_t b = task / p.heads, h = task % p.heads, kh = h / group;
    std::vector<double> score(static_cast<size_t>(p.seq_k)), acc(static_cast<size_t>(dim));
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const T* qi = q + ix.Q(b, i, h);
      double m = kNegInf;
      for (int64_t j = 0; j < p.seq_k; ++j) {
        score[j] = p.Masked(i, j) ? kNegInf : p.scale * Dot(qi, k + ix.K(b, j, kh), dim);
        m = std::max(m, score[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0;
      if (m != kNegInf) {
        for (int64_t j = 0; j < p.seq_k; ++j) {
          if (score[j] == kNegInf) continue;
          const double e = std::exp(score[j] - m);
          sum += e;
          const T* vj = v + ix.K(b, j, kh);
          for (int64_t d = 0; d < dim; ++d) acc[d] += e * Load(vj[d]);
        }
      }
      T* oi = out + ix.Q(b, i, h);
      for (int64_t d = 0; d < dim; ++d) oi[d] = Store<T>(sum > 0 ? acc[d] / sum : 0.0);
      lse[ix.Stat(b, h, i)] = S(sum > 0 ? m + std::log(sum) : kNegInf);
    }
  });
}

template <typename T, typename S>
void AttentionBackwardDeltaCpu(const AttentionParams& p, const T* out, const T* dout, S* delta) {
  const Index ix{p};
  ParallelFor(p.batch * p.heads, [&](int64_t task) {
    const int64_t b = task / p.heads, h = task % p.heads;
    for (int64_t i = 0; i < p.seq_q; ++i) {
      delta[ix.Stat(b, h, i)] = S(Dot(out + ix.Q(b, i, h), dout + ix.Q(b, i, h), p.head_dim));
    }
  });
}

// With P_ij = exp(scale q_i.k_j - lse_i) and dS_ij = P_ij (dout_i.v_j - delta_i):
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij dout_i.
// One task per (batch, kv head) so dk/dv sums over the group's query heads need no locking.
template <typename T, typename S>
void AttentionBlockBackwardCpu(const AttentionParams& p, const T* q, const T* k, const T* v,
                               const T* dout, const S* lse, const S* delta, T* dq, T* dk, T* dv) {
  const Index ix{p};
  const int64_t group = p.heads / p.kv_heads, dim = p.head_dim;
  ParallelFor(p.batch * p.kv_heads, [&](int64_t task) {
    const int64_t b = task / p.kv_heads, kh = task % p.kv_heads;
    std::vector<double> dk_acc(size_t(p.seq_k * dim), 0.0), dv_acc(size_t(p.seq_k * dim), 0.0);
    std::vector<double> dq_acc(static_cast<size_t>(dim));
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const T* qi = q + ix.Q(b, i, h);
        const T* doi = dout + ix.Q(b, i, h);
        const double lse_i = double(lse[ix.Stat(b, h, i)]), delta_i = double(delta[ix.Stat(b, h, i)]);
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = 0; j < p.seq_k && lse_i != kNegInf; ++j) {
          if (p.Masked(i, j)) continue;
          const T* kj = k + ix.K(b, j, kh);
          const T* vj = v + ix.K(b, j, kh);
          const double prob = std::exp(p.scale * Dot(qi, kj, dim) - lse_i);
          const double ds = prob * (Dot(doi, vj, dim) - delta_i);
          for (int64_t d = 0; d < dim; ++d) {
            dq_acc[d] += ds * Load(kj[d]);
            dk_acc[j * dim + d] += ds * Load(qi[d]);
            dv_acc[j * dim + d] += prob * Load(doi[d]);
          }
        }
        T* dqi = dq + ix.Q(b, i, h);
        for (int64_t d = 0; d < dim; ++d) dqi[d] = Store<T>(p.scale * dq_acc[d]);
      }
    }
    for (int64_t j = 0; j < p.seq_k; ++j) {
      for (int64_t d = 0; d < dim; ++d) {
        dk[ix.K(b, j, kh) + d] = Store<T>(p.scale * dk_acc[j * dim + d]);
        dv[ix.K(b, j, kh) + d] = Store<T>(dv_acc[j * dim + d]);
      }
    }
  });
}

template <typename T>
void AttentionMergeCpu(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, const T* out_a,
                       const float* lse_a, const T* out_b, const float* lse_b, T* out, float* lse) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t st = (b * heads + h) * seq + s, row = ((b * seq + s) * heads + h) * head_dim;
        const double la = lse_a[st], lb = lse_b[st];
        const double m = std::max(la, lb);
        double wa = 0, wb = 0, l = kNegInf;
        if (m != kNegInf) {
          l = m + std::log(std::exp(la - m) + std::exp(lb - m));
          wa = std::exp(la - l);
          wb = std::exp(lb - l);
        }
        for (int64_t d = 0; d < head_dim; ++d) {
          out[row + d] = Store<T>(wa * Load(out_a[row + d]) + wb * Load(out_b[row + d]));
        }
        lse[st] = float(l);
      }
    }
  }
}

#define SG_INSTANTIATE_ATTENTION_CPU(T, S)                                                        \
  template void AttentionForwardCpu<T, S>(const AttentionParams&, const T*, const T*, const T*,   \
                                          T*, S*);                                                \
  template void AttentionBackwardDeltaCpu<T, S>(const AttentionParams&, const T*, const T*, S*);  \
  template void AttentionBlockBackwardCpu<T, S>(const AttentionParams&, const T*, const T*,       \
                                                const T*, const T*, const S*, const S*, T*, T*,   \
                                                T*);
SG_INSTANTIATE_ATTENTION_CPU(float, float)
SG_INSTANTIATE_ATTENTION_CPU(BFloat16, float)
SG_INSTANTIATE_ATTENTION_CPU(Half, float)
SG_INSTANTIATE_ATTENTION_CPU(double, double)
#undef SG_INSTANTIATE_ATTENTION_CPU

template void AttentionMergeCpu<float>(int64_t, int64_t, int64_t, int64_t, const float*,
                                       const float*, const float*, const float*, float*, float*);
template void AttentionMergeCpu<BFloat16>(int64_t, int64_t, int64_t, int64_t, const BFloat16*,
                                          const float*, const BFloat16*, const float*, BFloat16*,
                                          float*);
template void AttentionMergeCpu<Half>(int64_t, int64_t, int64_t, int64_t, const Half*, const float*,
                                      const Half*, const float*, Half*, float*);

}  // namespace sg::kernels::internal
