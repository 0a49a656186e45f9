// The per-rank graph of Megatron-style tensor parallelism (compiler/tensor_parallel.h runs it),
// derived from placements, not from the model: the forward + backward of a data-parallel graph
// (compiler/data_parallel_graph.h) is propagated over a 1-D "tp" mesh with the sharding layer's
// rules (sharding/propagation.h), starting from the tp strategy's parameter placements
// (sharding/strategy.h: column-parallel wq/wk/wv/w1/w3 S(out features), row-parallel wo/w2
// S(in features), the rest R), and every value gets its local (per-rank) shape.
//
//   SG_ASSIGN_OR_RETURN(DataParallelGraph dp, SplitOptimizer(train_step));
//   SG_ASSIGN_OR_RETURN(TensorParallelGraph tp, BuildTensorParallelGraph(dp, /*tp_size=*/2, rank));
//   // tp.graph: this rank's graph (heads and ffn columns split); tp.all_reduces: where the
//   // partial sums are summed over the tp group
//
// What the propagation gives on a Llama block (per tp rank: heads/T attention heads, ffn/T):
//   forward   xn R -> xn @ wq^T (S(0) weight) -> q S(heads) ... attention S(heads) ->
//             a @ wo^T (S(1) weight, contracted) -> P(sum) -> all-reduce -> R residual stream;
//   backward  dq S(heads) @ wq -> P(sum); the P(sum) cotangents of q, k, v add up (add keeps P)
//             and are all-reduced once, before the norm's backward needs R; weight gradients
//             come out in their weight's placement (S(0) / S(1)), replicated weights' R.
// Where propagation would turn a replicated operand partial to add it to a partial sum (the
// residual gradient, or dy into a norm's backward, which is linear in dy), the partial sum is
// all-reduced first instead: one all-reduce, no zeroed copy. A partial sum and its reshapes share
// a buffer, so they are summed together.
// The residual added in a row-parallel matmul's epilogue (R into a P(sum) output: "R -> P by
// zeroing off rank 0") is kept on tp rank 0 and dropped from the matmul on the others.
// Vocabulary parallelism (Megatron; TensorParallelGraphOptions::vocab_parallel, the default):
// the token embedding table and the LM head are S(0) over the vocabulary (a tied table is one
// parameter with one placement for both uses). The embedding's output is a partial sum (each rank
// looks up the ids in its range, zeros elsewhere) all-reduced like a row-parallel output; the
// logits come out S(vocab) and softmax_cross_entropy (and its backward) run on the shard: the
// nodes listed in vocab_ops, whose launches the runtime replaces with kernels/vocab_parallel (an
// all-gather of 3 floats per token between two kernels). The full-vocabulary logits never exist
// on a rank. A vocabulary that T does not divide is split unevenly as torch.chunk (sharding's
// Chunk: ceil(V/T) rows per rank, the last ranks fewer), never padded: no padded logits to mask.
// With vocab_parallel false they stay replicated (the placements demoted to R).
// Every other redistribution (an all-gather, all-to-all, a partial from a replicated value that
// is not an epilogue) is Unimplemented naming the node: the runtime lowers all-reduces only.
#ifndef SGTRAIN_COMPILER_TENSOR_PARALLEL_GRAPH_H_
#define SGTRAIN_COMPILER_TENSOR_PARALLEL_GRAPH_H_

#include <climits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/data_parallel_graph.h"
#include "graph/ir.h"
#include "kernels/core/shape.h"

namespace sg::compiler {

// A partial sum (P(sum) on the tp dim) the runtime all-reduces in place over the tp group.
struct TpAllReduce {
  int value = -1;        // value id in TensorParallelGraph::graph
  int issue_after = -1;  // node index: its producer, or its last reader that reads the partial sum
  int needed_by = INT_MAX;  // node index of its first reader needing the sum; INT_MAX: a graph output
  std::string where;     // "layers.0.attention matmul output (P(sum) -> R before rmsnorm)"
};

struct TpParam {
  std::string name;
  int dim = -1;  // tensor dim split over the tp group; -1: replicated
  Shape global, local;  // local[dim]: this rank's sharding::Chunk(global[dim], T, rank) (even unless vocab)
  double weight_decay = 0;
};

// A node of the per-rank graph that runs on this rank's vocabulary shard [start, start + length)
// of [0, vocab): embedding / embedding_backward (table rows), softmax_cross_entropy(_backward)
// (logit columns). Its lowered launch is not valid as is: the runtime replaces it.
struct TpVocabOp {
  int node = -1;  // node index in TensorParallelGraph::graph
  graph::OpKind op = graph::OpKind::kEmbedding;
  int64_t start = 0, length = 0, vocab = 0;
};

struct TensorParallelGraphOptions {
  bool vocab_parallel = true;  // shard the embedding and LM head over the vocabulary (else R)
  // Keep each "<p>@bwd" copy as its own (non-trainable) parameter of the local shape, for a
  // runtime that gathers parameters separately for backward (FSDP x TP); else it reads <p>.
  bool keep_backward_copies = false;
};

struct TensorParallelGraph {
  graph::Graph graph;  // this rank's forward + backward: outputs the loss and "grad:<p>" (local)
  std::vector<TpParam> params;  // dp.params' order
  std::vector<TpAllReduce> all_reduces;  // in issue order
  int dropped_residuals = 0;  // row-parallel epilogues dropped on this rank (0 on tp rank 0)
  std::vector<TpVocabOp> vocab_ops;  // in node order; empty without vocabulary parallelism
  // "tp=2: 8 of 17 parameters split (column 6, row 4), 8 all-reduces (4 forward, 4 backward)"
  std::string Summary() const;
};

// `dp`: SplitOptimizer's graph of a prepared training step. Every "<p>@bwd" copy reads <p> again
// (TP keeps its shard resident) unless options.keep_backward_copies. InvalidArgument, saying what was expected and found, when a
// split extent is not divisible by tp_size (attention q/kv heads, ffn, a symbolic dim);
// Unimplemented naming the node for a redistribution other than a partial-sum all-reduce.
// InvalidArgument when a vocabulary split would leave a rank no rows (vocab < about T).
absl::StatusOr<TensorParallelGraph> BuildTensorParallelGraph(const DataParallelGraph& dp, int tp_size,
                                                             int tp_rank,
                                                             const TensorParallelGraphOptions& options = {});

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TENSOR_PARALLEL_GRAPH_H_
