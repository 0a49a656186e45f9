#include "graph/text.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::graph {

std::string ToText(const Graph& g) {
  std::string s = "graph {\n";
  for (const SymbolInfo& sym : g.symbols()) absl::StrAppend(&s, "  ", sym.ToString(), "\n");
  for (const Node& n : g.nodes()) {
    s += "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      absl::StrAppend(&s, i ? ", " : "", "%", n.outputs[i]);
    }
    absl::StrAppend(&s, " = ", OpName(n.op), "(");
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      absl::StrAppend(&s, i ? ", " : "", "%", n.inputs[i]);
    }
    s += ")";
    if (!n.attrs.empty()) {
      s += " {";
      bool first = true;
      for (const auto& [k, v] : n.attrs) {
        absl::StrAppend(&s, first ? "" : ", ", k, "=", AttrToString(v));
        first = false;
      }
      s += "}";
    }
    s += " :";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      absl::StrAppend(&s, i ? ", " : " ", g.type(n.outputs[i]).ToString());
    }
    if (!n.scope.empty()) absl::StrAppend(&s, " @", AttrToString(AttrValue(n.scope)));
    if (n.phase != Phase::kForward) absl::StrAppend(&s, " ", PhaseName(n.phase));
    s += "\n";
  }
  for (const GraphOutput& o : g.outputs()) {
    absl::StrAppend(&s, "  output ", AttrToString(AttrValue(o.name)), " = %", o.value, "\n");
  }
  s += "}\n";
  return s;
}

std::string CanonicalText(const Graph& g) { return ToText(Canonicalize(g)); }

namespace {

class Parser {
 public:
  explicit Parser(absl::string_view text) : t_(text) {}

  absl::StatusOr<Graph> Parse() {
    SkipSpace();
    SG_RETURN_IF_ERROR(ExpectWord("graph"));
    SG_RETURN_IF_ERROR(Expect('{'));
    while (true) {
      SkipSpace();
      if (AtEnd()) return Error("expected '}' closing the graph, found end of input");
      if (Peek() == '}') {
        ++pos_;
        SkipSpace();
        if (!AtEnd()) return Error("unexpected text after the closing '}'");
        break;
      }
      SG_RETURN_IF_ERROR(Statement());
    }
    auto st = Verify(g_);
    if (!st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("verification failed: ", st.message()));
    }
    return std::move(g_);
  }

 private:
  absl::Status Statement() {
    if (Peek() == '%') return NodeStatement();
    const int line = line_, col = Col();
    std::string word = Ident();
    if (word == "sym") return SymStatement();
    if (word == "output") {
      SG_ASSIGN_OR_RETURN(std::string name, String());
      SG_RETURN_IF_ERROR(Expect('='));
      SG_ASSIGN_OR_RETURN(int id, ValueId());
      g_.AddOutput(name, id);
      return EndOfLine();
    }
    return ErrorAt(line, col, absl::StrCat("expected a node ('%id = op(...)'), 'sym' or 'output', "
                                           "found '", word.empty() ? std::string(1, Peek()) : word,
                                           "'"));
  }

  absl::Status SymStatement() {
    SymbolInfo s;
    SkipInline();
    s.name = Ident();
    if (s.name.empty()) return Error("expected a symbol name after 'sym'");
    while (true) {
      SkipInline();
      if (AtEnd() || Peek() == '\n' || Peek() == '#') break;
      const int line = line_, col = Col();
      std::string key = Ident();
      SG_RETURN_IF_ERROR(Expect('='));
      SG_ASSIGN_OR_RETURN(int64_t v, Int());
      if (key == "min") s.min = v;
      else if (key == "max") s.max = v;
      else if (key == "multiple_of") s.multiple_of = v;
      else return ErrorAt(line, col, absl::StrCat("expected min, max or multiple_of, found '", key, "'"));
    }
    const int line = line_;
    auto st = g_.AddSymbol(s);
    if (!st.ok()) return ErrorAt(line, 1, std::string(st.message()));
    return absl::OkStatus();
  }

