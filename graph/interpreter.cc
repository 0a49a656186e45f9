#include "graph/interpreter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::graph {

HostTensor HostTensor::Zeros(Shape shape, DType dtype) {
  HostTensor t{dtype, shape, {}};
  t.data.assign(size_t(sg::NumElements(shape)), 0.0);
  return t;
}

HostTensor HostTensor::Random(Shape shape, DType dtype, std::mt19937_64& rng, double scale,
                              int64_t int_max) {
  HostTensor t = Zeros(std::move(shape), dtype);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::uniform_int_distribution<int64_t> ui(0, std::max<int64_t>(int_max - 1, 0));
  for (double& v : t.data) v = IsFloating(dtype) ? u(rng) : double(ui(rng));
  return t;
}

namespace {

using Tensors = std::vector<const HostTensor*>;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

int64_t Rows(const HostTensor& t) {
  return t.shape.empty() ? 1 : t.numel() / std::max<int64_t>(t.shape.back(), 1);
}
int64_t Last(const HostTensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }

HostTensor Like(const HostTensor& t) { return HostTensor::Zeros(t.shape, t.dtype); }

double RoundTo(DType d, double v) {
  switch (d) {
    case DType::kF32: return v;  // f32 values are carried in double everywhere else too
    case DType::kBF16: return BFloat16::FromFloat(float(v)).ToFloat();
    case DType::kF16: return Half::FromFloat(float(v)).ToFloat();
    case DType::kI32:
    case DType::kI64: return std::trunc(v);
  }
  return v;
}

// Rmsnorm over the last dim: y, and optionally (dx, dw) given dy.
void RmsNormRows(const HostTensor& x, const HostTensor& w, double eps, HostTensor* y,
                 const HostTensor* dy, HostTensor* dx, HostTensor* dw) {
  const int64_t rows = Rows(x), d = Last(x);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &x.data[r * d];
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const double rstd = 1.0 / std::sqrt(ss / double(d) + eps);
    if (y) {
      for (int64_t i = 0; i < d; ++i) y->data[r * d + i] = xr[i] * rstd * w.data[i];
    }
    if (dy) {
      const double* g = &dy->data[r * d];
      double dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += g[i] * w.data[i] * xr[i];
      for (int64_t i = 0; i < d; ++i) {
        dx->data[r * d + i] += rstd * w.data[i] * g[i] - xr[i] * rstd * rstd * rstd * dot / double(d);
        dw->data[i] += g[i] * xr[i] * rstd;
      }
    }
  }
}

// Index of a binary op's smaller operand: it broadcasts over leading dims (its shape a suffix).
HostTensor Binary(OpKind op, const HostTensor& a, const HostTensor& b) {
  const bool a_big = a.numel() >= b.numel() && a.shape.size() >= b.shape.size();
  HostTensor out = Like(a_big ? a : b);
  const int64_t na = a.numel(), nb = b.numel();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double x = a.data[na ? i % na : 0], y = b.data[nb ? i % nb : 0];
    double r = 0;
    switch (op) {
      case OpKind::kAdd: r = x + y; break;
      case OpKind::kSub: r = x - y; break;
      case OpKind::kMul: r = x * y; break;
      case OpKind::kDiv: r = x / y; break;
      default: break;
    }
    out.data[i] = r;
  }
  return out;
}

HostTensor Matmul(const Node& n, const Tensors& in) {
  const HostTensor& a = *in[0];
  const HostTensor& b = *in[1];
  const bool ta = AttrBool(n, "trans_a"), tb = AttrBool(n, "trans_b");
  const std::string& epi = AttrString(n, "epilogue");
  HostTensor out;
  out.dtype = a.dtype;
  if (!ta) {
    const int64_t k = Last(a), rows = Rows(a), nn = tb ? b.shape[0] : b.shape[1];
    out.shape = a.shape;
    out.shape.back() = nn;
    out.data.assign(size_t(rows * nn), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < nn; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a.data[r * k + p] * (tb ? b.data[j * k + p] : b.data[p * nn + j]);
        out.data[r * nn + j] = s;
      }
    }
  } else {
    const int64_t m = Last(a), rows = Rows(a), nn = Last(b);
    out.shape = {m, nn};
    out.data.assign(size_t(m * nn), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < m; ++i) {
        const double av = a.data[r * m + i];
        for (int64_t j = 0; j < nn; ++j) out.data[i * nn + j] += av * b.data[r * nn + j];
      }
    }
  }
  size_t next = 2;
  const int64_t nn = Last(out);
  if (epi == "bias" || epi == "bias_residual") {
    const HostTensor& bias = *in[next++];
    for (int64_t i = 0; i < out.numel(); ++i) out.data[i] += bias.data[i % nn];
  }
  if (epi == "residual" || epi == "bias_residual") {
    const HostTensor& res = *in[next];
    for (int64_t i = 0; i < out.numel(); ++i) out.data[i] += res.data[i];
  }
  return out;
}

