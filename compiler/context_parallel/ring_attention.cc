// Ring attention: the ring schedule over kernels/attention's block forward/backward and merge.
//
// Forward, rank r, steps j = 0 .. cp-1 (block of owner o = r - j mod cp in kv[j % 2]):
//   1. j < cp-1: exchange: send kv[j % 2] to r+1, receive owner o-1's block into kv[(j+1) % 2]
//   2. attention of each local query chunk on each chunk of the block (skipping pairs the causal
//      mask hides entirely), merged into the running (out, lse) of that query chunk
//   3. wait for the exchange (host) / order the compute stream after it (device)
// Backward, same ring; dacc[j % 2] is owner o's dK/dV accumulator, which arrives from r-1:
//   1. j < cp-1: exchange the key/value block as in the forward (tag)
//   2. per chunk pair: block backward with the global lse and delta; dq summed locally, this
//      rank's dk/dv part summed into `contrib`
//   3. wait for step 1 and for the accumulator exchange of step j-1; dacc[j % 2] += contrib
//   4. exchange: send dacc[j % 2] to r+1, receive owner o-1's accumulator into dacc[(j+1) % 2]
//      (tag + 1); after the last step the accumulator received is this rank's own, complete.
// Ranks issue exchanges in the same order, so NCCL's in-order matching pairs them correctly.
#include "compiler/context_parallel/ring_attention.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/context_parallel/cp_layout.h"
#include "kernels/attention/attention.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"

