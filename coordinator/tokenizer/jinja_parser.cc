// Lexer and recursive-descent parser for the Jinja subset of jinja.h.
// The grammar and operator precedence follow jinja2's parser.py (3.1):
//   expr    := or ['if' or ['else' expr]]
//   or      := and ('or' and)*          and := not ('and' not)*
//   not     := 'not' not | compare      compare := math1 (cmpop math1)*
//   math1   := concat (('+'|'-') concat)*   concat := math2 ('~' math2)*
//   math2   := unary (('*'|'/'|'//'|'%') unary)*
//   unary   := '-' unary | primary postfix* ('|' filter | 'is' test | call)*
// Three layers: the Lexer (tokens, with jinja2's whitespace control), the
// ExpressionParser (the grammar above) and the TemplateParser (statements),
// the parsers sharing one TokenCursor.
#include <cctype>
#include <set>

#include "coordinator/tokenizer/jinja_ast.h"

namespace headway::jinja {

std::string Where(std::string_view source, size_t pos) {
  int line = 1, column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

Status SourceError(std::string_view source, size_t pos, const std::string& what) {
  return Status::InvalidArgument("chat template " + Where(source, pos) + ": " + what);
}

Status SourceUnsupported(std::string_view source, size_t pos, const std::string& what) {
  return Status::Unimplemented("chat template " + Where(source, pos) + ": " + what +
                               " is not supported by Headway's template renderer");
}

namespace {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Token(Tok k, size_t p, std::string t) : kind(k), pos(p), text(std::move(t)) {}
  Tok kind;
  size_t pos;
  std::string text;  // text, name, string value, operator
  int64_t i = 0;
  double f = 0;
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(std::string_view src, const TemplateOptions& options) : src_(src), options_(options) {}

  Result<std::vector<Token>> Run() {
    size_t i = 0;
    const size_t n = src_.size();
    while (i < n) {
      size_t start = FindTag(i);
      char kind = start < n ? src_[start + 1] : 0;
      char mod = start + 2 < n ? src_[start + 2] : 0;
      EmitText(i, start, kind, mod);
      if (start >= n) break;
      i = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        HW_ASSIGN_OR_RETURN(i, SkipComment(start, i));
      } else {
        HW_ASSIGN_OR_RETURN(i, LexTag(start, kind, i));
      }
    }
    out_.push_back(Token{Tok::kEof, n, ""});
    return std::move(out_);
  }

 private:
  size_t FindTag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k) {
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return src_.size();
  }