// rope with sign +1 (forward) or -1 (backward: the transpose rotation).
HostTensor Rope(const HostTensor& x, double theta, double sign) {
  HostTensor out = Like(x);
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2], d = x.shape[3], half = d / 2;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t p = 0; p < s; ++p) {
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t base = ((bi * s + p) * h + hi) * d;
        for (int64_t i = 0; i < half; ++i) {
          const double freq = std::pow(theta, -2.0 * double(i) / double(d));
          const double c = std::cos(double(p) * freq), sn = sign * std::sin(double(p) * freq);
          const double x1 = x.data[base + i], x2 = x.data[base + i + half];
          out.data[base + i] = x1 * c - x2 * sn;
          out.data[base + i + half] = x2 * c + x1 * sn;
        }
      }
    }
  }
  return out;
}

// Attention forward (out) or backward (dq, dk, dv) by explicit softmax rows.
std::vector<HostTensor> Attention(const Node& n, const Tensors& in, bool backward) {
  const HostTensor* dout = backward ? in[0] : nullptr;
  const HostTensor& q = *in[backward ? 1 : 0];
  const HostTensor& k = *in[backward ? 2 : 1];
  const HostTensor& v = *in[backward ? 3 : 2];
  const bool causal = AttrBool(n, "causal");
  const double scale = AttrFloat(n, "scale");
  const int64_t B = q.shape[0], S = q.shape[1], HQ = q.shape[2], D = q.shape[3], HK = k.shape[2];
  const int64_t group = HQ / HK;
  HostTensor out = Like(q), dq = Like(q), dk = Like(k), dv = Like(v);
  auto qi = [&](int64_t b, int64_t s, int64_t h) { return ((b * S + s) * HQ + h) * D; };
  auto ki = [&](int64_t b, int64_t s, int64_t h) { return ((b * S + s) * HK + h) * D; };
  std::vector<double> p(static_cast<size_t>(S)), dp(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t jmax = causal ? i : S - 1;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= jmax; ++j) {
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += q.data[qi(b, i, h) + e] * k.data[ki(b, j, hk) + e];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= jmax; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= jmax; ++j) p[j] /= sum;
        if (!backward) {
          for (int64_t j = 0; j <= jmax; ++j) {
            for (int64_t e = 0; e < D; ++e) out.data[qi(b, i, h) + e] += p[j] * v.data[ki(b, j, hk) + e];
          }
          continue;
        }
        const double* g = &dout->data[qi(b, i, h)];
        double pdp = 0;
        for (int64_t j = 0; j <= jmax; ++j) {
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += g[e] * v.data[ki(b, j, hk) + e];
          dp[j] = s;
          pdp += p[j] * s;
        }
        for (int64_t j = 0; j <= jmax; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          for (int64_t e = 0; e < D; ++e) {
            dq.data[qi(b, i, h) + e] += ds * k.data[ki(b, j, hk) + e];
            dk.data[ki(b, j, hk) + e] += ds * q.data[qi(b, i, h) + e];
            dv.data[ki(b, j, hk) + e] += p[j] * g[e];
          }
        }
      }
    }
  }
  if (!backward) return {out};
  return {dq, dk, dv};
}