namespace sg::compiler {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

struct Dims {
  int64_t batch = 0, local = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

// A view of `count` elements of `buf` starting at element `offset`, with `shape`.
TensorView Sub(const Tensor& buf, int64_t offset, Shape shape) {
  char* p = static_cast<char*>(buf.view().raw()) + offset * SizeOf(buf.dtype());
  return TensorView(p, buf.dtype(), std::move(shape), buf.device());
}

// A key/value block (or its dK/dV accumulator) of one owner inside a flat buffer:
// [K chunk 0 | K chunk 1 | V chunk 0 | V chunk 1], each [batch, chunk, kv_heads, head_dim].
struct BlockViews {
  std::array<TensorView, 2> k, v;
  TensorView all;  // exactly the block's elements, for the transfer
};

BlockViews Block(const Tensor& buf, const CpLayout& layout, int owner, const Dims& d) {
  BlockViews b;
  const auto chunks = layout.Chunks(owner);
  const int64_t row = d.batch * d.kv_heads * d.head_dim;  // elements per sequence row
  const int64_t n0 = layout.ChunkSize(chunks[0]), n1 = layout.ChunkSize(chunks[1]);
  const int64_t kv_elems = (n0 + n1) * row;
  b.k[0] = Sub(buf, 0, {d.batch, n0, d.kv_heads, d.head_dim});
  b.k[1] = Sub(buf, n0 * row, {d.batch, n1, d.kv_heads, d.head_dim});
  b.v[0] = Sub(buf, kv_elems, {d.batch, n0, d.kv_heads, d.head_dim});
  b.v[1] = Sub(buf, kv_elems + n0 * row, {d.batch, n1, d.kv_heads, d.head_dim});
  b.all = Sub(buf, 0, {2 * kv_elems});
  return b;
}

// Elements of the largest block of any owner (each buffer must hold every owner's block).
int64_t MaxBlockElems(const CpLayout& layout, const Dims& d) {
  int64_t most = 0;
  for (int o = 0; o < layout.cp(); ++o) most = std::max(most, layout.LocalSeq(o));
  return 2 * most * d.batch * d.kv_heads * d.head_dim;
}

// Splits a local [batch, local, ...] tensor (or [batch, heads, local] along dim 2) into its two
// chunks, each a new contiguous tensor.
absl::StatusOr<std::array<Tensor, 2>> SplitChunks(const TensorView& t, const CpLayout& layout, int rank,
                                                  int seq_dim, const Stream& stream) {
  std::array<Tensor, 2> out;
  int64_t row = 0;
  for (int i = 0; i < 2; ++i) {
    Shape s = t.shape();
    s[size_t(seq_dim)] = layout.ChunkSize(layout.Chunks(rank)[size_t(i)]);
    SG_ASSIGN_OR_RETURN(out[size_t(i)], Tensor::Empty(s, t.dtype(), t.device()));
    SG_RETURN_IF_ERROR(CopySeqRange(t, row, out[size_t(i)], 0, s[size_t(seq_dim)], seq_dim, stream));
    row += s[size_t(seq_dim)];
  }
  return out;
}

absl::Status JoinChunks(const std::array<Tensor, 2>& parts, int seq_dim, const TensorView& t,
                        const Stream& stream) {
  int64_t row = 0;
  for (const Tensor& p : parts) {
    const int64_t n = p.shape()[size_t(seq_dim)];
    SG_RETURN_IF_ERROR(CopySeqRange(p, 0, t, row, n, seq_dim, stream));
    row += n;
  }
  return absl::OkStatus();
}

// One query chunk x key chunk pair: the kernel options, or nullopt when the causal mask hides
// every key from every query (nothing to compute).
std::optional<kernels::AttentionOptions> PairOptions(const RingAttentionOptions& o, const CpLayout& layout,
                                                     int q_chunk, int k_chunk) {
  const int64_t q0 = layout.ChunkBegin(q_chunk), qn = layout.ChunkSize(q_chunk);
  const int64_t k0 = layout.ChunkBegin(k_chunk), kn = layout.ChunkSize(k_chunk);
  if (qn == 0 || kn == 0) return std::nullopt;
  if (o.causal && k0 > q0 + qn - 1) return std::nullopt;
  kernels::AttentionOptions a;
  a.causal = o.causal;
  a.scale = o.scale;
  a.q_offset = q0;
  a.k_offset = k0;
  return a;
}

// A started exchange: host requests to wait for (device requests complete on the comm stream).
struct Exchange {
  std::vector<comm::Request> reqs;
  std::string what;
  bool active = false;
  bool device = false;  // completes on the transport's stream: ordered by events, not waited
};

absl::StatusOr<Exchange> StartExchange(comm::ProcessGroup& pg, const TensorView& send, const TensorView& recv,
                                       uint64_t tag, const Stream& stream, std::string what) {
  Exchange x;
  const int me = pg.rank(), n = pg.size();
  SG_ASSIGN_OR_RETURN(auto reqs, pg.SendRecv(send, Mod(me + 1, n), recv, Mod(me - 1, n), tag, stream));
  x.reqs.push_back(std::move(reqs.first));
  x.reqs.push_back(std::move(reqs.second));
  x.what = std::move(what);
  x.active = true;
  x.device = !send.device().is_cpu();
  return x;
}

// Lets host transfers progress between blocks (UCX moves data only when polled).
void Poll(Exchange& x) {
  if (!x.active || x.device) return;
  for (comm::Request& r : x.reqs) (void)r.Test();
}

absl::Status FinishExchange(comm::ProcessGroup& pg, Exchange& x, const RingAttentionOptions& o,
                            const Stream& stream) {
  if (!x.active) return absl::OkStatus();
  x.active = false;
  if (x.device) return pg.OrderAfterP2P(stream);
  const absl::Time deadline = absl::Now() + o.timeout;
  for (size_t i = 0; i < x.reqs.size(); ++i) {
    absl::Status s = x.reqs[i].Wait(deadline);
    if (!s.ok()) {
      const int peer = Mod(pg.rank() + (i == 0 ? 1 : -1), pg.size());
      return absl::Status(s.code(), absl::StrCat(pg.name(), " ring attention ", x.what, ": ",
                                                 i == 0 ? "send to" : "receive from", " rank ", peer,
                                                 " failed: ", s.message()));
    }
  }
  return pg.OrderAfterP2P(stream);
}

absl::StatusOr<Dims> CheckInputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const RingAttentionOptions& o, const comm::ProcessGroup& pg,
                                 const CpLayout& layout, absl::string_view op) {
  SG_CHECK_ARG(q.rank() == 4 && k.rank() == 4, op, ": q and k must be [batch, local_seq, heads, head_dim], found ",
               q.ToString(), " and ", k.ToString());
  Dims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  const int64_t want = layout.LocalSeq(pg.rank());
  SG_CHECK_ARG(d.local == want, op, ": rank ", pg.rank(), " of ", pg.size(), " holds ", want,
               " rows of a sequence of ", o.seq, " (chunks ", layout.Chunks(pg.rank())[0], " and ",
               layout.Chunks(pg.rank())[1], "), found q ", q.ToString());
  SG_RETURN_IF_ERROR(ExpectTensor(k, absl::StrCat(op, " k"), q.dtype(), {d.batch, d.local, d.kv_heads, d.head_dim},
                                  q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(v, absl::StrCat(op, " v"), q.dtype(), k.shape(), q.device()));
  SG_CHECK_ARG(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), op, ": tensors must be contiguous");
  return d;
}

}  // namespace

