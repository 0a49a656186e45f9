#include "sharding/models.h"

#include "absl/strings/str_cat.h"

namespace sg::sharding {
namespace {

graph::LlamaConfig Shape(int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                         int64_t vocab) {
  graph::LlamaConfig c;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.ffn_dim = ffn;
  c.vocab = vocab;
  c.max_batch = 1 << 16;
  c.max_seq_len = 1 << 17;
  c.dtype = DType::kBF16;
  return c;
}

}  // namespace

absl::StatusOr<graph::LlamaConfig> LlamaConfigByName(absl::string_view name) {
  if (name == "tiny") return graph::LlamaConfig::Tiny();
  if (name == "124m") return Shape(768, 12, 12, 12, 2048, 32000);
  if (name == "1b") return Shape(2048, 16, 32, 8, 8192, 32000);
  if (name == "7b") return Shape(4096, 32, 32, 32, 11008, 32000);
  return absl::InvalidArgumentError(
      absl::StrCat("model: expected tiny, 124m, 1b or 7b, found '", name, "'"));
}

}  // namespace sg::sharding