// Cross-entropy family. `mode`: 0 softmax_cross_entropy(logits), 1 nll_loss(logp).
absl::StatusOr<std::vector<HostTensor>> Loss(const Node& n, const Tensors& in, bool log_probs,
                                             bool backward) {
  const HostTensor* dloss = backward ? in[0] : nullptr;
  const HostTensor& x = *in[backward ? 1 : 0];
  const HostTensor& t = *in[backward ? 2 : 1];
  const int64_t ignore = AttrInt(n, "ignore_index");
  const int64_t rows = Rows(x), V = Last(x);
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tgt = int64_t(t.data[r]);
    if (tgt == ignore) continue;
    if (tgt < 0 || tgt >= V) {
      return absl::InvalidArgumentError(absl::StrCat(OpName(n.op), ": target ", tgt, " at row ", r,
                                                     " is outside [0, ", V, ") and is not ignore_index=",
                                                     ignore));
    }
    ++count;
  }
  HostTensor loss = HostTensor::Zeros({}, DType::kF32);
  HostTensor dx = Like(x);
  const double g = backward && count ? dloss->data[0] / double(count) : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tgt = int64_t(t.data[r]);
    if (tgt == ignore) continue;
    const double* xr = &x.data[r * V];
    if (log_probs) {
      loss.data[0] -= xr[tgt];
      dx.data[r * V + tgt] = -g;
      continue;
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, xr[j]);
    for (int64_t j = 0; j < V; ++j) sum += std::exp(xr[j] - mx);
    const double lse = mx + std::log(sum);
    loss.data[0] += lse - xr[tgt];
    for (int64_t j = 0; j < V; ++j) dx.data[r * V + j] = g * (std::exp(xr[j] - lse) - (j == tgt));
  }
  if (count) loss.data[0] /= double(count);
  if (backward) return std::vector<HostTensor>{dx};
  return std::vector<HostTensor>{loss};
}

HostTensor Transpose(const HostTensor& x, const IntList& perm) {
  HostTensor out;
  out.dtype = x.dtype;
  for (int64_t p : perm) out.shape.push_back(x.shape[p]);
  out.data.assign(x.data.size(), 0.0);
  const Strides in_st = ContiguousStrides(x.shape);
  const int rank = int(perm.size());
  std::vector<int64_t> idx(rank, 0);
  for (int64_t o = 0; o < out.numel(); ++o) {
    int64_t src = 0;
    for (int d = 0; d < rank; ++d) src += idx[d] * in_st[perm[d]];
    out.data[o] = x.data[src];
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < out.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Sums `x` over `dims` (true = reduced), or broadcasts `x` (shape without those dims) to `full`.
void ReduceOrBroadcast(const Shape& full, const std::vector<bool>& reduced, HostTensor* big,
                       HostTensor* small, bool reduce) {
  const int rank = int(full.size());
  std::vector<int64_t> idx(rank, 0);
  Shape small_shape;
  for (int d = 0; d < rank; ++d) {
    if (!reduced[d]) small_shape.push_back(full[d]);
  }
  const Strides sst = ContiguousStrides(small_shape);
  const int64_t n = sg::NumElements(full);
  for (int64_t o = 0; o < n; ++o) {
    int64_t s = 0, k = 0;
    for (int d = 0; d < rank; ++d) {
      if (!reduced[d]) s += idx[d] * sst[k++];
    }
    if (reduce) small->data[s] += big->data[o];
    else big->data[o] = small->data[s];
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < full[d]) break;
      idx[d] = 0;
    }
  }
}

std::vector<bool> DimMask(int rank, const IntList& dims) {
  std::vector<bool> m(rank, false);
  for (int64_t d : dims) m[d] = true;
  return m;
}

