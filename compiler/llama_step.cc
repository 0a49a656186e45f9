#include "compiler/llama_step.h"

#include <algorithm>
#include <map>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/parallel.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

LlamaBenchConfig Make(std::string name, int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                      int64_t vocab, int64_t seq, int64_t batch) {
  LlamaBenchConfig c;
  c.name = std::move(name);
  c.model.dim = dim;
  c.model.n_layers = layers;
  c.model.n_heads = heads;
  c.model.n_kv_heads = kv;
  c.model.ffn_dim = ffn;
  c.model.vocab = vocab;
  c.model.rope_theta = 10000.0;  // the peer's RoPE base
  c.model.dtype = DType::kF32;
  c.seq = seq;
  c.batch = batch;
  return c;
}

// A counter-based generator (splitmix64): fast enough to fill a 7b model on the host.
constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;

struct SplitMix {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += kSplitMixGamma);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return double(Next() >> 11) * 0x1.0p-53; }
};

}  // namespace

int64_t LlamaBenchConfig::Parameters() const {
  const graph::LlamaConfig& m = model;
  const int64_t hd = m.head_dim();
  const int64_t attn = m.dim * m.n_heads * hd * 2 + m.dim * m.n_kv_heads * hd * 2;
  const int64_t ffn = 3 * m.dim * m.ffn_dim;
  return m.n_layers * (attn + ffn + 2 * m.dim) + 2 * m.vocab * m.dim + m.dim;
}

double LlamaBenchConfig::FlopsPerToken() const {
  return 6.0 * double(Parameters()) + 12.0 * double(model.n_layers) * double(model.dim) * double(seq);
}

absl::StatusOr<LlamaBenchConfig> LlamaBenchConfigNamed(const std::string& name) {
  if (name == "124m") return Make(name, 768, 12, 12, 12, 2048, 32000, 1024, 16);
  if (name == "1b") return Make(name, 2048, 16, 32, 8, 8192, 32000, 2048, 8);
  if (name == "7b") return Make(name, 4096, 32, 32, 32, 11008, 32000, 4096, 2);
  if (name == "tiny") return Make(name, 128, 2, 2, 1, 256, 512, 64, 2);
  return absl::InvalidArgumentError(
      absl::StrCat("llama config: expected one of 124m, 1b, 7b, tiny; found '", name, "'"));
}

CompileOptions LlamaStepOptions(const LlamaBenchConfig& c, Device device, RecomputePolicy recompute) {
  CompileOptions o;
  o.device = device;
  o.precision = Precision::kBF16Mixed;
  o.recompute = recompute;
  o.binding = {{"batch", c.batch}, {"seq", c.seq}};
  o.adamw.beta1 = 0.9;
  o.adamw.beta2 = 0.95;
  o.adamw.weight_decay = 0.1;
  o.adamw.max_grad_norm = 1.0;
  return o;
}

absl::Status InitLlamaParameters(CompiledStep& step, const graph::Graph& forward, uint64_t seed) {
  // Full (global) shapes from the model graph: a sharded step's View is only this rank's shard.
  std::map<std::string, Shape> shapes;
  for (const graph::Node& n : forward.nodes()) {
    if (n.op != graph::OpKind::kParameter) continue;
    Shape s;
    for (const graph::Dim& d : forward.type(n.outputs[0]).shape) {
      if (!d.is_constant()) return absl::InvalidArgumentError("InitLlamaParameters: a parameter has a symbolic shape");
      s.push_back(d.value());
    }
    shapes[graph::AttrString(n, "name")] = s;
  }
  SplitMix rng{seed};
  for (const std::string& name : step.parameter_names()) {
    auto it = shapes.find(name);
    if (it == shapes.end()) return absl::NotFoundError(absl::StrCat("InitLlamaParameters: no parameter '", name, "' in the model graph"));
    const Shape& shape = it->second;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<float> host(static_cast<size_t>(numel));
    if (shape.size() == 1) {
      for (float& v : host) v = 1.0f;
    } else {
      // Box-Muller, two normals from two draws. SplitMix's k-th draw only depends on its start
      // state + k steps, so the threads jump to their pair and the values do not depend on them.
      const int64_t pairs = (int64_t(host.size()) + 1) / 2;
      const uint64_t start = rng.s;
      ParallelFor(pairs, 1 << 16, [&](int64_t begin, int64_t end) {
        SplitMix r{start + uint64_t(2 * begin) * kSplitMixGamma};
        for (int64_t p = begin; p < end; ++p) {
          const size_t i = size_t(2 * p);
          const double u1 = std::max(r.Uniform(), 1e-300), u2 = r.Uniform();
          const double radius = 0.02 * std::sqrt(-2.0 * std::log(u1));
          host[i] = float(radius * std::cos(2 * M_PI * u2));
          if (i + 1 < host.size()) host[i + 1] = float(radius * std::sin(2 * M_PI * u2));
        }
      });
      rng.s = start + uint64_t(2 * pairs) * kSplitMixGamma;
    }
    SG_RETURN_IF_ERROR(step.Write(name, TensorView(host.data(), DType::kF32, shape, Device::Cpu())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, Tensor>> RandomTokenBatch(const LlamaBenchConfig& c, uint64_t seed) {
  SplitMix rng{seed};
  std::map<std::string, Tensor> batch;
  for (const char* name : {"tokens", "targets"}) {
    SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({c.batch, c.seq}, DType::kI32, Device::Cpu()));
    int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = int32_t(rng.Next() % uint64_t(c.model.vocab));
    batch[name] = std::move(t);
  }
  return batch;
}

}  // namespace sg::compiler
