// Decisions the lowering makes across nodes of a training graph, beyond "one node, one kernel"
// (internal to the compiler). Pure graph analysis, so it is tested without running anything:
//
//   LoweringFusions f = FindLoweringFusions(train_graph);
//   if (f.fused_away.count(i)) { /* node i has no step: another node's launch computes it */ }
//
//  - Cross-entropy: softmax_cross_entropy and its backward on the same logits/targets, with the
//    loss cotangent a constant fill (autodiff's seed) or an f32[] input named in `device_seeds`
//    (the dynamic loss scale, read on the device), become ONE kernels/cross_entropy launch at
//    the forward node writing the loss and dlogits in one pass (grad_scale = the constant). The
//    backward node then has no step; dlogits overwrites the logits when nothing else reads them.
//  - Folded casts: a bf16 (or f16) value whose only use is a cast to f32 (a weight gradient under mixed
//    precision: matmul dW, norm dweight, embedding dtable) is written in f32 directly by its
//    producer (cuBLASLt accumulates in f32 anyway); the cast has no step and no bf16 buffer exists.
//  - Weight copies: a cast of a trainable f32 parameter to bf16 or f16 (the compute copy made by
//    ToMixedPrecision) is a persistent buffer the multi-tensor AdamW rewrites in the same pass as
//    the master weights, instead of a cast at the start of every forward. A second cast of the
//    same parameter (recompute clones casts into the backward) reads that copy: no step, no buffer.
//  - LM head in blocks of tokens (FindLoweringFusions' lm_head_chunks > 1): the logits matmul
//    (h @ W^T), the fused cross-entropy and the two matmuls that read its dlogits (dh = dlogits @ W,
//    dW = dlogits^T @ h, in f32) become ONE launch at the cross-entropy node that runs them a block
//    of tokens at a time (kernels/cross_entropy's Count / Rows / Finish, dW accumulated over the
//    blocks), so the [tokens, vocab] logits never exist: their buffer holds one block, only during
//    that launch. The same loss, valid count and dh rows as the unchunked step; dW summed over the
//    blocks in f32. Found only where the pattern is exactly that (no other reader of the logits or
//    dlogits, no epilogues, dW written in f32). The backward's matmuls may read a recompute clone
//    of W's cast or of x (selective recompute's rmsnorm of the kept sum): the launch reads the
//    forward's x and W, whose lifetimes the lowering extends to it.
//  - bf16 gradients (FindLoweringFusions' bf16_gradients): a folded cast whose producer is a plain
//    matmul (a weight gradient dW) and whose f32 output only the optimizer reads (adamw's gradient,
//    grad_norm, the "grad:<param>" output), or only the runtime (an output no node reads: FSDP's
//    reduce-scatters), is dropped instead: dW stays in bf16, which the
//    multi-tensor AdamW and GradNorm read directly (f32 arithmetic, as they read f32). These are the
//    values PyTorch's autocast gives its f32 parameters' .grad (the bf16 product, cast to f32), in
//    half the bytes: the GEMM writes 2 bytes an element instead of 4, the norm and AdamW read 2.
//    Norm weights, the embedding and the chunked LM head's dW (summed over blocks) keep f32.
//  - SwiGLU backward with its dh matmul (FindLoweringFusions' swiglu_backward_gemm): the down
//    projection's data gradient dh = dy @ W2 (a plain matmul, W2 [D, F]) whose only reader is a
//    swiglu_backward becomes ONE launch at the swiglu_backward node
//    (kernels/wgmma_gemm's WgmmaGemmSwiGluBackward, after W2 is transposed into a [F, D] scratch),
//    so dh never exists. Found structurally here; the lowering keeps only the pairs the kernel
//    runs (shapes, bf16, the GPU) and extends dy's and W2's lives to the launch.
//  - In place: outputs that may overwrite an input whose last reader they are (kernel contracts
//    allow it): add_rmsnorm's residual h over x, add_rmsnorm_backward's dx over the incoming
//    residual gradient, an elementwise add over its first operand, swiglu_backward's dgate and dup
//    over gate and up. The lowering checks the
//    last-reader condition; this only lists the candidates.
#ifndef SGTRAIN_COMPILER_LOWERING_FUSION_H_
#define SGTRAIN_COMPILER_LOWERING_FUSION_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"

namespace sg::compiler {

struct LoweringFusions {
  std::map<int, int> cross_entropy;             // forward node -> its fused backward node
  std::map<int, float> cross_entropy_scale;     // backward node -> constant loss cotangent
  // backward node -> the f32[] input value seeding it, which the kernel reads from the device when
  // it runs (capturable): the inputs named in FindLoweringFusions' `device_seeds` ("loss_scale"
  // under dynamic loss scaling; fused with the forward) and, added by the lowering,
  // LowerOptions::device_scalars (the data-parallel token share; left unfused)
  std::map<int, int> cross_entropy_device_scale;
  // backward node -> host address of its loss cotangent (LowerOptions::host_scalars; filled by the
  // lowering, not by FindLoweringFusions), read at each launch
  std::map<int, const float*> cross_entropy_host_scale;
  std::map<int, int> folded_cast;               // bf16 value -> the f32 cast output it is written as
  std::map<int, int> bf16_gradient;             // f32 cast output (a gradient) -> the bf16 value it stays
  std::map<int, int> weight_copy;               // bf16 cast output -> the f32 parameter value
  std::map<int, int> duplicate_copy;            // a recomputed cast of a parameter -> its weight copy
  std::vector<std::pair<int, int>> in_place;    // (output value, input value), in node order
  std::set<int> fused_away;                     // nodes without a step of their own (CE backward, folded casts)
  struct LmHead {
    int matmul = -1, cross_entropy = -1, dx = -1, dw = -1;  // node indices
    int chunks = 1;
  };
  std::optional<LmHead> lm_head;
  std::map<int, int> swiglu_backward_gemm;     // swiglu_backward node -> the matmul computing its dh
};

LoweringFusions FindLoweringFusions(const graph::Graph& g, const std::set<std::string>& device_seeds = {},
                                    int lm_head_chunks = 1, bool swiglu_backward_gemm = false,
                                    bool bf16_gradients = false);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_LOWERING_FUSION_H_
