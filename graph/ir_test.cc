// IR, verifier, builder and text form: round-trips and precise rejections.
#include "graph/ir.h"

#include "gmock/gmock.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/ops.h"
#include "graph/text.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::graph {
namespace {

using ::testing::HasSubstr;

TEST(OpsTest, SchemaTableMatchesEnumAndNamesRoundTrip) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpSchema& s = Schema(OpKind(i));
    EXPECT_EQ(int(s.op), i) << s.name;
    auto k = OpKindFromName(s.name);
    ASSERT_TRUE(k.ok()) << s.name;
    EXPECT_EQ(int(*k), i);
  }
}

TEST(DimTest, MonomialsCompareAndPrint) {
  Dim bs = Dim::Sym("seq") * Dim::Sym("batch");
  EXPECT_EQ(bs, Dim::Sym("batch") * Dim::Sym("seq"));
  EXPECT_EQ(bs.ToString(), "batch*seq");
  EXPECT_EQ((Dim(2) * Dim::Sym("seq")).ToString(), "2*seq");
  EXPECT_EQ(NumElements(SymShape{Dim::Sym("batch"), Dim::Sym("seq"), 64}), Dim(64) * bs);
  EXPECT_EQ(*Evaluate(bs * Dim(3), {{"batch", 2}, {"seq", 5}}), 30);
  EXPECT_FALSE(Evaluate(bs, {{"batch", 2}}).ok());
}

// A small graph touching symbols, multi-output ops, every attribute kind, scopes and phases.
Graph SmallGraph() {
  Builder b;
  Dim batch = b.Symbol("batch", 1, 64);
  Dim seq = b.Symbol("seq", 2, 4096, 2);
  Value x = b.Input("x", DType::kF32, {batch, seq, 8});
  Value r = b.Input("r", DType::kF32, {batch, seq, 8});
  Value w = b.Parameter("norm.weight", DType::kF32, {8});
  Value wq = b.Parameter("wq", DType::kF32, {8, 8});
  Value y, h;
  {
    auto s = b.EnterScope("layers.0");
    std::tie(y, h) = b.AddRmsNorm(x, r, w, 1e-5);
  }
  Value q = b.Matmul(y, wq, MatmulOptions::TransB());
  Value flat = b.Reshape(q, {batch * seq, 8});
  Value t = b.Transpose(flat, {1, 0});
  Value c = b.Cast(b.Scale(t, 0.125), DType::kBF16);
  b.set_phase(Phase::kBackward);
  Value s = b.ReduceSum(b.Cast(c, DType::kF32), {0, 1});
  Value f = b.Fill(-0.5, DType::kF32, {});
  b.Output("sum", b.Add(s, f));
  b.Output("h", h);
  return b.Finish().value();
}

TEST(TextTest, RoundTripsExactly) {
  Graph g = SmallGraph();
  const std::string text = ToText(g);
  auto parsed = ParseText(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(ToText(*parsed), text);
  EXPECT_THAT(text, HasSubstr("sym seq min=2 max=4096 multiple_of=2"));
  EXPECT_THAT(text, HasSubstr("add_rmsnorm("));
  EXPECT_THAT(text, HasSubstr("@\"layers.0\""));
  EXPECT_THAT(text, HasSubstr(" bwd\n"));
  EXPECT_THAT(text, HasSubstr("shape=shape[batch*seq,8]"));
}

TEST(TextTest, DoublesRoundTripBitExactly) {
  Builder b;
  Value x = b.Input("x", DType::kF32, {3});
  const double vals[] = {0.1, 1.0 / 3.0, 1e-300, -2.5e17, 5e-324, 123456789.0};
  Value acc = x;
  for (double v : vals) acc = b.Scale(acc, v);
  b.Output("y", acc);
  Graph g = b.Finish().value();
  Graph g2 = ParseText(ToText(g)).value();
  int i = 0;
  for (const Node& n : g2.nodes()) {
    if (n.op == OpKind::kScale) {
      EXPECT_EQ(AttrFloat(n, "factor"), vals[i++]);
    }
  }
  EXPECT_EQ(i, 6);
}

TEST(TextTest, CanonicalTextIgnoresIdNumbering) {
  Graph g = SmallGraph();
  std::string text = ToText(g);
  // Shift every id by 100 in the text: same graph, other numbering.
  std::string shifted;
  for (size_t i = 0; i < text.size(); ++i) {
    shifted += text[i];
    if (text[i] == '%') {
      size_t j = i + 1;
      while (j < text.size() && isdigit(text[j])) ++j;
      shifted += std::to_string(std::stoi(text.substr(i + 1, j - i - 1)) + 100);
      i = j - 1;
    }
  }
  auto g2 = ParseText(shifted);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_NE(ToText(*g2), text);
  EXPECT_EQ(CanonicalText(*g2), CanonicalText(g));
}

void ExpectParseError(const std::string& text, const std::string& where, const std::string& what) {
  auto g = ParseText(text);
  ASSERT_FALSE(g.ok()) << text;
  EXPECT_THAT(std::string(g.status().message()), HasSubstr(where)) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr(what)) << g.status();
}

