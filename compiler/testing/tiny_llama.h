// A tiny Llama forward graph for the compiler's tests (the real model lives in graph/models once
// it lands): embedding, per layer RMSNorm -> GQA attention with RoPE -> residual, RMSNorm ->
// SwiGLU MLP -> residual, final RMSNorm, LM head (untied, or `tied`: the embedding table),
// mean cross-entropy.
//
//   SG_ASSIGN_OR_RETURN(graph::Graph g, TinyLlama({}));
//   // inputs "tokens", "targets": i32[batch, seq]; output "loss"
#ifndef SGTRAIN_COMPILER_TESTING_TINY_LLAMA_H_
#define SGTRAIN_COMPILER_TESTING_TINY_LLAMA_H_

#include <map>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "graph/interpreter.h"
#include "graph/ir.h"

namespace sg::compiler::testing {

struct TinyLlamaConfig {
  int64_t vocab = 32, dim = 16, layers = 2, heads = 2, kv_heads = 1, ffn = 24;
  double eps = 1e-5, rope_theta = 10000.0;
  bool tied = false;  // the LM head is tok_embeddings.weight (no output.weight)
};

absl::StatusOr<graph::Graph> TinyLlama(const TinyLlamaConfig& c);

// Random parameters (normal-ish scale 0.3, norm weights around 1) for every trainable parameter
// of `g`, as the interpreter's host tensors keyed by name.
graph::Feeds RandomParameters(const graph::Graph& g, std::mt19937_64& rng);

// tokens/targets i32[batch, seq] uniform in [0, vocab).
graph::Feeds RandomBatch(int64_t batch, int64_t seq, int64_t vocab, std::mt19937_64& rng);

}  // namespace sg::compiler::testing

#endif  // SGTRAIN_COMPILER_TESTING_TINY_LLAMA_H_