  absl::Status NodeStatement() {
    const int line = line_;
    Node n;
    do {
      SG_ASSIGN_OR_RETURN(int id, ValueId());
      n.outputs.push_back(id);
    } while (Accept(','));
    SG_RETURN_IF_ERROR(Expect('='));
    SkipInline();
    const int op_col = Col();
    std::string op = Ident();
    auto kind = OpKindFromName(op);
    if (!kind.ok()) return ErrorAt(line, op_col, std::string(kind.status().message()));
    n.op = *kind;
    SG_RETURN_IF_ERROR(Expect('('));
    std::vector<Type> in_types;
    if (!Accept(')')) {
      do {
        SkipInline();
        const int col = Col();
        SG_ASSIGN_OR_RETURN(int id, ValueId());
        if (!g_.has_value(id)) {
          return ErrorAt(line, col, absl::StrCat("%", id, " is used before it is defined"));
        }
        in_types.push_back(g_.type(id));
        n.inputs.push_back(id);
      } while (Accept(','));
      SG_RETURN_IF_ERROR(Expect(')'));
    }
    if (Accept('{')) {
      do {
        SkipInline();
        const int col = Col();
        std::string key = Ident();
        if (key.empty()) return Error("expected an attribute name");
        SG_RETURN_IF_ERROR(Expect('='));
        SG_ASSIGN_OR_RETURN(AttrValue v, Value());
        if (!n.attrs.emplace(key, std::move(v)).second) {
          return ErrorAt(line, col, absl::StrCat("attribute '", key, "' given twice"));
        }
      } while (Accept(','));
      SG_RETURN_IF_ERROR(Expect('}'));
    }
    SG_RETURN_IF_ERROR(Expect(':'));
    std::vector<Type> types;
    do {
      SG_ASSIGN_OR_RETURN(Type t, ParseType());
      types.push_back(std::move(t));
    } while (Accept(','));
    if (Accept('@')) {
      SG_ASSIGN_OR_RETURN(n.scope, String());
    }
    SkipInline();
    if (!AtEnd() && std::isalpha(static_cast<unsigned char>(Peek()))) {
      const int col = Col();
      std::string phase = Ident();
      if (phase == "fwd") n.phase = Phase::kForward;
      else if (phase == "bwd") n.phase = Phase::kBackward;
      else if (phase == "opt") n.phase = Phase::kOptimizer;
      else return ErrorAt(line, col, absl::StrCat("expected fwd, bwd or opt, found '", phase, "'"));
    }
    auto inferred = InferTypes(n.op, in_types, n.attrs);
    if (!inferred.ok()) {
      return ErrorAt(line, op_col, absl::StrCat(op, ": ", inferred.status().message()));
    }
    if (*inferred != types) {
      std::string want = absl::StrJoin(*inferred, ", ", [](std::string* o, const Type& t) {
        o->append(t.ToString());
      });
      std::string got = absl::StrJoin(types, ", ", [](std::string* o, const Type& t) {
        o->append(t.ToString());
      });
      return ErrorAt(line, op_col, absl::StrCat(op, ": expected output types ", want, ", found ", got));
    }
    auto st = g_.AddNodeWithIds(std::move(n), types);
    if (!st.ok()) return ErrorAt(line, 3, std::string(st.message()));
    return EndOfLine();
  }

  absl::StatusOr<Type> ParseType() {
    SkipInline();
    const int col = Col();
    std::string dt = Ident();
    auto d = ParseDType(dt);
    if (!d.ok()) return ErrorAt(line_, col, absl::StrCat("expected a type like f32[4,seq], found '",
                                                         dt, "'"));
    SG_ASSIGN_OR_RETURN(SymShape s, ParseShape());
    return Type{*d, std::move(s)};
  }

  absl::StatusOr<SymShape> ParseShape() {
    SG_RETURN_IF_ERROR(Expect('['));
    SymShape s;
    if (Accept(']')) return s;
    do {
      Dim d(1);
      do {
        SkipInline();
        if (std::isdigit(static_cast<unsigned char>(Peek()))) {
          SG_ASSIGN_OR_RETURN(int64_t v, Int());
          d = d * Dim(v);
        } else {
          std::string sym = Ident();
          if (sym.empty()) return Error("expected a dim (integer or symbol name)");
          d = d * Dim::Sym(sym);
        }
      } while (Accept('*'));
      s.push_back(d);
    } while (Accept(','));
    SG_RETURN_IF_ERROR(Expect(']'));
    return s;
  }

