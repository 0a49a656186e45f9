// DeviceMesh: the ranks of a job arranged as an N-dimensional array with named dims ("dp" x "tp").
//
//   SG_ASSIGN_OR_RETURN(sg::sharding::DeviceMesh mesh, sg::sharding::DeviceMesh::Parse("dp=2,tp=4"));
//   std::vector<int> tp_peers = mesh.GroupRanks(/*rank=*/5, mesh.DimIndex("tp").value());  // {4,5,6,7}
//   std::vector<int> coords = mesh.Coordinates(5);                                         // {1, 1}
//
// Ranks are numbered row-major, the LAST mesh dim fastest, so the innermost dim ("tp") holds
// neighbouring ranks -- the ones that share a node's NVLink, where tensor parallelism belongs.
// A mesh dim's "group" for a rank is the set of ranks that differ from it only along that dim, in
// coordinate order; a collective over mesh dim m runs within that group (a sub-group of the job).
#ifndef SGTRAIN_SHARDING_MESH_H_
#define SGTRAIN_SHARDING_MESH_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sg::sharding {

class DeviceMesh {
 public:
  // An empty (0-dim, 1-rank) mesh; use Create or Parse for a real one.
  DeviceMesh() = default;

  // `names` and `sizes` have one entry per mesh dim; names are distinct and non-empty, sizes >= 1.
  // InvalidArgument naming the offending dim otherwise.
  static absl::StatusOr<DeviceMesh> Create(std::vector<std::string> names, std::vector<int> sizes);

  // "2x4" (dims named dp, tp for 2 dims; dp for 1; d0, d1, ... beyond), "8", or "dp=2,tp=4".
  static absl::StatusOr<DeviceMesh> Parse(absl::string_view text);

  int ndim() const { return int(sizes_.size()); }
  int size() const;  // number of ranks
  int dim_size(int mesh_dim) const { return sizes_[mesh_dim]; }
  const std::string& dim_name(int mesh_dim) const { return names_[mesh_dim]; }
  const std::vector<int>& sizes() const { return sizes_; }
  const std::vector<std::string>& names() const { return names_; }
  // Index of the dim called `name`; NotFound listing the mesh's dims otherwise.
  absl::StatusOr<int> DimIndex(absl::string_view name) const;

  // Coordinates of `rank` (one per mesh dim). Precondition: 0 <= rank < size().
  std::vector<int> Coordinates(int rank) const;
  // The rank at `coords`. Precondition: one valid coordinate per dim.
  int RankAt(const std::vector<int>& coords) const;
  // The ranks sharing every coordinate of `rank` except along `mesh_dim`, in coordinate order;
  // `rank` is at index Coordinates(rank)[mesh_dim].
  std::vector<int> GroupRanks(int rank, int mesh_dim) const;
  // Every group along `mesh_dim` (each as GroupRanks gives it), ordered by their smallest rank.
  std::vector<std::vector<int>> AllGroups(int mesh_dim) const;

  // "dp=2,tp=4"
  std::string ToString() const;

  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
    return a.names_ == b.names_ && a.sizes_ == b.sizes_;
  }
  friend bool operator!=(const DeviceMesh& a, const DeviceMesh& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const DeviceMesh& m) {
    return H::combine(std::move(h), m.names_, m.sizes_);
  }

 private:
  std::vector<std::string> names_;
  std::vector<int> sizes_;
};

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_MESH_H_
