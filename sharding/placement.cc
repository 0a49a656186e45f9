#include "sharding/placement.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sg::sharding {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

std::string Placement::ToString() const {
  switch (kind_) {
    case Kind::kReplicate: return "R";
    case Kind::kShard: return absl::StrCat("S(", dim_, ")");
    case Kind::kPartial: return absl::StrCat("P(", ReduceOpName(op_), ")");
  }
  return "?";
}

absl::StatusOr<Placement> Placement::Parse(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text == "R") return Replicate();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    if (text == absl::StrCat("P(", ReduceOpName(op), ")")) return Partial(op);
  }
  int dim = 0;
  if (absl::ConsumePrefix(&text, "S(") && absl::ConsumeSuffix(&text, ")") &&
      absl::SimpleAtoi(text, &dim) && dim >= 0) {
    return Shard(dim);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "placement: expected R, S(<dim>), P(sum), P(avg) or P(max), found '", text, "'"));
}

std::string PlacementsToString(const Placements& p) {
  return absl::StrCat("[", absl::StrJoin(p, ",", [](std::string* out, const Placement& x) {
                        out->append(x.ToString());
                      }), "]");
}

absl::StatusOr<Placements> ParsePlacements(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  absl::ConsumePrefix(&text, "[");
  absl::ConsumeSuffix(&text, "]");
  Placements out;
  if (text.empty()) return out;
  // Split on commas outside parentheses: "S(0),P(sum)".
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      absl::StatusOr<Placement> p = Placement::Parse(text.substr(start, i - start));
      if (!p.ok()) return p.status();
      out.push_back(*p);
      start = i + 1;
    } else if (text[i] == '(') {
      ++depth;
    } else if (text[i] == ')') {
      --depth;
    }
  }
  return out;
}

ChunkRange Chunk(int64_t n, int parts, int index) {
  const int64_t c = MaxChunk(n, parts);
  ChunkRange r;
  r.offset = std::min(n, c * index);
  r.length = std::min(c, n - r.offset);
  return r;
}

absl::StatusOr<TensorSpec> TensorSpec::Create(DeviceMesh mesh, Placements placements,
                                              Shape global_shape) {
  if (int(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor spec: expected one placement per dim of mesh ", mesh.ToString(),
                     ", found ", PlacementsToString(placements)));
  }
  for (const Placement& p : placements) {
    if (p.is_shard() && p.dim() >= int(global_shape.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor spec: ", p.ToString(), " is beyond the rank of shape ",
                       ShapeToString(global_shape)));
    }
  }
  for (int64_t d : global_shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor spec: negative dim in shape ", ShapeToString(global_shape)));
    }
  }
  TensorSpec s;
  s.mesh_ = std::move(mesh);
  s.placements_ = std::move(placements);
  s.global_shape_ = std::move(global_shape);
  return s;
}

ChunkRange TensorSpec::Range(int rank, int tensor_dim, int upto) const {
  ChunkRange r{0, global_shape_[tensor_dim]};
  const std::vector<int> coords = mesh_.Coordinates(rank);
  for (int m = 0; m < upto; ++m) {
    if (!placements_[m].is_shard(tensor_dim)) continue;
    const ChunkRange c = Chunk(r.length, mesh_.dim_size(m), coords[m]);
    r.offset += c.offset;
    r.length = c.length;
  }
  return r;
}

Shape TensorSpec::LocalShape(int rank) const {
  Shape s(global_shape_.size());
  for (size_t d = 0; d < s.size(); ++d) s[d] = Range(rank, int(d), mesh_.ndim()).length;
  return s;
}

std::vector<int64_t> TensorSpec::LocalOffsets(int rank) const {
  std::vector<int64_t> o(global_shape_.size());
  for (size_t d = 0; d < o.size(); ++d) o[d] = Range(rank, int(d), mesh_.ndim()).offset;
  return o;
}

int64_t TensorSpec::ParentExtent(int rank, int mesh_dim, int tensor_dim) const {
  return Range(rank, tensor_dim, mesh_dim).length;
}

TensorSpec TensorSpec::WithPlacements(Placements p) const {
  TensorSpec s = *this;
  s.placements_ = std::move(p);
  return s;
}

std::string TensorSpec::ToString() const {
  return absl::StrCat(ShapeToString(global_shape_), " over ", mesh_.ToString(), " as ",
                      PlacementsToString(placements_));
}

}  // namespace sg::sharding
