#include "sharding/redistribute_exec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::sharding {
namespace {

std::vector<int64_t> Zeros(size_t n) { return std::vector<int64_t>(n, 0); }

absl::StatusOr<Tensor> HostZeros(const Shape& shape, DType dtype) {
  SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, dtype, Device::Cpu()));
  if (t.nbytes() > 0) std::memset(t.view().raw(), 0, size_t(t.nbytes()));
  return t;
}

char* Bytes(const TensorView& t) { return static_cast<char*>(t.raw()); }

// Block k (of equal blocks) of a contiguous buffer, as a view of `shape`.
TensorView Block(const Tensor& t, int k, const Shape& shape) {
  const int64_t bytes = NumElements(shape) * SizeOf(t.dtype());
  return TensorView(Bytes(t.view()) + k * bytes, t.dtype(), shape, Device::Cpu());
}

struct StepContext {
  const RedistributeStep& step;
  TensorSpec before;  // spec with step.before placements
  int rank;
  int p;      // group size
  int coord;  // this rank's coordinate along the mesh dim
  int64_t elem;
};

absl::StatusOr<Tensor> AllGatherStep(const StepContext& c, const TensorView& x, Collectives& coll) {
  const int i = c.step.from_dim;
  const int64_t extent = c.before.ParentExtent(c.rank, c.step.mesh_dim, i);
  Shape padded = x.shape();
  padded[i] = MaxChunk(extent, c.p);
  SG_ASSIGN_OR_RETURN(Tensor send, HostZeros(padded, x.dtype()));
  CopyBox(Bytes(x), x.shape(), Zeros(x.rank()), Bytes(send.view()), padded, Zeros(x.rank()),
          x.shape(), c.elem);
  Shape all = padded;
  all[0] *= c.p;  // p blocks of `padded`
  SG_ASSIGN_OR_RETURN(Tensor recv, HostZeros(all, x.dtype()));
  SG_RETURN_IF_ERROR(coll.AllGather(c.step.mesh_dim, send.view(), recv.view()));
  Shape out_shape = x.shape();
  out_shape[i] = extent;
  SG_ASSIGN_OR_RETURN(Tensor out, HostZeros(out_shape, x.dtype()));
  for (int k = 0; k < c.p; ++k) {
    const ChunkRange r = Chunk(extent, c.p, k);
    Shape box = padded;
    box[i] = r.length;
    std::vector<int64_t> at = Zeros(x.rank());
    at[i] = r.offset;
    CopyBox(Bytes(Block(recv, k, padded)), padded, Zeros(x.rank()), Bytes(out.view()), out_shape,
            at, box, c.elem);
  }
  return out;
}

absl::StatusOr<Tensor> ReduceScatterStep(const StepContext& c, const TensorView& x,
                                         Collectives& coll) {
  const int j = c.step.to_dim;
  const int64_t extent = x.shape()[j];
  Shape block = x.shape();
  block[j] = MaxChunk(extent, c.p);
  Shape all = block;
  all[0] *= c.p;
  SG_ASSIGN_OR_RETURN(Tensor send, HostZeros(all, x.dtype()));
  for (int k = 0; k < c.p; ++k) {
    const ChunkRange r = Chunk(extent, c.p, k);
    Shape box = x.shape();
    box[j] = r.length;
    std::vector<int64_t> from = Zeros(x.rank());
    from[j] = r.offset;
    CopyBox(Bytes(x), x.shape(), from, Bytes(Block(send, k, block)), block, Zeros(x.rank()), box,
            c.elem);
  }
  SG_ASSIGN_OR_RETURN(Tensor recv, HostZeros(block, x.dtype()));
  SG_RETURN_IF_ERROR(coll.ReduceScatter(c.step.mesh_dim, send.view(), recv.view(), c.step.op));
  Shape out_shape = x.shape();
  out_shape[j] = Chunk(extent, c.p, c.coord).length;
  SG_ASSIGN_OR_RETURN(Tensor out, HostZeros(out_shape, x.dtype()));
  CopyBox(Bytes(recv.view()), block, Zeros(x.rank()), Bytes(out.view()), out_shape,
          Zeros(x.rank()), out_shape, c.elem);
  return out;
}

absl::StatusOr<Tensor> AllToAllStep(const StepContext& c, const TensorView& x, Collectives& coll) {
  const int i = c.step.from_dim, j = c.step.to_dim;
  const int64_t ei = c.before.ParentExtent(c.rank, c.step.mesh_dim, i);
  const int64_t ej = x.shape()[j];
  Shape block = x.shape();
  block[i] = MaxChunk(ei, c.p);
  block[j] = MaxChunk(ej, c.p);
  Shape all = block;
  all[0] *= c.p;
  SG_ASSIGN_OR_RETURN(Tensor send, HostZeros(all, x.dtype()));
  for (int k = 0; k < c.p; ++k) {  // block k: my i-chunk x member k's j-chunk
    const ChunkRange r = Chunk(ej, c.p, k);
    Shape box = x.shape();
    box[j] = r.length;
    std::vector<int64_t> from = Zeros(x.rank());
    from[j] = r.offset;
    CopyBox(Bytes(x), x.shape(), from, Bytes(Block(send, k, block)), block, Zeros(x.rank()), box,
            c.elem);
  }
  SG_ASSIGN_OR_RETURN(Tensor recv, HostZeros(all, x.dtype()));
  SG_RETURN_IF_ERROR(coll.AllToAll(c.step.mesh_dim, send.view(), recv.view()));
  Shape out_shape = x.shape();
  out_shape[i] = ei;
  out_shape[j] = Chunk(ej, c.p, c.coord).length;
  SG_ASSIGN_OR_RETURN(Tensor out, HostZeros(out_shape, x.dtype()));
  for (int k = 0; k < c.p; ++k) {  // from member k: its i-chunk x my j-chunk
    const ChunkRange r = Chunk(ei, c.p, k);
    Shape box = out_shape;
    box[i] = r.length;
    std::vector<int64_t> at = Zeros(x.rank());
    at[i] = r.offset;
    CopyBox(Bytes(Block(recv, k, block)), block, Zeros(x.rank()), Bytes(out.view()), out_shape, at,
            box, c.elem);
  }
  return out;
}

