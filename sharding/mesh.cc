#include "sharding/mesh.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sg::sharding {

absl::StatusOr<DeviceMesh> DeviceMesh::Create(std::vector<std::string> names,
                                              std::vector<int> sizes) {
  if (names.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh: ", names.size(), " dim names but ",
                                                   sizes.size(), " dim sizes"));
  }
  absl::flat_hash_set<std::string> seen;
  int64_t total = 1;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim ", i, ": expected a name, found \"\""));
    }
    if (!seen.insert(names[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim name '", names[i], "' repeated"));
    }
    if (sizes[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dim '", names[i], "': expected size >= 1, found ", sizes[i]));
    }
    total *= sizes[i];
    if (total > (1 << 24)) return absl::InvalidArgumentError("mesh: more than 2^24 ranks");
  }
  DeviceMesh m;
  m.names_ = std::move(names);
  m.sizes_ = std::move(sizes);
  return m;
}

absl::StatusOr<DeviceMesh> DeviceMesh::Parse(absl::string_view text) {
  std::vector<std::string> names;
  std::vector<int> sizes;
  const bool named = absl::StrContains(text, '=');
  for (absl::string_view part : absl::StrSplit(text, named ? ',' : 'x')) {
    part = absl::StripAsciiWhitespace(part);
    absl::string_view num = part;
    if (named) {
      std::vector<absl::string_view> kv = absl::StrSplit(part, '=');
      if (kv.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh '", text, "': expected name=size, found '", part, "'"));
      }
      names.emplace_back(absl::StripAsciiWhitespace(kv[0]));
      num = absl::StripAsciiWhitespace(kv[1]);
    }
    int size = 0;
    if (!absl::SimpleAtoi(num, &size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh '", text, "': expected \"2x4\" or \"dp=2,tp=4\", found size '", num, "'"));
    }
    sizes.push_back(size);
  }
  if (!named) {
    if (sizes.size() == 1) names = {"dp"};
    else if (sizes.size() == 2) names = {"dp", "tp"};
    else for (size_t i = 0; i < sizes.size(); ++i) names.push_back(absl::StrCat("d", i));
  }
  return Create(std::move(names), std::move(sizes));
}

int DeviceMesh::size() const {
  int n = 1;
  for (int s : sizes_) n *= s;
  return n;
}

absl::StatusOr<int> DeviceMesh::DimIndex(absl::string_view name) const {
  for (int i = 0; i < ndim(); ++i) {
    if (names_[i] == name) return i;
  }
  return absl::NotFoundError(
      absl::StrCat("mesh ", ToString(), " has no dim named '", name, "'"));
}

std::vector<int> DeviceMesh::Coordinates(int rank) const {
  std::vector<int> c(sizes_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    c[i] = rank % sizes_[i];
    rank /= sizes_[i];
  }
  return c;
}

int DeviceMesh::RankAt(const std::vector<int>& coords) const {
  int r = 0;
  for (int i = 0; i < ndim(); ++i) r = r * sizes_[i] + coords[i];
  return r;
}

std::vector<int> DeviceMesh::GroupRanks(int rank, int mesh_dim) const {
  std::vector<int> c = Coordinates(rank);
  std::vector<int> out;
  for (int k = 0; k < sizes_[mesh_dim]; ++k) {
    c[mesh_dim] = k;
    out.push_back(RankAt(c));
  }
  return out;
}

std::vector<std::vector<int>> DeviceMesh::AllGroups(int mesh_dim) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < size(); ++r) {
    if (Coordinates(r)[mesh_dim] == 0) out.push_back(GroupRanks(r, mesh_dim));
  }
  return out;
}

std::string DeviceMesh::ToString() const {
  std::vector<std::string> parts;
  for (int i = 0; i < ndim(); ++i) parts.push_back(absl::StrCat(names_[i], "=", sizes_[i]));
  return absl::StrJoin(parts, ",");
}

}  // namespace sg::sharding
