// Evaluation of a parsed Jinja template (jinja_ast.h) with jinja2's
// semantics for the supported subset (see jinja.h).
#include <algorithm>
#include <cmath>

#include "coordinator/tokenizer/jinja_ast.h"
#include "coordinator/tokenizer/jinja_builtins.h"

namespace headway::jinja {
namespace {

using Scope = std::map<std::string, Value>;

class Renderer {
 public:
  Renderer(std::string_view src, const std::map<std::string, Value>& context) : src_(src) {
    scopes_.emplace_back(context.begin(), context.end());
  }

  Result<MarkedText> Run(const std::vector<Node>& body) {
    HW_RETURN_IF_ERROR(Exec(body));
    return out_.TakeMarked();
  }

 private:
  Status Error(size_t pos, const std::string& what) const { return SourceError(src_, pos, what); }
  Status Unsupported(size_t pos, const std::string& what) const {
    return SourceUnsupported(src_, pos, what);
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
          out_.AppendPlain(node.text);
          break;
        case Node::Kind::kOutput: {
          HW_ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
          out_.Append(v);
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
      const std::vector<size_t> starts = CodePointStarts(seq.as_string());
      for (size_t i = 0; i + 1 < starts.size(); ++i) {
        items.push_back(Substr(seq, starts[i], starts[i + 1] - starts[i]));
      }
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
          // Keys carry no marks, so content must not become one.
          if (k.HasMarks()) return Unsupported(e.args[i]->pos, "a dict key made from message content");
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
      std::vector<size_t> starts;
      if (obj.is_string()) starts = CodePointStarts(obj.as_string());
      int64_t n = obj.is_array() ? int64_t(obj.as_array().size()) : int64_t(starts.size()) - 1;
      int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n) return Value();
      if (obj.is_array()) return obj.as_array()[size_t(i)];
      return Substr(obj, starts[size_t(i)], starts[size_t(i) + 1] - starts[size_t(i)]);
    }
    return Value();
  }

  Result<Value> EvalSlice(const Expr& e) {
    HW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    int64_t bounds[2] = {0, 0};
    std::vector<size_t> starts;
    if (obj.is_string()) starts = CodePointStarts(obj.as_string());
    else if (!obj.is_array()) return Error(e.pos, std::string("cannot slice a ") + obj.TypeName());
    const int64_t n = obj.is_array() ? int64_t(obj.as_array().size()) : int64_t(starts.size()) - 1;
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
    if (bounds[1] <= bounds[0]) return Value(std::string());
    const size_t begin = starts[size_t(bounds[0])];
    return Substr(obj, begin, starts[size_t(bounds[1])] - begin);
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
      return CallFunction(src_, callee.name, args, kwargs, e.pos, callee.pos);
    }
    if (callee.kind != Expr::Kind::kAttr) return Unsupported(e.pos, "calling this expression");
    HW_ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
    HW_RETURN_IF_ERROR(EvalArgs(e, &args, &kwargs));
    return CallMethod(src_, self, callee.name, args, callee.pos);
  }

  Result<Value> EvalFilter(const Expr& e) {
    HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    Array args;
    Object kwargs;
    HW_RETURN_IF_ERROR(EvalArgs(e, &args, &kwargs));
    return ApplyFilter(src_, e.name, v, args, kwargs, e.pos);
  }

  Result<Value> EvalTest(const Expr& e) {
    HW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    HW_ASSIGN_OR_RETURN(bool r, ApplyTest(src_, e.name, v, e.pos));
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
    return ApplyBinary(src_, op, a, b, e.pos);
  }

  std::string_view src_;
  std::vector<Scope> scopes_;
  TextBuilder out_;
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
  HW_ASSIGN_OR_RETURN(MarkedText out, Renderer(*source_, context).Run(*body_));
  return std::move(out.text);
}

Result<MarkedText> Template::RenderMarked(const std::map<std::string, Value>& context) const {
  return Renderer(*source_, context).Run(*body_);
}

}  // namespace headway::jinja