absl::StatusOr<std::vector<HostTensor>> Run(const Node& n, const Tensors& in,
                                            const std::vector<Shape>& out_shapes) {
  auto unary = [&](auto f) {
    HostTensor out = Like(*in[0]);
    for (int64_t i = 0; i < out.numel(); ++i) out.data[i] = f(in[0]->data[i]);
    return std::vector<HostTensor>{out};
  };
  switch (n.op) {
    case OpKind::kParameter:
    case OpKind::kInput:
      return absl::InternalError("sources are fed, not run");
    case OpKind::kFill: {
      HostTensor t = HostTensor::Zeros(out_shapes[0], AttrDType(n, "dtype"));
      std::fill(t.data.begin(), t.data.end(), AttrFloat(n, "value"));
      return std::vector<HostTensor>{t};
    }
    case OpKind::kEmbedding:
    case OpKind::kEmbeddingBackward: {
      const bool bwd = n.op == OpKind::kEmbeddingBackward;
      const HostTensor& ids = *in[1];
      const int64_t V = bwd ? AttrInt(n, "num_embeddings") : in[0]->shape[0];
      const int64_t D = Last(*in[0]);
      HostTensor out = HostTensor::Zeros(out_shapes[0], in[0]->dtype);
      for (int64_t r = 0; r < ids.numel(); ++r) {
        const int64_t id = int64_t(ids.data[r]);
        if (id < 0 || id >= V) {
          return absl::InvalidArgumentError(absl::StrCat(OpName(n.op), ": id ", id, " at position ",
                                                         r, " is outside [0, ", V, ")"));
        }
        for (int64_t e = 0; e < D; ++e) {
          if (bwd) out.data[id * D + e] += in[0]->data[r * D + e];
          else out.data[r * D + e] = in[0]->data[id * D + e];
        }
      }
      return std::vector<HostTensor>{out};
    }
    case OpKind::kMatmul: return std::vector<HostTensor>{Matmul(n, in)};
    case OpKind::kRmsNorm: {
      HostTensor y = Like(*in[0]);
      RmsNormRows(*in[0], *in[1], AttrFloat(n, "eps"), &y, nullptr, nullptr, nullptr);
      return std::vector<HostTensor>{y};
    }
    case OpKind::kRmsNormBackward: {
      HostTensor dx = Like(*in[1]), dw = Like(*in[2]);
      RmsNormRows(*in[1], *in[2], AttrFloat(n, "eps"), nullptr, in[0], &dx, &dw);
      return std::vector<HostTensor>{dx, dw};
    }
    case OpKind::kAddRmsNorm: {
      HostTensor h = Binary(OpKind::kAdd, *in[0], *in[1]);
      HostTensor y = Like(h);
      RmsNormRows(h, *in[2], AttrFloat(n, "eps"), &y, nullptr, nullptr, nullptr);
      return std::vector<HostTensor>{y, h};
    }
    case OpKind::kAddRmsNormBackward: {
      HostTensor dx = *in[1], dw = Like(*in[3]);  // dx starts as dh
      RmsNormRows(*in[2], *in[3], AttrFloat(n, "eps"), nullptr, in[0], &dx, &dw);
      return std::vector<HostTensor>{dx, dw};
    }
    case OpKind::kRope: return std::vector<HostTensor>{Rope(*in[0], AttrFloat(n, "theta"), 1.0)};
    case OpKind::kRopeBackward:
      return std::vector<HostTensor>{Rope(*in[0], AttrFloat(n, "theta"), -1.0)};
    case OpKind::kAttention: return Attention(n, in, false);
    case OpKind::kAttentionBackward: return Attention(n, in, true);
    case OpKind::kSwiGLU: {
      HostTensor out = Like(*in[0]);
      for (int64_t i = 0; i < out.numel(); ++i) {
        const double g = in[0]->data[i];
        out.data[i] = g * Sigmoid(g) * in[1]->data[i];
      }
      return std::vector<HostTensor>{out};
    }
    case OpKind::kSwiGLUBackward: {
      HostTensor dg = Like(*in[1]), du = Like(*in[2]);
      for (int64_t i = 0; i < dg.numel(); ++i) {
        const double g = in[1]->data[i], s = Sigmoid(g), dy = in[0]->data[i];
        dg.data[i] = dy * in[2]->data[i] * s * (1 + g * (1 - s));
        du.data[i] = dy * g * s;
      }
      return std::vector<HostTensor>{dg, du};
    }
    case OpKind::kSoftmaxCrossEntropy: return Loss(n, in, false, false);
    case OpKind::kSoftmaxCrossEntropyBackward: return Loss(n, in, false, true);
    case OpKind::kNllLoss: return Loss(n, in, true, false);
    case OpKind::kNllLossBackward: return Loss(n, in, true, true);
    case OpKind::kLogSoftmax:
    case OpKind::kLogSoftmaxBackward: {
      const bool bwd = n.op == OpKind::kLogSoftmaxBackward;
      const HostTensor& x = *in[bwd ? 1 : 0];
      HostTensor out = Like(x);
      const int64_t rows = Rows(x), V = Last(x);
      for (int64_t r = 0; r < rows; ++r) {
        const double* xr = &x.data[r * V];
        if (bwd) {  // x is the forward output y = log_softmax
          double s = 0;
          for (int64_t j = 0; j < V; ++j) s += in[0]->data[r * V + j];
          for (int64_t j = 0; j < V; ++j) out.data[r * V + j] = in[0]->data[r * V + j] - std::exp(xr[j]) * s;
          continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < V; ++j) mx = std::max(mx, xr[j]);
        for (int64_t j = 0; j < V; ++j) sum += std::exp(xr[j] - mx);
        for (int64_t j = 0; j < V; ++j) out.data[r * V + j] = xr[j] - mx - std::log(sum);
      }
      return std::vector<HostTensor>{out};
    }
    case OpKind::kAdd:
    case OpKind::kSub:
    case OpKind::kMul:
    case OpKind::kDiv: return std::vector<HostTensor>{Binary(n.op, *in[0], *in[1])};
    case OpKind::kNeg: return unary([](double x) { return -x; });
    case OpKind::kScale: {
      const double f = AttrFloat(n, "factor");
      return unary([f](double x) { return x * f; });
    }
    case OpKind::kSilu: return unary([](double x) { return x * Sigmoid(x); });
    case OpKind::kSiluBackward: {
      HostTensor out = Like(*in[1]);
      for (int64_t i = 0; i < out.numel(); ++i) {
        const double x = in[1]->data[i], s = Sigmoid(x);
        out.data[i] = in[0]->data[i] * s * (1 + x * (1 - s));
      }
      return std::vector<HostTensor>{out};
    }
    case OpKind::kExp: return unary([](double x) { return std::exp(x); });
    case OpKind::kLog: return unary([](double x) { return std::log(x); });
    case OpKind::kRsqrt: return unary([](double x) { return 1.0 / std::sqrt(x); });
    case OpKind::kReshape: {
      HostTensor out = *in[0];
      out.shape = out_shapes[0];
      return std::vector<HostTensor>{out};
    }
    case OpKind::kTranspose: return std::vector<HostTensor>{Transpose(*in[0], AttrInts(n, "perm"))};
    case OpKind::kCast: {
      HostTensor out = *in[0];
      out.dtype = AttrDType(n, "dtype");
      for (double& v : out.data) v = RoundTo(out.dtype, v);
      return std::vector<HostTensor>{out};
    }
    case OpKind::kReduceSum: {
      HostTensor out = HostTensor::Zeros(out_shapes[0], in[0]->dtype);
      HostTensor big = *in[0];
      ReduceOrBroadcast(big.shape, DimMask(int(big.shape.size()), AttrInts(n, "dims")), &big, &out,
                        true);
      return std::vector<HostTensor>{out};
    }
    case OpKind::kBroadcast: {
      HostTensor out = HostTensor::Zeros(out_shapes[0], in[0]->dtype);
      HostTensor small = *in[0];
      ReduceOrBroadcast(out.shape, DimMask(int(out.shape.size()), AttrInts(n, "dims")), &out, &small,
                        false);
      return std::vector<HostTensor>{out};
    }
    case OpKind::kGradNorm: {
      double ss = 0;
      for (const HostTensor* g : in) {
        for (double v : g->data) ss += v * v;
      }
      HostTensor norm = HostTensor::Zeros({}), clip = HostTensor::Zeros({});
      norm.data[0] = std::sqrt(ss);
      const double max_norm = AttrFloat(n, "max_norm");
      clip.data[0] = max_norm > 0 ? std::min(1.0, max_norm / (norm.data[0] + 1e-6)) : 1.0;
      return std::vector<HostTensor>{norm, clip};
    }
    case OpKind::kAdamW: {
      const double b1 = AttrFloat(n, "beta1"), b2 = AttrFloat(n, "beta2");
      const double eps = AttrFloat(n, "eps"), wd = AttrFloat(n, "weight_decay");
      const double step = in[4]->data[0], lr = in[5]->data[0], gs = in[6]->data[0];
      HostTensor p = *in[0], m = *in[2], v = *in[3];
      const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double g = in[1]->data[i] * gs;
        m.data[i] = b1 * m.data[i] + (1 - b1) * g;
        v.data[i] = b2 * v.data[i] + (1 - b2) * g * g;
        p.data[i] -= lr * (m.data[i] / c1 / (std::sqrt(v.data[i] / c2) + eps) + wd * p.data[i]);
      }
      return std::vector<HostTensor>{p, m, v};
    }
  }
  return absl::InternalError("unhandled op");
}

}  // namespace