absl::Status RingAttentionForward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const RingAttentionOptions& options, comm::ProcessGroup& pg,
                                  const TensorView& out, const TensorView& lse, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(CpLayout layout, CpLayout::Create(options.seq, pg.size()));
  SG_ASSIGN_OR_RETURN(Dims d, CheckInputs(q, k, v, options, pg, layout, "ring attention forward"));
  SG_RETURN_IF_ERROR(ExpectTensor(out, "ring attention forward out", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(lse, "ring attention forward lse", DType::kF32, {d.batch, d.heads, d.local},
                                  q.device()));
  const int me = pg.rank(), cp = pg.size();
  const auto my_chunks = layout.Chunks(me);

  SG_ASSIGN_OR_RETURN(auto qc, SplitChunks(q, layout, me, 1, stream));
  std::array<Tensor, 2> oc, lc, tmp_o, tmp_l;
  for (int i = 0; i < 2; ++i) {
    const int64_t n = layout.ChunkSize(my_chunks[size_t(i)]);
    SG_ASSIGN_OR_RETURN(oc[size_t(i)], Tensor::Empty({d.batch, n, d.heads, d.head_dim}, q.dtype(), q.device()));
    SG_ASSIGN_OR_RETURN(lc[size_t(i)], Tensor::Empty({d.batch, d.heads, n}, DType::kF32, q.device()));
    SG_ASSIGN_OR_RETURN(tmp_o[size_t(i)], Tensor::Empty({d.batch, n, d.heads, d.head_dim}, q.dtype(), q.device()));
    SG_ASSIGN_OR_RETURN(tmp_l[size_t(i)], Tensor::Empty({d.batch, d.heads, n}, DType::kF32, q.device()));
  }
  std::array<Tensor, 2> kv;
  for (Tensor& b : kv) {
    SG_ASSIGN_OR_RETURN(b, Tensor::Empty({MaxBlockElems(layout, d)}, q.dtype(), q.device()));
  }
  {
    BlockViews mine = Block(kv[0], layout, me, d);
    const int64_t n0 = mine.k[0].dim(1);
    SG_RETURN_IF_ERROR(CopySeqRange(k, 0, mine.k[0], 0, n0, 1, stream));
    SG_RETURN_IF_ERROR(CopySeqRange(k, n0, mine.k[1], 0, mine.k[1].dim(1), 1, stream));
    SG_RETURN_IF_ERROR(CopySeqRange(v, 0, mine.v[0], 0, n0, 1, stream));
    SG_RETURN_IF_ERROR(CopySeqRange(v, n0, mine.v[1], 0, mine.v[1].dim(1), 1, stream));
  }

  std::array<bool, 2> has = {false, false};
  for (int j = 0; j < cp; ++j) {
    const int owner = Mod(me - j, cp);
    const bool skip = options.skip_exchanges;
    const Tensor& cur = kv[skip ? 0 : size_t(j % 2)];
    BlockViews blk = Block(cur, layout, owner, d);
    Exchange x;
    if (j < cp - 1 && !skip) {
      BlockViews next = Block(kv[size_t((j + 1) % 2)], layout, Mod(owner - 1, cp), d);
      SG_ASSIGN_OR_RETURN(x, StartExchange(pg, blk.all, next.all, options.tag, stream,
                                           absl::StrCat("forward step ", j, " key/value block")));
    }
    const auto kv_chunks = layout.Chunks(owner);
    for (int qi = 0; qi < 2; ++qi) {
      for (int ki = 0; ki < 2; ++ki) {
        auto opt = PairOptions(options, layout, my_chunks[size_t(qi)], kv_chunks[size_t(ki)]);
        if (!opt) continue;
        const size_t i = size_t(qi);
        if (!has[i]) {
          SG_RETURN_IF_ERROR(kernels::AttentionForward(qc[i], blk.k[size_t(ki)], blk.v[size_t(ki)], *opt, oc[i],
                                                       lc[i], stream));
          has[i] = true;
        } else {
          SG_RETURN_IF_ERROR(kernels::AttentionForward(qc[i], blk.k[size_t(ki)], blk.v[size_t(ki)], *opt, tmp_o[i],
                                                       tmp_l[i], stream));
          SG_RETURN_IF_ERROR(kernels::AttentionMerge(oc[i], lc[i], tmp_o[i], tmp_l[i], oc[i], lc[i], stream));
        }
        Poll(x);
      }
    }
    SG_RETURN_IF_ERROR(FinishExchange(pg, x, options, stream));
  }
  SG_RETURN_IF_ERROR(JoinChunks(oc, 1, out, stream));
  return JoinChunks(lc, 2, lse, stream);
}

