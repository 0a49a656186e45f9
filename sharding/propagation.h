// Sharding propagation: for one IR node and the placements its inputs currently have, the
// placements each input must have when the op runs (any difference is a redistribution the plan
// inserts before the node), the placements of its outputs, and any collective the op's sharded
// kernel must run inside itself (vocabulary-parallel cross-entropy's max/sum all-reduces).
//
//   SG_ASSIGN_OR_RETURN(OpSharding s, Propagate(node, in_types, {{S(0)}, {R}}, mesh));
//   // s.inputs[i]: required placements of input i; s.outputs[j]: placements of output j.
//
// Rules work one mesh dim at a time (the placements on different mesh dims are independent: each
// mesh dim splits, replicates or partially sums the tensor that the previous dims left). Every op
// of the closed set in graph/ops.h has a rule; an op/placement combination without a cheaper rule
// falls back to Replicate on that mesh dim, which is always correct. The rules, per mesh dim:
//   sources (parameter/input/fill)   output R; the strategy assigns sources' placements.
//   elementwise unary                S(d)->S(d); P(sum|avg) kept by linear ops (neg, scale, cast),
//                                    P(max) kept by cast and scale(factor>=0); otherwise R.
//   add/sub/mul/div (suffix bcast)   a shard on an output dim is followed by both operands (an
//                                    operand without that dim stays R); add/sub of partials stays
//                                    P (a replicated operand becomes P by zeroing); mul keeps P in
//                                    one operand with the other R; div only in the numerator.
//   *_backward of pointwise ops      shards followed; linear in the cotangent, so P(dy) with R
//   (silu, swiglu, log_softmax)      forward values gives P outputs. log_softmax needs the last dim.
//   matmul                           a S(lead) x b R -> S(lead) (data parallel); a R x b S(N) ->
//                                    S(last) (column parallel); a S(K) x b S(K) -> P(sum) (row
//                                    parallel); a/b P x R -> P. Conflicts (a S(lead) x b S(..))
//                                    follow the mesh dim's ConflictPolicy: gather the weight (FSDP)
//                                    or move the activation (Megatron). trans_a (weight grads):
//                                    both S(lead) -> P(sum); a S(M) -> S(0); b S(N) -> S(1).
//                                    bias follows the output's last dim (P: zeroed off rank 0).
//   rmsnorm, add_rmsnorm (+bwd)      need R on the normalized (last) dim: S(lead) kept, else R;
//                                    add_rmsnorm takes the residual's S(lead), so a P branch output
//                                    is reduce-scattered into it (sequence parallel). dw is P(sum).
//   rope                             S(batch|heads) and P kept; S(seq) -> R (positions are global).
//   attention (+bwd)                 all of q,k,v S(0) (batch) or S(2) (heads; q and kv heads both
//                                    divisible by the mesh dim, which keeps GQA's grouping local).
//   embedding                        table S(0) (vocab-parallel) x ids R -> P(sum) (rows outside the
//                                    range are zero); table S(1) -> S(last); ids S(d) x table R ->
//                                    S(d). Backward: S(lead) -> P(sum) dtable; S(last) -> S(1).
//   softmax_cross_entropy, nll_loss  rows S(d) -> P(sum) loss, internally all-reducing the count of
//   (+bwd)                           non-ignored rows so every shard divides by the global count;
//                                    vocab S(last) x targets R: internal all-reduces (max, sum of
//                                    exp, target logit) over the rows, loss R (the special rule).
//   reshape                          S(d) kept when d is the outermost dim of a merged/split group
//                                    and both ends of the group are divisible by the mesh dim;
//                                    P kept; otherwise R. transpose permutes S(d); broadcast maps it.
//   reduce_sum                       S(d) over a reduced dim -> P(sum); P(sum|avg) kept.
//   grad_norm                        shards kept (an internal sum all-reduce of the squares; the
//                                    kernel counts a replicated input once); P -> R; outputs R.
//   adamw                            g, m, v follow p's placement (P grads reduce-scatter into a
//                                    sharded p: ZeRO; all-reduce into a replicated p: DDP).
// Symbolic dims (batch, seq) are taken as divisible by the mesh; the strategy must keep them so
// (symbol multiple_of), or the runtime's TensorSpec sees an uneven split.
#ifndef SGTRAIN_SHARDING_PROPAGATION_H_
#define SGTRAIN_SHARDING_PROPAGATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace sg::sharding {

// How a mesh dim resolves a matmul/embedding whose activation and weight are sharded on it in
// incompatible ways. kGatherWeights: all-gather the weight (data-parallel dims: FSDP, ZeRO-3).
// kMoveActivations: keep the weight sharded and redistribute the activation (Megatron TP / SP).
enum class ConflictPolicy : uint8_t { kGatherWeights, kMoveActivations };

struct PropagationOptions {
  // One per mesh dim; empty means kGatherWeights everywhere.
  std::vector<ConflictPolicy> policy;
};

// A collective the sharded kernel runs inside itself on one mesh dim (not a redistribution).
struct InternalCollective {
  ReduceOp op = ReduceOp::kSum;
  int mesh_dim = 0;
  graph::Dim elements;  // elements all-reduced, before dividing by `divisor`
  int divisor = 1;      // product of the mesh dims that shard those elements' rows
  std::string what;     // "row max of vocab-parallel logits"
};

struct OpSharding {
  std::vector<Placements> inputs;   // required placements, one per node input
  std::vector<Placements> outputs;  // one per node output
  std::vector<InternalCollective> internal;
};

// Applies `node`'s rule. `input_types` and `input_placements` have one entry per node input, each
// placement list one entry per mesh dim. InvalidArgument when the counts disagree or a placement
// shards a dim beyond its input's rank.
absl::StatusOr<OpSharding> Propagate(const graph::Node& node,
                                     const std::vector<graph::Type>& input_types,
                                     const std::vector<Placements>& input_placements,
                                     const DeviceMesh& mesh, const PropagationOptions& options = {});

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_PROPAGATION_H_