TEST(TextTest, ParseErrorsGiveLineAndColumn) {
  const std::string head = "graph {\n  %0 = input() {dtype=f32, name=\"x\", shape=shape[4]} : f32[4]\n";
  ExpectParseError(head + "  %1 = neg(%0 : f32[4]\n}\n", "3:15:", "expected ')'");
  ExpectParseError(head + "  %1 = frobnicate(%0) : f32[4]\n}\n", "3:8:", "unknown op 'frobnicate'");
  ExpectParseError(head + "  %1 = neg(%7) : f32[4]\n}\n", "3:12:", "%7 is used before it is defined");
  ExpectParseError(head + "  %1 = neg(%0) : f32[5]\n}\n", "3:8:", "expected output types f32[4], found f32[5]");
  ExpectParseError(head + "  %1 = scale(%0) {factor=2} : f32[4]\n}\n", "3:8:",
                   "attribute 'factor': expected float, found 2");
  ExpectParseError(head + "  %1 = neg(%0) : f32[4]\n", "4:1:", "expected '}' closing the graph");
  ExpectParseError(head + "  %0 = neg(%0) : f32[4]\n}\n", "3:", "defined twice");
  ExpectParseError(head + "  output \"y\" = %5\n}\n", "", "graph output 'y' is %5, which no node defines");
  ExpectParseError(head + "  %1 = neg(%0) : f32[seq]\n}\n", "3:8:", "expected output types f32[4]");
}

// Verifier rejections on hand-built graphs (the builder would refuse them earlier).
TEST(VerifierTest, RejectsWithPreciseMessages) {
  auto input = [](Graph& g, const std::string& name, Type t) {
    return g.AddNode(OpKind::kInput, {}, {{"name", name}, {"dtype", t.dtype}, {"shape", t.shape}},
                     {t})[0];
  };
  {
    Graph g;
    int a = input(g, "a", {DType::kF32, {4, 8}});
    int b = input(g, "b", {DType::kF32, {9, 5}});
    g.AddNode(OpKind::kMatmul, {a, b},
              {{"trans_a", false}, {"trans_b", false}, {"epilogue", std::string("none")},
               {"prologue", std::string()}},
              {Type{DType::kF32, {4, 5}}}, "mlp");
    auto st = Verify(g);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("node 2 (%2 = matmul) in 'mlp': contraction dims differ: a f32[4,8] vs b "
                          "f32[9,5]: expected 8, found 9"));
  }
  {
    Graph g;
    int a = input(g, "a", {DType::kF32, {4}});
    g.AddNode(OpKind::kNeg, {a}, {}, {Type{DType::kBF16, {4}}});
    EXPECT_THAT(std::string(Verify(g).message()),
                HasSubstr("output %1: expected type f32[4], found bf16[4]"));
  }
  {
    Graph g;
    int a = input(g, "a", {DType::kF32, {4}});
    g.AddNode(OpKind::kAdd, {a, 7}, {}, {Type{DType::kF32, {4}}});
    EXPECT_THAT(std::string(Verify(g).message()), HasSubstr("input 1 is %7, which no node defines"));
  }
  {
    Graph g;
    input(g, "a", {DType::kF32, {Dim::Sym("seq")}});
    EXPECT_THAT(std::string(Verify(g).message()),
                HasSubstr("uses symbol 'seq' that the graph does not declare"));
  }
  {
    Graph g;
    input(g, "a", {DType::kF32, {4}});
    input(g, "a", {DType::kF32, {4}});
    EXPECT_THAT(std::string(Verify(g).message()), HasSubstr("source name 'a' is used by another"));
  }
  {
    Graph g;
    int q = input(g, "q", {DType::kF32, {1, 4, 3, 8}});
    int k = input(g, "k", {DType::kF32, {1, 4, 2, 8}});
    g.AddNode(OpKind::kAttention, {q, k, k}, {{"causal", true}, {"scale", 0.5}},
              {Type{DType::kF32, {1, 4, 3, 8}}});
    EXPECT_THAT(std::string(Verify(g).message()), HasSubstr("GQA: q heads must be a constant multiple"));
  }
  {
    Graph g;
    int x = input(g, "x", {DType::kF32, {4, 6}});
    g.AddNode(OpKind::kReshape, {x}, {{"shape", SymShape{5, 5}}}, {Type{DType::kF32, {5, 5}}});
    EXPECT_THAT(std::string(Verify(g).message()), HasSubstr("element counts differ (24 vs 25)"));
  }
  {
    Graph g;
    int x = input(g, "x", {DType::kF32, {4, 6}});
    g.AddNode(OpKind::kRmsNorm, {x, x}, {{"eps", 1e-5}, {"bogus", true}},
              {Type{DType::kF32, {4, 6}}});
    EXPECT_THAT(std::string(Verify(g).message()), HasSubstr("unknown attribute 'bogus'"));
  }
}

