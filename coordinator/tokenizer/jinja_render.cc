// Evaluation of a parsed Jinja template (jinja_ast.h) with jinja2's
// semantics for the supported subset (see jinja.h).
#include <algorithm>
#include <cmath>

#include "coordinator/tokenizer/jinja_ast.h"

namespace headway::jinja {
namespace {

using Scope = std::map<std::string, Value>;

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string Strip(const std::string& s, bool left, bool right, const std::string* chars = nullptr) {
  auto strip = [&](char c) { return chars ? chars->find(c) != std::string::npos : IsWs(c); };
  size_t b = 0, e = s.size();
  if (left) while (b < e && strip(s[b])) ++b;
  if (right) while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string AsciiCase(std::string s, bool upper) {
  for (char& c : s) c = char(upper ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
  return s;
}

// Unicode code points of a UTF-8 string (Python len() of str).
std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    unsigned char c = s[i];
    if (c >= 0xF0) n = 4; else if (c >= 0xE0) n = 3; else if (c >= 0xC0) n = 2;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

class Renderer {
 public:
  Renderer(std::string_view src, const std::map<std::string, Value>& context) : src_(src) {
    scopes_.emplace_back(context.begin(), context.end());
  }

  Result<std::string> Run(const std::vector<Node>& body) {
    HW_RETURN_IF_ERROR(Exec(body));
    return std::move(out_);
  }

 private:
  Status Error(size_t pos, const std::string& what) const {
    return Status::InvalidArgument("chat template " + Where(src_, pos) + ": " + what);
  }
  Status Unsupported(size_t pos, const std::string& what) const {
    return Status::Unimplemented("chat template " + Where(src_, pos) + ": " + what +
                                 " is not supported by Headway's template renderer");
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  Status Exec(const std::vector<Node>& body) {
    for (const Node& node : body) {
      switch (node.kind) {
        case Node::Kind::kText:
          out_ += node.text;
          break;
        case Node::Kind::kOutput: {
          HW_ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
          out_ += v.ToString();
          break;
        }
        case Node::Kind::kIf:
          for (const auto& [cond, branch] : node.branches) {
            bool take = true;
            if (cond) {
              HW_ASSIGN_OR_RETURN(Value c, Eval(*cond));
              take = c.Truthy();
            }
            if (take) {
              HW_RETURN_IF_ERROR(Exec(branch));
              break;
            }
          }
          break;
        case Node::Kind::kFor:
          HW_RETURN_IF_ERROR(ExecFor(node));
          break;
        case Node::Kind::kSet: {
          HW_ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
          if (node.attr.empty()) {
            scopes_.back()[node.targets[0]] = std::move(v);
          } else {
            Value ns = Lookup(node.targets[0]);
            if (!ns.is_object()) {
              return Error(node.pos, "cannot set attribute '" + node.attr + "' of " + ns.TypeName() +
                                         " '" + node.targets[0] + "' (use namespace())");
            }
            Object& obj = ns.mutable_object();
            auto it = std::find_if(obj.begin(), obj.end(), [&](const auto& kv) { return kv.first == node.attr; });
            if (it != obj.end()) it->second = std::move(v); else obj.emplace_back(node.attr, std::move(v));
          }
          break;
        }
      }
    }
    return Status::Ok();
  }

  Status ExecFor(const Node& node) {
    HW_ASSIGN_OR_RETURN(Value seq, Eval(*node.expr));
    Array items;
    if (seq.is_array()) {
      items = seq.as_array();
    } else if (seq.is_object()) {
      for (const auto& kv : seq.as_object()) items.emplace_back(kv.first);
    } else if (seq.is_string()) {
      for (std::string& c : CodePoints(seq.as_string())) items.emplace_back(std::move(c));
    } else if (!seq.is_undefined()) {
      return Error(node.expr->pos, std::string("cannot iterate over a ") + seq.TypeName());
    }
    auto bind = [&](const Value& item, Scope* scope) -> Status {
      if (node.targets.size() == 1) {
        (*scope)[node.targets[0]] = item;
        return Status::Ok();
      }
      if (!item.is_array() || item.as_array().size() != node.targets.size()) {
        return Error(node.pos, "cannot unpack " + item.Repr() + " into " +
                                   std::to_string(node.targets.size()) + " names");
      }
      for (size_t i = 0; i < node.targets.size(); ++i) (*scope)[node.targets[i]] = item.as_array()[i];
      return Status::Ok();
    };
    if (node.filter) {  // the loop filter runs before loop.* is computed, as in jinja2
      Array kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        Status s = bind(item, &scopes_.back());
        Result<Value> keep = s.ok() ? Eval(*node.filter) : Result<Value>(s);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(node.else_body);
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Object loop = {{"index", Value(i + 1)},        {"index0", Value(i)},
                     {"revindex", Value(n - i)},     {"revindex0", Value(n - i - 1)},
                     {"first", Value(i == 0)},       {"last", Value(i == n - 1)},
                     {"length", Value(n)},
                     {"previtem", i > 0 ? items[i - 1] : Value()},
                     {"nextitem", i + 1 < n ? items[i + 1] : Value()}};
      scopes_.emplace_back();
      scopes_.back()["loop"] = Value(std::move(loop));
      Status s = bind(items[i], &scopes_.back());
      if (s.ok()) s = Exec(node.body);
      scopes_.pop_back();
      HW_RETURN_IF_ERROR(s);
    }
    return Status::Ok();
  }

  Result<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList: {
        Array a;
        for (const ExprPtr& x : e.args) {
          HW_ASSIGN_OR_RETURN(Value v, Eval(*x));
          a.push_back(std::move(v));
        }
        return Value(std::move(a));
      }
      case Expr::Kind::kDict: {
        Object o;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          HW_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return Unsupported(e.args[i]->pos, "a dict key that is not a string");
          o.emplace_back(k.as_string(), std::move(v));
        }
        return Value(std::move(o));
      }
      case Expr::Kind::kAttr: {
        HW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        if (obj.is_undefined()) {
          return Error(e.pos, "cannot read attribute '" + e.name + "' of an undefined value");
        }
        return obj.Get(e.name);
      }
      case Expr::Kind::kIndex: {
        HW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        HW_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return Index(e, obj, key);
      }
      case Expr::Kind::kSlice: return EvalSlice(e);
      case Expr::Kind::kCall: return EvalCall(e);
      case Expr::Kind::kFilter: return EvalFilter(e);
      case Expr::Kind::kTest: return EvalTest(e);
      case Expr::Kind::kNot: {
        HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value(!v.Truthy());
      }
      case Expr::Kind::kNeg: {
        HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_int()) return Value(-v.as_int());
        if (v.is_float()) return Value(-v.as_number());
        return Error(e.pos, std::string("bad operand type for unary -: ") + v.TypeName());
      }
      case Expr::Kind::kBinary: return EvalBinary(e);
      case Expr::Kind::kCond: {
        HW_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (!e.args[2]) return Value();
        return Eval(*e.args[2]);
      }
    }
    return Error(e.pos, "unknown expression");
  }