absl::StatusOr<Binding> BindFromFeeds(const Graph& g, const Feeds& feeds) {
  Binding b;
  std::map<std::string, std::string> bound_by;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 binds single symbols, pass 1 checks all dims
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::kParameter && n.op != OpKind::kInput) continue;
      const std::string& name = AttrString(n, "name");
      const Type& t = g.type(n.outputs[0]);
      auto it = feeds.find(name);
      if (it == feeds.end()) {
        return absl::InvalidArgumentError(absl::StrCat(OpName(n.op), " '", name, "' (",
                                                       t.ToString(), ") has no feed"));
      }
      const HostTensor& h = it->second;
      auto mismatch = [&](const std::string& why) {
        return absl::InvalidArgumentError(absl::StrCat(
            OpName(n.op), " '", name, "': expected ", t.ToString(), ", found ", DTypeName(h.dtype),
            ShapeToString(h.shape), why.empty() ? "" : " (" + why + ")"));
      };
      if (h.dtype != t.dtype || int(h.shape.size()) != t.rank()) return mismatch("");
      if (int64_t(h.data.size()) != sg::NumElements(h.shape)) return mismatch("data size differs");
      for (int d = 0; d < t.rank(); ++d) {
        const Dim& dim = t.shape[d];
        if (pass == 0 && dim.symbols().size() == 1 && dim.coeff() == 1) {
          const std::string& s = dim.symbols()[0];
          auto [pos, fresh] = b.emplace(s, h.shape[d]);
          if (!fresh && pos->second != h.shape[d]) {
            return mismatch(absl::StrCat(s, "=", pos->second, " bound by '", bound_by[s], "'"));
          }
          if (fresh) bound_by[s] = name;
        } else if (pass == 1) {
          auto v = Evaluate(dim, b);
          if (!v.ok()) return mismatch(std::string(v.status().message()));
          if (*v != h.shape[d]) return mismatch(absl::StrCat("dim ", d, " = ", dim.ToString(), " = ", *v));
        }
      }
    }
  }
  SG_RETURN_IF_ERROR(CheckBinding(g, b));
  return b;
}

