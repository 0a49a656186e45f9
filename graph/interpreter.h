// The reference interpreter: runs any verified graph on the CPU in double precision. It is the
// independent reference for tests (autodiff vs finite differences, passes preserve results) and
// the CPU fallback. Straightforward loops, no speed tricks: keep it obviously correct.
//
//   Feeds feeds = {{"x", HostTensor::Random({4, 8}, DType::kF32, rng)}, {"w", ...}};
//   SG_ASSIGN_OR_RETURN(Feeds out, Interpret(g, feeds));   // out["loss"].data[0]
//
// Every element is a double whatever the dtype: values are not rounded to bf16/f16 except by an
// explicit `cast` to bf16/f16 (which rounds as the device would; f32 stays double), and integers
// are exact up to 2^53.
#ifndef SGTRAIN_GRAPH_INTERPRETER_H_
#define SGTRAIN_GRAPH_INTERPRETER_H_

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

struct HostTensor {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<double> data;  // row-major, NumElements(shape) values

  static HostTensor Zeros(Shape shape, DType dtype = DType::kF32);
  // Uniform in [-scale, scale) for floating dtypes; uniform integers in [0, int_max) otherwise.
  static HostTensor Random(Shape shape, DType dtype, std::mt19937_64& rng, double scale = 1.0,
                           int64_t int_max = 2);
  int64_t numel() const { return int64_t(data.size()); }
};

using Feeds = std::map<std::string, HostTensor>;

// Runs `g` with a value for every parameter and input (by name); returns the graph outputs by
// name. Symbols are bound from the feeds' shapes and checked against their constraints.
// InvalidArgument for a missing/ill-shaped feed ("input 'tokens': expected i32[batch,seq] with
// batch=2 (bound by 'x'), found i32[3,5]"), an out-of-range index, or an unverifiable graph.
absl::StatusOr<Feeds> Interpret(const Graph& g, const Feeds& feeds);

// The symbol binding Interpret would use for these feeds.
absl::StatusOr<Binding> BindFromFeeds(const Graph& g, const Feeds& feeds);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_INTERPRETER_H_
