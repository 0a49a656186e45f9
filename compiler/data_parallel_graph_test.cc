// GatherInComputeDType on the data-parallel graph of a small Llama step, under every recompute
// policy (each puts the parameters' casts elsewhere: forward only, or cloned into the backward).
#include "compiler/data_parallel_graph.h"

#include <map>
#include <string>

#include "compiler/distributed.h"
#include "compiler/llama_step.h"
#include "graph/ops.h"
#include "graph/text.h"
#include "gtest/gtest.h"

namespace sg::compiler {
namespace {

DataParallelGraph Split(RecomputePolicy policy, Precision precision) {
  LlamaBenchConfig c = LlamaBenchConfigNamed("tiny").value();
  c.model.n_layers = 2;
  graph::Graph fwd = graph::BuildLlamaForward(c.model).value();
  CompileOptions o = LlamaStepOptions(c, Device::Cpu(), policy);
  o.precision = precision;
  o.strategy = Strategy::kFsdp;
  return SplitOptimizer(PrepareTrainingGraph(fwd, o).value()).value();
}

// Parameter sources by name -> dtype.
std::map<std::string, DType> Sources(const graph::Graph& g) {
  std::map<std::string, DType> out;
  for (const graph::Node& n : g.nodes()) {
    if (n.op == graph::OpKind::kParameter) out[graph::AttrString(n, "name")] = g.type(n.outputs[0]).dtype;
  }
  return out;
}

// Casts in `g`, and of them those reading a parameter.
int Casts(const graph::Graph& g, int* of_params = nullptr) {
  int casts = 0, params = 0;
  for (const graph::Node& n : g.nodes()) {
    if (n.op != graph::OpKind::kCast) continue;
    ++casts;
    params += g.nodes()[g.value(n.inputs[0]).producer].op == graph::OpKind::kParameter;
  }
  if (of_params != nullptr) *of_params = params;
  return casts;
}

TEST(GatherInComputeDTypeTest, Bf16ParametersAreReadWithoutCasts) {
  for (RecomputePolicy policy : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    SCOPED_TRACE(int(policy));
    DataParallelGraph before = Split(policy, Precision::kBF16Mixed);
    const std::map<std::string, DType> old_sources = Sources(before.graph);
    int param_casts = 0;
    const int old_casts = Casts(before.graph, &param_casts);
    EXPECT_GE(param_casts, int(old_sources.size()));
    auto after = GatherInComputeDType(before);
    ASSERT_TRUE(after.ok()) << after.status();
    const graph::Graph& g = after->graph;
    ASSERT_TRUE(graph::Verify(g).ok());
    // Every parameter (forward and "@bwd") was f32 and read only through a cast; now it is bf16.
    const std::map<std::string, DType> sources = Sources(g);
    ASSERT_EQ(sources.size(), old_sources.size());
    int f32_before = 0;
    for (const auto& [name, dtype] : sources) {
      f32_before += old_sources.at(name) == DType::kF32;
      EXPECT_EQ(dtype, DType::kBF16) << name;
    }
    EXPECT_EQ(f32_before, int(sources.size()));
    // The parameters' casts are gone; the gradient casts (bf16 -> f32) stay, as do the outputs.
    EXPECT_EQ(Casts(g), old_casts - param_casts);
    for (const graph::Node& n : g.nodes()) {
      if (n.op != graph::OpKind::kCast) continue;
      EXPECT_EQ(g.type(n.outputs[0]).dtype, DType::kF32);
      EXPECT_NE(g.nodes()[g.value(n.inputs[0]).producer].op, graph::OpKind::kParameter);
    }
    ASSERT_EQ(g.outputs().size(), before.graph.outputs().size());
    for (const graph::GraphOutput& o : g.outputs()) {
      if (o.name.rfind("grad:", 0) == 0) {
        EXPECT_EQ(g.type(o.value).dtype, DType::kF32) << o.name;
      }
    }
    EXPECT_EQ(after->params.size(), before.params.size());
  }
}

TEST(GatherInComputeDTypeTest, F32GraphIsUnchanged) {
  DataParallelGraph before = Split(RecomputePolicy::kSelective, Precision::kF32);
  auto after = GatherInComputeDType(before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(graph::ToText(after->graph), graph::ToText(before.graph));
}

}  // namespace
}  // namespace sg::compiler