absl::Status RingAttentionBackward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout, const TensorView& lse,
                                   const RingAttentionOptions& options, comm::ProcessGroup& pg,
                                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const Stream& stream) {
  SG_ASSIGN_OR_RETURN(CpLayout layout, CpLayout::Create(options.seq, pg.size()));
  SG_ASSIGN_OR_RETURN(Dims d, CheckInputs(q, k, v, options, pg, layout, "ring attention backward"));
  SG_RETURN_IF_ERROR(ExpectTensor(out, "ring attention backward out", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dout, "ring attention backward dout", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dq, "ring attention backward dq", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dk, "ring attention backward dk", q.dtype(), k.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dv, "ring attention backward dv", q.dtype(), k.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(lse, "ring attention backward lse", DType::kF32, {d.batch, d.heads, d.local},
                                  q.device()));
  const int me = pg.rank(), cp = pg.size();
  const auto my_chunks = layout.Chunks(me);

  SG_ASSIGN_OR_RETURN(auto qc, SplitChunks(q, layout, me, 1, stream));
  SG_ASSIGN_OR_RETURN(auto oc, SplitChunks(out, layout, me, 1, stream));
  SG_ASSIGN_OR_RETURN(auto doc, SplitChunks(dout, layout, me, 1, stream));
  SG_ASSIGN_OR_RETURN(auto lc, SplitChunks(lse, layout, me, 2, stream));
  std::array<Tensor, 2> delta, dqc, tmp_dq;
  for (int i = 0; i < 2; ++i) {
    const size_t s = size_t(i);
    SG_ASSIGN_OR_RETURN(delta[s], Tensor::Empty(lc[s].shape(), DType::kF32, q.device()));
    SG_RETURN_IF_ERROR(kernels::AttentionBackwardDelta(oc[s], doc[s], delta[s], stream));
    SG_ASSIGN_OR_RETURN(dqc[s], Tensor::Empty(qc[s].shape(), q.dtype(), q.device()));
    SG_RETURN_IF_ERROR(ZeroTensor(dqc[s], stream));
    SG_ASSIGN_OR_RETURN(tmp_dq[s], Tensor::Empty(qc[s].shape(), q.dtype(), q.device()));
  }
  const int64_t block_elems = MaxBlockElems(layout, d);
  std::array<Tensor, 2> kv, dacc;
  Tensor contrib, tmp_dkv;
  for (Tensor* b : {&kv[0], &kv[1], &dacc[0], &dacc[1], &contrib, &tmp_dkv}) {
    SG_ASSIGN_OR_RETURN(*b, Tensor::Empty({block_elems}, q.dtype(), q.device()));
  }
  {
    BlockViews mine = Block(kv[0], layout, me, d);
    const int64_t n0 = mine.k[0].dim(1);
    SG_RETURN_IF_ERROR(CopySeqRange(k, 0, mine.k[0], 0, n0, 1, stream));
    SG_RETURN_IF_ERROR(CopySeqRange(k, n0, mine.k[1], 0, mine.k[1].dim(1), 1, stream));
    SG_RETURN_IF_ERROR(CopySeqRange(v, 0, mine.v[0], 0, n0, 1, stream));
    SG_RETURN_IF_ERROR(CopySeqRange(v, n0, mine.v[1], 0, mine.v[1].dim(1), 1, stream));
    SG_RETURN_IF_ERROR(ZeroTensor(Block(dacc[0], layout, me, d).all, stream));
  }

  Exchange acc_x;  // the accumulator exchange of the previous step
  for (int j = 0; j < cp; ++j) {
    const int owner = Mod(me - j, cp);
    const bool skip = options.skip_exchanges;
    const size_t at = skip ? 0 : size_t(j % 2);
    BlockViews blk = Block(kv[at], layout, owner, d);
    Exchange kv_x;
    if (j < cp - 1 && !skip) {
      BlockViews next = Block(kv[size_t((j + 1) % 2)], layout, Mod(owner - 1, cp), d);
      SG_ASSIGN_OR_RETURN(kv_x, StartExchange(pg, blk.all, next.all, options.tag, stream,
                                              absl::StrCat("backward step ", j, " key/value block")));
    }
    BlockViews con = Block(contrib, layout, owner, d);
    BlockViews tmp = Block(tmp_dkv, layout, owner, d);
    SG_RETURN_IF_ERROR(ZeroTensor(con.all, stream));
    const auto kv_chunks = layout.Chunks(owner);
    for (int qi = 0; qi < 2; ++qi) {
      for (int ki = 0; ki < 2; ++ki) {
        auto opt = PairOptions(options, layout, my_chunks[size_t(qi)], kv_chunks[size_t(ki)]);
        if (!opt) continue;
        const size_t i = size_t(qi), c = size_t(ki);
        SG_RETURN_IF_ERROR(kernels::AttentionBlockBackward(qc[i], blk.k[c], blk.v[c], doc[i], lc[i], delta[i],
                                                           *opt, tmp_dq[i], tmp.k[c], tmp.v[c], stream));
        SG_RETURN_IF_ERROR(kernels::Add(dqc[i], tmp_dq[i], dqc[i], stream));
        SG_RETURN_IF_ERROR(kernels::Add(con.k[c], tmp.k[c], con.k[c], stream));
        SG_RETURN_IF_ERROR(kernels::Add(con.v[c], tmp.v[c], con.v[c], stream));
        Poll(kv_x);
        Poll(acc_x);
      }
    }
    SG_RETURN_IF_ERROR(FinishExchange(pg, kv_x, options, stream));
    SG_RETURN_IF_ERROR(FinishExchange(pg, acc_x, options, stream));
    BlockViews acc = Block(dacc[at], layout, owner, d);
    SG_RETURN_IF_ERROR(kernels::Add(acc.all, con.all, acc.all, stream));
    if (cp > 1 && !skip) {
      BlockViews next_acc = Block(dacc[size_t((j + 1) % 2)], layout, Mod(owner - 1, cp), d);
      SG_ASSIGN_OR_RETURN(acc_x, StartExchange(pg, acc.all, next_acc.all, options.tag + 1, stream,
                                               absl::StrCat("backward step ", j, " dK/dV accumulator")));
    }
  }
  SG_RETURN_IF_ERROR(FinishExchange(pg, acc_x, options, stream));
  // After cp steps (cp exchanges) this rank's own accumulator is back: in dacc[cp % 2] (dacc[0]
  // when cp = 1 and nothing moved).
  BlockViews mine = Block(dacc[size_t(cp > 1 && !options.skip_exchanges ? cp % 2 : 0)], layout, me, d);
  const int64_t n0 = mine.k[0].dim(1);
  SG_RETURN_IF_ERROR(CopySeqRange(mine.k[0], 0, dk, 0, n0, 1, stream));
  SG_RETURN_IF_ERROR(CopySeqRange(mine.k[1], 0, dk, n0, mine.k[1].dim(1), 1, stream));
  SG_RETURN_IF_ERROR(CopySeqRange(mine.v[0], 0, dv, 0, n0, 1, stream));
  SG_RETURN_IF_ERROR(CopySeqRange(mine.v[1], 0, dv, n0, mine.v[1].dim(1), 1, stream));
  return JoinChunks(dqc, 1, dq, stream);
}

}  // namespace sg::compiler
