// Shapes and strides: small inline vectors of int64.
//
//   sg::Shape s = {16384, 2048};
//   int64_t n = sg::NumElements(s);              // 33554432
//   sg::Strides st = sg::ContiguousStrides(s);   // {2048, 1}
#ifndef SGTRAIN_KERNELS_CORE_SHAPE_H_
#define SGTRAIN_KERNELS_CORE_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_join.h"

namespace sg {

using Shape = absl::InlinedVector<int64_t, 6>;
using Strides = absl::InlinedVector<int64_t, 6>;

inline int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Row-major strides, in elements.
inline Strides ContiguousStrides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (int i = int(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// "[16384,2048]"
inline std::string ShapeToString(const Shape& s) { return "[" + absl::StrJoin(s, ",") + "]"; }

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_SHAPE_H_