absl::StatusOr<Feeds> Interpret(const Graph& g, const Feeds& feeds) {
  SG_RETURN_IF_ERROR(Verify(g));
  SG_ASSIGN_OR_RETURN(Binding binding, BindFromFeeds(g, feeds));
  std::vector<HostTensor> values(g.num_value_ids());
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kParameter || n.op == OpKind::kInput) {
      values[n.outputs[0]] = feeds.at(AttrString(n, "name"));
      continue;
    }
    Tensors in;
    for (int id : n.inputs) in.push_back(&values[id]);
    std::vector<Shape> shapes;
    for (int id : n.outputs) {
      SG_ASSIGN_OR_RETURN(Shape s, Evaluate(g.type(id).shape, binding));
      shapes.push_back(s);
    }
    SG_ASSIGN_OR_RETURN(std::vector<HostTensor> out, Run(n, in, shapes));
    for (size_t k = 0; k < out.size(); ++k) {
      if (out[k].shape != shapes[k]) {
        return absl::InternalError(absl::StrCat("interpreter: ", OpName(n.op), " output ", k, " has shape ",
                                                ShapeToString(out[k].shape), ", type says ",
                                                ShapeToString(shapes[k])));
      }
      out[k].dtype = g.type(n.outputs[k]).dtype;
      values[n.outputs[k]] = std::move(out[k]);
    }
  }
  Feeds result;
  for (const GraphOutput& o : g.outputs()) result[o.name] = values[o.value];
  return result;
}

}  // namespace sg::graph