  absl::StatusOr<AttrValue> Value() {
    SkipInline();
    const char c = Peek();
    if (c == '"') {
      SG_ASSIGN_OR_RETURN(std::string s, String());
      return AttrValue(s);
    }
    if (c == '[') {
      ++pos_;
      IntList l;
      if (!Accept(']')) {
        do {
          SG_ASSIGN_OR_RETURN(int64_t v, Int());
          l.push_back(v);
        } while (Accept(','));
        SG_RETURN_IF_ERROR(Expect(']'));
      }
      return AttrValue(l);
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+') return Number();
    const int col = Col();
    std::string w = Ident();
    if (w == "true" || w == "false") return AttrValue(w == "true");
    if (w == "inf") return AttrValue(std::numeric_limits<double>::infinity());
    if (w == "nan") return AttrValue(std::numeric_limits<double>::quiet_NaN());
    if (w == "shape") {
      SG_ASSIGN_OR_RETURN(SymShape s, ParseShape());
      return AttrValue(s);
    }
    auto d = ParseDType(w);
    if (d.ok()) return AttrValue(*d);
    return ErrorAt(line_, col, absl::StrCat("expected an attribute value, found '",
                                            w.empty() ? std::string(1, c) : w, "'"));
  }

  absl::StatusOr<AttrValue> Number() {
    const int col = Col();
    size_t end = pos_;
    while (end < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[end])) ||
                               t_[end] == '.' || t_[end] == '-' || t_[end] == '+')) {
      ++end;
    }
    std::string tok(t_.substr(pos_, end - pos_));
    if (tok == "-inf") {
      pos_ = end;
      return AttrValue(-std::numeric_limits<double>::infinity());
    }
    const bool is_float = tok.find_first_of(".eE") != std::string::npos;
    const char* b = tok.data() + (tok[0] == '+');
    const char* e = tok.data() + tok.size();
    if (is_float) {
      double v;
      auto r = std::from_chars(b, e, v);
      if (r.ec != std::errc() || r.ptr != e) return ErrorAt(line_, col, "malformed number '" + tok + "'");
      pos_ = end;
      return AttrValue(v);
    }
    int64_t v;
    auto r = std::from_chars(b, e, v);
    if (r.ec != std::errc() || r.ptr != e) return ErrorAt(line_, col, "malformed integer '" + tok + "'");
    pos_ = end;
    return AttrValue(v);
  }

  absl::StatusOr<int64_t> Int() {
    SkipInline();
    const int col = Col();
    SG_ASSIGN_OR_RETURN(AttrValue v, Number());
    if (v.index() != 1) return ErrorAt(line_, col, "expected an integer");
    return std::get<int64_t>(v);
  }

  absl::StatusOr<int> ValueId() {
    SG_RETURN_IF_ERROR(Expect('%'));
    const int col = Col();
    if (!std::isdigit(static_cast<unsigned char>(Peek()))) {
      return ErrorAt(line_, col, "expected a value id after '%'");
    }
    SG_ASSIGN_OR_RETURN(int64_t v, Int());
    if (v > std::numeric_limits<int>::max() / 2) return ErrorAt(line_, col, "value id too large");
    return int(v);
  }

  absl::StatusOr<std::string> String() {
    SkipInline();
    if (Peek() != '"') return Error(absl::StrCat("expected a \"string\", found ", Found()));
    ++pos_;
    std::string s;
    while (!AtEnd() && Peek() != '"') {
      if (Peek() == '\n') return Error("unterminated string");
      if (Peek() == '\\') ++pos_;
      if (AtEnd()) break;
      s += t_[pos_++];
    }
    if (AtEnd()) return Error("unterminated string");
    ++pos_;
    return s;
  }

  std::string Ident() {
    SkipInline();
    size_t end = pos_;
    while (end < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[end])) ||
                               t_[end] == '_' || t_[end] == '.')) {
      ++end;
    }
    std::string w(t_.substr(pos_, end - pos_));
    pos_ = end;
    return w;
  }

  absl::Status ExpectWord(absl::string_view w) {
    const int col = Col();
    std::string got = Ident();
    if (got != w) return ErrorAt(line_, col, absl::StrCat("expected '", w, "', found '", got, "'"));
    return absl::OkStatus();
  }

  absl::Status Expect(char c) {
    SkipInline();
    if (AtEnd() || Peek() != c) return Error(absl::StrCat("expected '", std::string(1, c), "', found ", Found()));
    ++pos_;
    return absl::OkStatus();
  }

  bool Accept(char c) {
    SkipInline();
    if (!AtEnd() && Peek() == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status EndOfLine() {
    SkipInline();
    if (!AtEnd() && Peek() != '\n') return Error(absl::StrCat("expected end of line, found ", Found()));
    return absl::OkStatus();
  }

  std::string Found() const {
    if (AtEnd()) return "end of input";
    if (Peek() == '\n') return "end of line";
    return absl::StrCat("'", std::string(1, Peek()), "'");
  }

  // Spaces and comments within a line.
  void SkipInline() {
    while (!AtEnd()) {
      if (Peek() == ' ' || Peek() == '\t' || Peek() == '\r') {
        ++pos_;
      } else if (Peek() == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  void SkipSpace() {
    while (true) {
      SkipInline();
      if (AtEnd() || Peek() != '\n') return;
      ++pos_;
      ++line_;
      line_start_ = pos_;
    }
  }

  bool AtEnd() const { return pos_ >= t_.size(); }
  char Peek() const { return AtEnd() ? '\0' : t_[pos_]; }
  int Col() const { return int(pos_ - line_start_) + 1; }
  absl::Status Error(const std::string& msg) const { return ErrorAt(line_, Col(), msg); }
  absl::Status ErrorAt(int line, int col, const std::string& msg) const {
    return absl::InvalidArgumentError(absl::StrCat(line, ":", col, ": ", msg));
  }

  absl::string_view t_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
  Graph g_;
};

}  // namespace

absl::StatusOr<Graph> ParseText(absl::string_view text) { return Parser(text).Parse(); }

}  // namespace sg::graph