TEST(BuilderTest, RecordsFirstErrorWithScope) {
  Builder b;
  Value x = b.Input("x", DType::kF32, {4, 8});
  Value w = b.Parameter("w", DType::kF32, {7});
  {
    auto s = b.EnterScope("layers.2.attention_norm");
    b.RmsNorm(x, w, 1e-5);
  }
  b.Output("y", b.Neg(x));
  auto g = b.Finish();
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("rmsnorm(%0:f32[4,8], %1:f32[7]) in 'layers.2.attention_norm': input 1 "
                        "(weight): expected f32[8], found f32[7]"));
}

TEST(BuilderTest, ModulesNameParametersHierarchically) {
  struct Leaf : Module {
    Leaf() { w = DeclareParameter("weight", {2, 2}); }
    const ParameterSpec* w;
  };
  struct Block : Module {
    Block() { wq = AddSubmodule<Leaf>("wq"); }
    Leaf* wq;
  };
  struct Root : Module {
    Root() {
      for (int i = 0; i < 2; ++i) layers.push_back(AddSubmodule<Block>("layers." + std::to_string(i)));
    }
    std::vector<Block*> layers;
  };
  Root r;
  auto named = r.NamedParameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "layers.0.wq.weight");
  EXPECT_EQ(named[1].first, "layers.1.wq.weight");
  EXPECT_EQ(r.layers[1]->wq->path(), "layers.1.wq");
}

TEST(InterpreterTest, BindsSymbolsAndChecksConstraints) {
  Graph g = SmallGraph();
  auto& rng = testing::Rng();
  Feeds feeds = {{"x", HostTensor::Random({2, 4, 8}, DType::kF32, rng)},
                 {"r", HostTensor::Random({2, 4, 8}, DType::kF32, rng)},
                 {"norm.weight", HostTensor::Random({8}, DType::kF32, rng)},
                 {"wq", HostTensor::Random({8, 8}, DType::kF32, rng)}};
  auto out = Interpret(g, feeds);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 64; ++i) {
    EXPECT_DOUBLE_EQ(out->at("h").data[i], feeds["x"].data[i] + feeds["r"].data[i]);
  }
  feeds["r"] = HostTensor::Random({2, 6, 8}, DType::kF32, rng);
  EXPECT_THAT(std::string(Interpret(g, feeds).status().message()),
              HasSubstr("input 'r': expected f32[batch,seq,8], found f32[2,6,8] (seq=4 bound by 'x')"));
  feeds["x"] = HostTensor::Random({2, 3, 8}, DType::kF32, rng);
  feeds["r"] = HostTensor::Random({2, 3, 8}, DType::kF32, rng);
  EXPECT_THAT(std::string(Interpret(g, feeds).status().message()),
              HasSubstr("symbol 'seq' = 3 violates multiple_of=2"));
}

}  // namespace
}  // namespace sg::graph