  // The text [i, start) before the tag at `start` (of `kind` '{', '%' or
  // '#', with modifier `mod`; start = the source's size: no tag) as a kText
  // token, after whitespace control: the previous tag's '-' or trim_blocks,
  // then this tag's '-' or lstrip_blocks.
  void EmitText(size_t i, size_t start, char kind, char mod) {
    const size_t n = src_.size();
    std::string text(src_.substr(i, start - i));
    bool line_starting = i == 0 || src_[i - 1] == '\n';
    if (strip_leading_) {
      size_t k = 0;
      while (k < text.size() && IsSpace(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_newline_) {
      if (text.rfind("\r\n", 0) == 0) {
        text.erase(0, 2);
        line_starting = true;
      } else if (text.rfind("\n", 0) == 0) {
        text.erase(0, 1);
        line_starting = true;
      }
    }
    strip_leading_ = trim_newline_ = false;
    if (start < n && mod == '-') {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (start < n && mod != '+' && kind != '{' && options_.lstrip_blocks) {
      size_t nl = text.rfind('\n');
      size_t line_begin = nl == std::string::npos ? 0 : nl + 1;
      if (nl != std::string::npos || line_starting) {
        bool blank = true;
        for (size_t k = line_begin; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
        if (blank) text.resize(line_begin);
      }
    }
    if (!text.empty()) out_.push_back(Token{Tok::kText, i, std::move(text)});
  }

  // A comment opened at `start`, its body from `i`: the position after it.
  Result<size_t> SkipComment(size_t start, size_t i) {
    size_t end = src_.find("#}", i);
    if (end == std::string_view::npos) return Status::InvalidArgument(Where(src_, start) + ": unclosed comment");
    strip_leading_ = end > i && src_[end - 1] == '-';
    trim_newline_ = options_.trim_blocks && !(end > i && src_[end - 1] == '+');
    return end + 2;
  }

  // The tokens of a '{{' (kind '{') or '{%' (kind '%') tag opened at
  // `start`, its body from `i`, up to its closing delimiter: the position
  // after it.
  Result<size_t> LexTag(size_t start, char kind, size_t i) {
    const size_t n = src_.size();
    out_.push_back(Token{kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, start, ""});
    const char* close = kind == '{' ? "}}" : "%}";
    for (;;) {
      while (i < n && IsSpace(src_[i])) ++i;
      if (i >= n) {
        return Status::InvalidArgument(Where(src_, start) + ": unclosed '" +
                                       std::string(src_.substr(start, 2)) + "' (expected '" + close + "')");
      }
      char m = src_[i];
      size_t at = (m == '-' || m == '+') ? i + 1 : i;
      if (src_.substr(at, 2) == close) {
        strip_leading_ = m == '-';
        trim_newline_ = kind == '%' && options_.trim_blocks && m != '+';
        out_.push_back(Token{kind == '{' ? Tok::kVarEnd : Tok::kBlockEnd, i, ""});
        return at + 2;
      }
      HW_ASSIGN_OR_RETURN(i, LexOne(i));
    }
  }

  // One token of a tag's body at `i`: the position after it.
  Result<size_t> LexOne(size_t i) {
    char c = src_[i];
    if (std::isalpha((unsigned char)c) || c == '_') {
      size_t j = i;
      while (j < src_.size() && (std::isalnum((unsigned char)src_[j]) || src_[j] == '_')) ++j;
      out_.push_back(Token{Tok::kName, i, std::string(src_.substr(i, j - i))});
      return j;
    }
    if (std::isdigit((unsigned char)c)) return LexNumber(i);
    if (c == '\'' || c == '"') return LexString(i);
    static const char* const kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (const char* op : kTwo) {
      if (src_.substr(i, 2) == op) {
        out_.push_back(Token{Tok::kOp, i, op});
        return i + 2;
      }
    }
    if (std::string_view("+-*/%~|.,:()[]{}<>=").find(c) != std::string_view::npos) {
      out_.push_back(Token{Tok::kOp, i, std::string(1, c)});
      return i + 1;
    }
    return Status::InvalidArgument(Where(src_, i) + ": unexpected character '" + std::string(1, c) + "'");
  }

  Result<size_t> LexNumber(size_t i) {
    const size_t n = src_.size();
    size_t j = i;
    while (j < n && std::isdigit((unsigned char)src_[j])) ++j;
    bool is_float = j + 1 < n && src_[j] == '.' && std::isdigit((unsigned char)src_[j + 1]);
    if (is_float) {
      ++j;
      while (j < n && std::isdigit((unsigned char)src_[j])) ++j;
    }
    std::string digits(src_.substr(i, j - i));
    Token t{is_float ? Tok::kFloat : Tok::kInt, i, digits};
    try {
      if (is_float) t.f = std::stod(digits); else t.i = std::stoll(digits);
    } catch (...) {
      return Status::InvalidArgument(Where(src_, i) + ": number " + digits + " out of range");
    }
    out_.push_back(std::move(t));
    return j;
  }

  // A quoted string literal with Python's common escapes.
  Result<size_t> LexString(size_t i) {
    const size_t n = src_.size();
    const char quote = src_[i];
    std::string value;
    size_t j = i + 1;
    for (; j < n && src_[j] != quote; ++j) {
      if (src_[j] == '\\' && j + 1 < n) {
        char e = src_[++j];
        switch (e) {
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          case 'r': value += '\r'; break;
          case '\\': case '\'': case '"': value += e; break;
          default: value += '\\'; value += e;
        }
      } else {
        value += src_[j];
      }
    }
    if (j >= n) return Status::InvalidArgument(Where(src_, i) + ": unterminated string literal");
    out_.push_back(Token{Tok::kString, i, std::move(value)});
    return j + 1;
  }

  std::string_view src_;
  const TemplateOptions& options_;
  std::vector<Token> out_;
  // Whitespace control for the text after the last tag: its '-' strips the
  // leading whitespace; trim_blocks drops one newline after a block tag.
  bool strip_leading_ = false;
  bool trim_newline_ = false;
};

// The token stream of one template and the parsers' shared helpers: look
// ahead, consume, expect, and errors that point into the source.
class TokenCursor {
 public:
  TokenCursor(std::string_view src, std::vector<Token> tokens) : src_(src), toks_(std::move(tokens)) {}

 protected:
  const Token& Peek(size_t ahead = 0) const { return toks_[std::min(k_ + ahead, toks_.size() - 1)]; }
  Token Next() { Token t = Peek(); if (k_ < toks_.size() - 1) ++k_; return t; }
  bool IsOp(const char* op, size_t ahead = 0) const { return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op; }
  bool IsName(const char* name, size_t ahead = 0) const { return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name; }

  Status Error(size_t pos, const std::string& what) const { return SourceError(src_, pos, what); }
  Status Unsupported(size_t pos, const std::string& what) const {
    return SourceUnsupported(src_, pos, what);
  }
  std::string Describe(const Token& t) const {
    switch (t.kind) {
      case Tok::kText: return "text";
      case Tok::kVarBegin: return "'{{'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kBlockBegin: return "'{%'";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kEof: return "the end of the template";
      case Tok::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  Status Expect(Tok kind, const char* what) {
    if (Peek().kind != kind) return Error(Peek().pos, std::string("expected ") + what + ", found " + Describe(Peek()));
    Next();
    return Status::Ok();
  }
  Status ExpectOp(const char* op) {
    if (!IsOp(op)) return Error(Peek().pos, std::string("expected '") + op + "', found " + Describe(Peek()));
    Next();
    return Status::Ok();
  }
  Result<std::string> ExpectName() {
    if (Peek().kind != Tok::kName) return Error(Peek().pos, "expected a name, found " + Describe(Peek()));
    return Next().text;
  }

  std::string_view src_;
  std::vector<Token> toks_;
  size_t k_ = 0;
};

// Expressions, by precedence (the grammar at the top of this file).
class ExpressionParser : public TokenCursor {
 public:
  using TokenCursor::TokenCursor;

 protected:
  static ExprPtr Make(Expr::Kind kind, size_t pos, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    e->name = std::move(name);
    return e;
  }
  static ExprPtr Binary(std::string op, size_t pos, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(Expr::Kind::kBinary, pos, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  Result<ExprPtr> ParseExpr() {
    HW_ASSIGN_OR_RETURN(ExprPtr body, ParseOr());
    if (!IsName("if")) return body;
    size_t pos = Next().pos;
    HW_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr e = Make(Expr::Kind::kCond, pos);
    e->args.push_back(std::move(body));
    e->args.push_back(std::move(cond));
    if (IsName("else")) {
      Next();
      HW_ASSIGN_OR_RETURN(ExprPtr other, ParseExpr());
      e->args.push_back(std::move(other));
    } else {
      e->args.push_back(nullptr);
    }
    return e;
  }

  Result<ExprPtr> ParseOr() {
    HW_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      size_t pos = Next().pos;
      HW_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary("or", pos, std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseAnd() {
    HW_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      size_t pos = Next().pos;
      HW_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary("and", pos, std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseNot() {
    if (IsName("not")) {
      size_t pos = Next().pos;
      HW_ASSIGN_OR_RETURN(ExprPtr inner, ParseNot());
      ExprPtr e = Make(Expr::Kind::kNot, pos);
      e->args.push_back(std::move(inner));
      return e;
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    HW_ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
    for (;;) {
      std::string op;
      size_t pos = Peek().pos;
      if (Peek().kind == Tok::kOp && (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
                                      Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return left;
      }
      HW_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      left = Binary(op, pos, std::move(left), std::move(right));
    }
  }

  Result<ExprPtr> ParseMath1() {
    HW_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      Token op = Next();
      HW_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(op.text, op.pos, std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseConcat() {
    HW_ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      size_t pos = Next().pos;
      HW_ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = Binary("~", pos, std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseMath2() {
    HW_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary());
    for (;;) {
      if (IsOp("**")) return Unsupported(Peek().pos, "the '**' operator");
      if (!(IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) return left;
      Token op = Next();
      HW_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary());
      left = Binary(op.text, op.pos, std::move(left), std::move(right));
    }
  }

  Result<ExprPtr> ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      Token op = Next();
      HW_ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary());
      if (op.text == "+") return inner;
      ExprPtr e = Make(Expr::Kind::kNeg, op.pos);
      e->args.push_back(std::move(inner));
      return e;
    }
    HW_ASSIGN_OR_RETURN(ExprPtr node, ParsePrimary());
    HW_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    for (;;) {
      if (IsOp("|")) {
        Next();
        size_t pos = Peek().pos;
        HW_ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr f = Make(Expr::Kind::kFilter, pos, name);
        f->args.push_back(std::move(node));
        if (IsOp("(")) HW_RETURN_IF_ERROR(ParseArgs(f.get()));
        node = std::move(f);
      } else if (IsName("is")) {
        Next();
        size_t pos = Peek().pos;
        bool negate = false;
        if (IsName("not")) {
          Next();
          negate = true;
          pos = Peek().pos;
        }
        HW_ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr t = Make(Expr::Kind::kTest, pos, name);
        t->negate = negate;
        t->args.push_back(std::move(node));
        if (IsOp("(")) HW_RETURN_IF_ERROR(ParseArgs(t.get()));
        node = std::move(t);
      } else {
        return node;
      }
    }
  }

  // '(' [arg (',' arg)*] ')' appended to e->args (kwarg names in kwarg_names).
  Status ParseArgs(Expr* e) {
    HW_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      std::string kw;
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        kw = Next().text;
        Next();
      }
      HW_ASSIGN_OR_RETURN(ExprPtr arg, ParseExpr());
      e->args.push_back(std::move(arg));
      e->kwarg_names.push_back(std::move(kw));
      if (!IsOp(",")) break;
      Next();
    }
    return ExpectOp(")");
  }

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
    for (;;) {
      if (IsOp(".")) {
        size_t pos = Next().pos;
        if (Peek().kind == Tok::kInt) {  // x.0 means x[0] in jinja2
          ExprPtr e = Make(Expr::Kind::kIndex, pos);
          e->args.push_back(std::move(node));
          ExprPtr index = Make(Expr::Kind::kLiteral, Peek().pos);
          index->value = Value(Next().i);
          e->args.push_back(std::move(index));
          node = std::move(e);
          continue;
        }
        HW_ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr e = Make(Expr::Kind::kAttr, pos, name);
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        size_t pos = Next().pos;
        ExprPtr lo, hi;
        if (!IsOp(":")) {
          HW_ASSIGN_OR_RETURN(lo, ParseExpr());
        }
        if (IsOp(":")) {
          Next();
          if (!IsOp("]") && !IsOp(":")) {
            HW_ASSIGN_OR_RETURN(hi, ParseExpr());
          }
          if (IsOp(":")) return Unsupported(Peek().pos, "slices with a step");
          ExprPtr e = Make(Expr::Kind::kSlice, pos);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(lo));
          e->args.push_back(std::move(hi));
          node = std::move(e);
        } else {
          ExprPtr e = Make(Expr::Kind::kIndex, pos);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(lo));
          node = std::move(e);
        }
        HW_RETURN_IF_ERROR(ExpectOp("]"));
      } else if (IsOp("(")) {
        ExprPtr e = Make(Expr::Kind::kCall, Peek().pos);
        e->args.push_back(std::move(node));
        HW_RETURN_IF_ERROR(ParseArgs(e.get()));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    size_t pos = t.pos;
    switch (t.kind) {
      case Tok::kName:
        return ParseNameOrConstant();
      case Tok::kString: {
        std::string s = Next().text;
        while (Peek().kind == Tok::kString) s += Next().text;  // adjacent literals join
        ExprPtr e = Make(Expr::Kind::kLiteral, pos);
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral, pos);
        e->value = Value(Next().i);
        return e;
      }
      case Tok::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, pos);
        e->value = Value(Next().f);
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") return ParseParenthesized();
        if (t.text == "[") return ParseListLiteral();
        if (t.text == "{") return ParseDictLiteral();
        break;
      default:
        break;
    }
    return Error(pos, "expected an expression, found " + Describe(t));
  }

  // true / false / none (either case) as literals, any other name as a
  // variable.
  Result<ExprPtr> ParseNameOrConstant() {
    size_t pos = Peek().pos;
    std::string name = Next().text;
    ExprPtr e = Make(Expr::Kind::kLiteral, pos);
    if (name == "true" || name == "True") e->value = Value(true);
    else if (name == "false" || name == "False") e->value = Value(false);
    else if (name == "none" || name == "None") e->value = Value(Value::None{});
    else return Make(Expr::Kind::kName, pos, name);
    return e;
  }

  // '(' expr ')', or a tuple '(' expr ',' ... ')' (treated as a list).
  Result<ExprPtr> ParseParenthesized() {
    size_t pos = Next().pos;
    HW_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpr());
    if (IsOp(",")) {
      ExprPtr list = Make(Expr::Kind::kList, pos);
      list->args.push_back(std::move(inner));
      while (IsOp(",")) {
        Next();
        if (IsOp(")")) break;
        HW_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
        list->args.push_back(std::move(item));
      }
      inner = std::move(list);
    }
    HW_RETURN_IF_ERROR(ExpectOp(")"));
    return inner;
  }

  // '[' [expr (',' expr)* [',']] ']'
  Result<ExprPtr> ParseListLiteral() {
    ExprPtr list = Make(Expr::Kind::kList, Next().pos);
    while (!IsOp("]")) {
      HW_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
      list->args.push_back(std::move(item));
      if (!IsOp(",")) break;
      Next();
    }
    HW_RETURN_IF_ERROR(ExpectOp("]"));
    return list;
  }

  // '{' [expr ':' expr (',' expr ':' expr)* [',']] '}'
  Result<ExprPtr> ParseDictLiteral() {
    ExprPtr dict = Make(Expr::Kind::kDict, Next().pos);
    while (!IsOp("}")) {
      HW_ASSIGN_OR_RETURN(ExprPtr key, ParseExpr());
      HW_RETURN_IF_ERROR(ExpectOp(":"));
      HW_ASSIGN_OR_RETURN(ExprPtr value, ParseExpr());
      dict->args.push_back(std::move(key));
      dict->args.push_back(std::move(value));
      if (!IsOp(",")) break;
      Next();
    }
    HW_RETURN_IF_ERROR(ExpectOp("}"));
    return dict;
  }
};

// A template's nodes: text, {{ output }} and the {% if %}, {% for %} and
// {% set %} statements, whose expressions ExpressionParser parses.
class TemplateParser : public ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  Result<std::vector<Node>> ParseAll() {
    std::string end;
    HW_ASSIGN_OR_RETURN(std::vector<Node> body, ParseBody({}, 0, &end));
    return body;
  }

 private:
  // Parses nodes until `{% <one of ends> ...`; leaves the cursor after the
  // end keyword and stores it in *found. With no ends: until EOF.
  Result<std::vector<Node>> ParseBody(const std::set<std::string>& ends, size_t open_pos, std::string* found) {
    std::vector<Node> body;
    for (;;) {
      const Token& t = Peek();
      if (t.kind == Tok::kEof) {
        if (ends.empty()) return body;
        return Error(open_pos, "block is never closed (expected {% " + *ends.rbegin() + " %})");
      }
      if (t.kind == Tok::kText) {
        Node node(Node::Kind::kText, t.pos);
        node.text = Next().text;
        body.push_back(std::move(node));
        continue;
      }
      if (t.kind == Tok::kVarBegin) {
        Node node(Node::Kind::kOutput, Next().pos);
        HW_ASSIGN_OR_RETURN(node.expr, ParseExpr());
        HW_RETURN_IF_ERROR(Expect(Tok::kVarEnd, "'}}'"));
        body.push_back(std::move(node));
        continue;
      }
      if (t.kind != Tok::kBlockBegin) return Error(t.pos, "unexpected " + Describe(t));
      size_t pos = Next().pos;
      if (Peek().kind != Tok::kName) return Error(Peek().pos, "expected a statement name after '{%'");
      std::string keyword = Peek().text;
      size_t kw_pos = Peek().pos;
      if (ends.count(keyword)) {
        Next();
        *found = keyword;
        return body;
      }
      Next();
      Node node(Node::Kind::kText, pos);
      if (keyword == "if") {
        HW_RETURN_IF_ERROR(ParseIf(&node));
      } else if (keyword == "for") {
        HW_RETURN_IF_ERROR(ParseFor(&node));
      } else if (keyword == "set") {
        HW_RETURN_IF_ERROR(ParseSet(&node));
      } else if (keyword == "elif" || keyword == "else" || keyword == "endif" || keyword == "endfor" ||
                 keyword == "endset") {
        return Error(kw_pos, "unexpected {% " + keyword + " %}");
      } else {
        return Unsupported(kw_pos, "{% " + keyword + " %}");
      }
      body.push_back(std::move(node));
    }
  }

  Status ParseIf(Node* node) {
    node->kind = Node::Kind::kIf;
    size_t open = node->pos;
    HW_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpr());
    for (;;) {
      HW_RETURN_IF_ERROR(Expect(Tok::kBlockEnd, "'%}'"));
      std::string found;
      HW_ASSIGN_OR_RETURN(std::vector<Node> body, ParseBody({"elif", "else", "endif"}, open, &found));
      node->branches.emplace_back(std::move(cond), std::move(body));
      if (found == "endif") break;
      if (found == "else") {
        HW_RETURN_IF_ERROR(Expect(Tok::kBlockEnd, "'%}'"));
        HW_ASSIGN_OR_RETURN(std::vector<Node> else_body, ParseBody({"endif"}, open, &found));
        node->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      HW_ASSIGN_OR_RETURN(cond, ParseExpr());  // elif
    }
    return Expect(Tok::kBlockEnd, "'%}'");
  }

  Status ParseFor(Node* node) {
    node->kind = Node::Kind::kFor;
    do {
      HW_ASSIGN_OR_RETURN(std::string target, ExpectName());
      node->targets.push_back(std::move(target));
    } while (IsOp(",") && (Next(), true));
    if (!IsName("in")) return Error(Peek().pos, "expected 'in' in for loop, found " + Describe(Peek()));
    Next();
    HW_ASSIGN_OR_RETURN(node->expr, ParseOr());
    if (IsName("if")) {
      Next();
      HW_ASSIGN_OR_RETURN(node->filter, ParseOr());
    }
    if (IsName("recursive")) return Unsupported(Peek().pos, "recursive for loops");
    HW_RETURN_IF_ERROR(Expect(Tok::kBlockEnd, "'%}'"));
    std::string found;
    HW_ASSIGN_OR_RETURN(node->body, ParseBody({"else", "endfor"}, node->pos, &found));
    if (found == "else") {
      HW_RETURN_IF_ERROR(Expect(Tok::kBlockEnd, "'%}'"));
      HW_ASSIGN_OR_RETURN(node->else_body, ParseBody({"endfor"}, node->pos, &found));
    }
    return Expect(Tok::kBlockEnd, "'%}'");
  }

  Status ParseSet(Node* node) {
    node->kind = Node::Kind::kSet;
    HW_ASSIGN_OR_RETURN(std::string target, ExpectName());
    node->targets.push_back(std::move(target));
    if (IsOp(".")) {
      Next();
      HW_ASSIGN_OR_RETURN(node->attr, ExpectName());
    }
    if (IsOp(",")) return Unsupported(Peek().pos, "assigning several names in one {% set %}");
    if (Peek().kind == Tok::kBlockEnd) return Unsupported(node->pos, "block assignment {% set x %}...{% endset %}");
    HW_RETURN_IF_ERROR(ExpectOp("="));
    HW_ASSIGN_OR_RETURN(node->expr, ParseExpr());
    return Expect(Tok::kBlockEnd, "'%}'");
  }
};

}  // namespace

Result<std::vector<Node>> ParseTemplate(std::string_view source, const TemplateOptions& options) {
  HW_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lexer(source, options).Run());
  return TemplateParser(source, std::move(tokens)).ParseAll();
}

}  // namespace headway::jinja