  Result<Value> Index(const Expr& e, const Value& obj, const Value& key) {
    if (obj.is_undefined()) return Error(e.pos, "cannot index an undefined value with " + key.Repr());
    if (obj.is_object()) {
      if (!key.is_string()) return Value();
      return obj.Get(key.as_string());
    }
    if ((obj.is_array() || obj.is_string()) && key.is_int()) {
      std::vector<std::string> chars;
      if (obj.is_string()) chars = CodePoints(obj.as_string());
      int64_t n = obj.is_array() ? int64_t(obj.as_array().size()) : int64_t(chars.size());
      int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n) return Value();
      if (obj.is_array()) return obj.as_array()[size_t(i)];
      return Value(chars[size_t(i)]);
    }
    return Value();
  }

  Result<Value> EvalSlice(const Expr& e) {
    HW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    int64_t bounds[2] = {0, 0};
    std::vector<std::string> chars;
    if (obj.is_string()) chars = CodePoints(obj.as_string());
    else if (!obj.is_array()) return Error(e.pos, std::string("cannot slice a ") + obj.TypeName());
    const int64_t n = obj.is_array() ? int64_t(obj.as_array().size()) : int64_t(chars.size());
    for (int k = 0; k < 2; ++k) {
      bounds[k] = k == 0 ? 0 : n;
      if (!e.args[k + 1]) continue;
      HW_ASSIGN_OR_RETURN(Value b, Eval(*e.args[k + 1]));
      if (b.is_none()) continue;
      if (!b.is_int()) return Error(e.args[k + 1]->pos, "slice bounds must be integers");
      int64_t v = b.as_int();
      if (v < 0) v += n;
      bounds[k] = std::clamp<int64_t>(v, 0, n);
    }
    if (obj.is_array()) {
      Array out;
      for (int64_t i = bounds[0]; i < bounds[1]; ++i) out.push_back(obj.as_array()[size_t(i)]);
      return Value(std::move(out));
    }
    std::string out;
    for (int64_t i = bounds[0]; i < bounds[1]; ++i) out += chars[size_t(i)];
    return Value(std::move(out));
  }