absl::StatusOr<Tensor> Copy(const TensorView& x) {
  SG_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), Device::Cpu()));
  if (x.nbytes() > 0) std::memcpy(out.view().raw(), x.raw(), size_t(x.nbytes()));
  return out;
}

}  // namespace

void CopyBox(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_offset,
             char* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_offset,
             const Shape& box, int64_t elem_bytes) {
  const int rank = int(box.size());
  if (NumElements(box) == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src, size_t(elem_bytes));
    return;
  }
  const Strides ss = ContiguousStrides(src_shape), ds = ContiguousStrides(dst_shape);
  // Iterate over every index of the box's leading dims; the last dim is one memcpy.
  std::vector<int64_t> idx(rank, 0);
  const int64_t row_bytes = box[rank - 1] * elem_bytes;
  while (true) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < rank; ++d) {
      so += (src_offset[d] + idx[d]) * ss[d];
      doff += (dst_offset[d] + idx[d]) * ds[d];
    }
    std::memcpy(dst + doff * elem_bytes, src + so * elem_bytes, size_t(row_bytes));
    int d = rank - 2;
    while (d >= 0 && ++idx[d] == box[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

absl::StatusOr<Tensor> LocalShard(const TensorView& global, const TensorSpec& spec, int rank) {
  SG_CHECK_ARG(global.device().is_cpu() && global.is_contiguous(),
               "LocalShard: expected a contiguous CPU tensor, found ", global.ToString());
  SG_CHECK_ARG(global.shape() == spec.global_shape(), "LocalShard: expected shape ",
               ShapeToString(spec.global_shape()), ", found ", global.ToString());
  const Shape local = spec.LocalShape(rank);
  SG_ASSIGN_OR_RETURN(Tensor out, HostZeros(local, global.dtype()));
  CopyBox(Bytes(global), global.shape(), spec.LocalOffsets(rank), Bytes(out.view()), local,
          Zeros(local.size()), local, SizeOf(global.dtype()));
  return out;
}

absl::StatusOr<Tensor> ExecuteRedistribute(const RedistributePlan& plan, const TensorSpec& src,
                                           const TensorView& local, Collectives& coll) {
  const int rank = coll.rank();
  SG_CHECK_ARG(plan.src == src.placements() && plan.mesh == src.mesh(),
               "redistribute: the plan is for ", PlacementsToString(plan.src), " over ",
               plan.mesh.ToString(), ", the tensor is ", src.ToString());
  SG_CHECK_ARG(coll.mesh() == src.mesh(), "redistribute: collectives are over mesh ",
               coll.mesh().ToString(), ", the tensor over ", src.mesh().ToString());
  SG_CHECK_ARG(local.device().is_cpu() && local.is_contiguous(),
               "redistribute: expected a contiguous CPU tensor, found ", local.ToString());
  SG_CHECK_ARG(local.shape() == src.LocalShape(rank), "redistribute: rank ", rank,
               " of ", src.ToString(), ": expected local shape ",
               ShapeToString(src.LocalShape(rank)), ", found ", local.ToString());
  SG_ASSIGN_OR_RETURN(Tensor cur, Copy(local));
  const std::vector<int> coords = src.mesh().Coordinates(rank);
  for (const RedistributeStep& step : plan.steps) {
    StepContext c{step, src.WithPlacements(step.before), rank, src.mesh().dim_size(step.mesh_dim),
                  coords[step.mesh_dim], SizeOf(local.dtype())};
    switch (step.kind) {
      case StepKind::kAllGather: {
        SG_ASSIGN_OR_RETURN(cur, AllGatherStep(c, cur.view(), coll));
        break;
      }
      case StepKind::kAllReduce:
        SG_RETURN_IF_ERROR(coll.AllReduce(step.mesh_dim, cur.view(), step.op));
        break;
      case StepKind::kReduceScatter: {
        SG_ASSIGN_OR_RETURN(cur, ReduceScatterStep(c, cur.view(), coll));
        break;
      }
      case StepKind::kAllToAll: {
        SG_ASSIGN_OR_RETURN(cur, AllToAllStep(c, cur.view(), coll));
        break;
      }
      case StepKind::kLocalSlice: {
        const int j = step.to_dim;
        const ChunkRange r = Chunk(cur.shape()[j], c.p, c.coord);
        Shape out_shape = cur.shape();
        out_shape[j] = r.length;
        std::vector<int64_t> from = Zeros(out_shape.size());
        from[j] = r.offset;
        SG_ASSIGN_OR_RETURN(Tensor out, HostZeros(out_shape, cur.dtype()));
        CopyBox(Bytes(cur.view()), cur.shape(), from, Bytes(out.view()), out_shape,
                Zeros(out_shape.size()), out_shape, c.elem);
        cur = std::move(out);
        break;
      }
      case StepKind::kLocalPartial:
        // sum: one copy of the value in the group; avg and max: every member's copy already is.
        if (step.op == ReduceOp::kSum && c.coord != 0 && cur.nbytes() > 0) {
          std::memset(cur.view().raw(), 0, size_t(cur.nbytes()));
        }
        break;
    }
  }
  return cur;
}

}  // namespace sg::sharding