  // Positional arguments of a call, filter or test (args[1..]), and keyword ones.
  Status EvalArgs(const Expr& e, Array* positional, Object* keywords) {
    for (size_t i = 1; i < e.args.size(); ++i) {
      HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      const std::string kw = i - 1 < e.kwarg_names.size() ? e.kwarg_names[i - 1] : "";
      if (kw.empty()) positional->push_back(std::move(v)); else keywords->emplace_back(kw, std::move(v));
    }
    return Status::Ok();
  }

  Result<Value> EvalCall(const Expr& e) {
    Array args;
    Object kwargs;
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kName && Lookup(callee.name).is_undefined()) {
      HW_RETURN_IF_ERROR(EvalArgs(e, &args, &kwargs));
      if (callee.name == "raise_exception") {
        return Status::InvalidArgument(args.empty() ? "the chat template raised an error" : args[0].ToString());
      }
      if (callee.name == "namespace") {
        Object ns = kwargs;
        return Value(std::move(ns));
      }
      if (callee.name == "range") {
        std::vector<int64_t> n;
        for (const Value& a : args) {
          if (!a.is_int()) return Error(e.pos, "range() arguments must be integers");
          n.push_back(a.as_int());
        }
        if (n.empty() || n.size() > 3) return Error(e.pos, "range() takes 1 to 3 arguments");
        int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0];
        int64_t step = n.size() > 2 ? n[2] : 1;
        if (step == 0) return Error(e.pos, "range() step must not be zero");
        Array out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (out.size() >= 100000) return Error(e.pos, "range() too long");
          out.emplace_back(i);
        }
        return Value(std::move(out));
      }
      return Unsupported(callee.pos, "the function '" + callee.name + "'");
    }
    if (callee.kind != Expr::Kind::kAttr) return Unsupported(e.pos, "calling this expression");
    HW_ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
    HW_RETURN_IF_ERROR(EvalArgs(e, &args, &kwargs));
    const std::string& m = callee.name;
    auto arg_string = [&](size_t i) -> const std::string* {
      return i < args.size() && args[i].is_string() ? &args[i].as_string() : nullptr;
    };
    if (self.is_string()) {
      const std::string& s = self.as_string();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        return Value(Strip(s, m != "rstrip", m != "lstrip", arg_string(0)));
      }
      if (m == "upper" || m == "lower") return Value(AsciiCase(s, m == "upper"));
      if ((m == "startswith" || m == "endswith") && arg_string(0)) {
        const std::string& x = *arg_string(0);
        bool r = m == "startswith" ? s.rfind(x, 0) == 0
                                   : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
        return Value(r);
      }
      if (m == "replace" && arg_string(0) && arg_string(1) && !arg_string(0)->empty()) {
        std::string out, from = *arg_string(0), to = *arg_string(1);
        size_t at = 0, hit;
        while ((hit = s.find(from, at)) != std::string::npos) {
          out += s.substr(at, hit - at) + to;
          at = hit + from.size();
        }
        return Value(out + s.substr(at));
      }
      if (m == "split") {
        Array parts;
        if (const std::string* sep = arg_string(0); sep && !sep->empty()) {
          size_t at = 0, hit;
          while ((hit = s.find(*sep, at)) != std::string::npos) {
            parts.emplace_back(s.substr(at, hit - at));
            at = hit + sep->size();
          }
          parts.emplace_back(s.substr(at));
        } else {
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && IsWs(s[i])) ++i;
            size_t j = i;
            while (j < s.size() && !IsWs(s[j])) ++j;
            if (j > i) parts.emplace_back(s.substr(i, j - i));
            i = j;
          }
        }
        return Value(std::move(parts));
      }
    }
    if (self.is_object()) {
      if (m == "items" || m == "keys" || m == "values") {
        Array out;
        for (const auto& [k, v] : self.as_object()) {
          if (m == "items") out.emplace_back(Array{Value(k), v});
          else if (m == "keys") out.emplace_back(k);
          else out.push_back(v);
        }
        return Value(std::move(out));
      }
      if (m == "get" && arg_string(0)) {
        Value v = self.Get(*arg_string(0));
        if (!v.is_undefined()) return v;
        return args.size() > 1 ? args[1] : Value(Value::None{});
      }
    }
    return Unsupported(callee.pos, std::string("the method '") + m + "' of a " + self.TypeName());
  }

  Result<Value> EvalFilter(const Expr& e) {
    HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    Array args;
    Object kwargs;
    HW_RETURN_IF_ERROR(EvalArgs(e, &args, &kwargs));
    const std::string& f = e.name;
    auto need = [&](bool ok, const char* what) -> Status {
      return ok ? Status::Ok() : Error(e.pos, "filter '" + f + "' needs " + what + ", got a " + v.TypeName());
    };
    if (f == "trim") {
      HW_RETURN_IF_ERROR(need(v.is_string(), "a string"));
      return Value(Strip(v.as_string(), true, true));
    }
    if (f == "upper" || f == "lower") {
      HW_RETURN_IF_ERROR(need(v.is_string(), "a string"));
      return Value(AsciiCase(v.as_string(), f == "upper"));
    }
    if (f == "capitalize") {
      HW_RETURN_IF_ERROR(need(v.is_string(), "a string"));
      std::string s = AsciiCase(v.as_string(), false);
      if (!s.empty()) s[0] = char(std::toupper((unsigned char)s[0]));
      return Value(s);
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value(int64_t(CodePoints(v.as_string()).size()));
      if (v.is_array()) return Value(int64_t(v.as_array().size()));
      if (v.is_object()) return Value(int64_t(v.as_object().size()));
      if (v.is_undefined()) return Value(int64_t(0));
      return need(false, "a string, list or dict");
    }
    if (f == "default" || f == "d") {
      bool boolean = (args.size() > 1 && args[1].Truthy()) || kwargs.size() == 1;
      bool use_default = v.is_undefined() || (boolean && !v.Truthy());
      return use_default ? (args.empty() ? Value(std::string()) : args[0]) : v;
    }
    if (f == "string") return Value(v.ToString());
    if (f == "first" || f == "last") {
      if (v.is_array()) {
        if (v.as_array().empty()) return Value();
        return f == "first" ? v.as_array().front() : v.as_array().back();
      }
      if (v.is_string()) {
        std::vector<std::string> chars = CodePoints(v.as_string());
        if (chars.empty()) return Value();
        return Value(f == "first" ? chars.front() : chars.back());
      }
      return need(false, "a list or string");
    }
    if (f == "join") {
      std::string sep = !args.empty() ? args[0].ToString() : "";
      std::string out;
      if (v.is_array()) {
        for (size_t i = 0; i < v.as_array().size(); ++i) out += (i ? sep : "") + v.as_array()[i].ToString();
        return Value(out);
      }
      return need(false, "a list");
    }
    return Unsupported(e.pos, "the filter '" + f + "'");
  }

  Result<Value> EvalTest(const Expr& e) {
    HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    const std::string& t = e.name;
    bool r;
    if (t == "defined") r = !v.is_undefined();
    else if (t == "undefined") r = v.is_undefined();
    else if (t == "none") r = v.is_none();
    else if (t == "string") r = v.is_string();
    else if (t == "number") r = v.is_number();
    else if (t == "integer") r = v.is_int();
    else if (t == "float") r = v.is_float();
    else if (t == "boolean") r = v.is_bool();
    else if (t == "true") r = v.is_bool() && v.as_bool();
    else if (t == "false") r = v.is_bool() && !v.as_bool();
    else if (t == "mapping") r = v.is_object();
    else if (t == "sequence" || t == "iterable") r = v.is_array() || v.is_string() || v.is_object();
    else if (t == "odd" || t == "even") {
      if (!v.is_int()) return Error(e.pos, std::string("test '") + t + "' needs an integer, got a " + v.TypeName());
      r = (v.as_int() % 2 != 0) == (t == "odd");
    } else {
      return Unsupported(e.pos, "the test '" + t + "'");
    }
    return Value(r != e.negate);
  }

  Result<Value> EvalBinary(const Expr& e) {
    const std::string& op = e.name;
    HW_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
    if (op == "and") {
      if (!a.Truthy()) return a;
      return Eval(*e.args[1]);
    }
    if (op == "or") {
      if (a.Truthy()) return a;
      return Eval(*e.args[1]);
    }
    HW_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
    auto type_error = [&]() {
      return Error(e.pos, "unsupported operand types for " + op + ": '" + a.TypeName() + "' and '" +
                              b.TypeName() + "'");
    };
    if (op == "~") return Value(a.ToString() + b.ToString());
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "in" || op == "not in") {
      bool found;
      if (b.is_string()) {
        if (!a.is_string()) return type_error();
        found = b.as_string().find(a.as_string()) != std::string::npos;
      } else if (b.is_array()) {
        found = std::any_of(b.as_array().begin(), b.as_array().end(), [&](const Value& x) { return x.Equals(a); });
      } else if (b.is_object()) {
        found = a.is_string() && !b.Get(a.as_string()).is_undefined();
      } else if (b.is_undefined()) {
        found = false;
      } else {
        return type_error();
      }
      return Value(found == (op == "in"));
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int cmp;
      if (a.is_number() && b.is_number()) {
        cmp = a.as_number() < b.as_number() ? -1 : (a.as_number() > b.as_number() ? 1 : 0);
      } else if (a.is_string() && b.is_string()) {
        cmp = a.as_string().compare(b.as_string());
      } else {
        return type_error();
      }
      bool r = op == "<" ? cmp < 0 : op == "<=" ? cmp <= 0 : op == ">" ? cmp > 0 : cmp >= 0;
      return Value(r);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_array() && b.is_array()) {
        Array out = a.as_array();
        out.insert(out.end(), b.as_array().begin(), b.as_array().end());
        return Value(std::move(out));
      }
    }
    if (op == "*" && a.is_string() && b.is_int()) {
      std::string out;
      for (int64_t i = 0; i < b.as_int() && out.size() < (1u << 24); ++i) out += a.as_string();
      return Value(out);
    }
    if (op == "%" && a.is_string()) return Unsupported(e.pos, "'%' string formatting");
    if (!a.is_number() || !b.is_number()) return type_error();
    if (a.is_int() && b.is_int() && op != "/") {
      int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (y == 0) return Error(e.pos, "division by zero");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        --q;
        r += y;
      }
      return Value(op == "//" ? q : r);
    }
    double x = a.as_number(), y = b.as_number();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (y == 0) return Error(e.pos, "division by zero");
    if (op == "/") return Value(x / y);
    if (op == "//") return Value(std::floor(x / y));
    return Value(x - y * std::floor(x / y));
  }

  std::string_view src_;
  std::vector<Scope> scopes_;
  std::string out_;
};

}  // namespace

Template::Template(std::string source, std::vector<Node> body)
    : source_(std::make_shared<const std::string>(std::move(source))),
      body_(std::make_shared<const std::vector<Node>>(std::move(body))) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

Result<Template> Template::Parse(std::string_view source, TemplateOptions options) {
  HW_ASSIGN_OR_RETURN(std::vector<Node> body, ParseTemplate(source, options));
  return Template(std::string(source), std::move(body));
}

Result<std::string> Template::Render(const std::map<std::string, Value>& context) const {
  return Renderer(*source_, context).Run(*body_);
}

}  // namespace headway::jinja
