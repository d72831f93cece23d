#include <charconv>

#include "coordinator/tokenizer/jinja.h"

namespace headway::jinja {

Value::Value(std::string s, std::string marks) : v_(std::move(s)) {
  // All-clear marks are dropped, so that marks() is empty exactly when no
  // byte is marked.
  if (marks.find_first_not_of('\0') != std::string::npos) marks_ = std::move(marks);
}

Value Value::Marked(std::string s) {
  std::string marks(s.size(), '\1');
  return Value(std::move(s), std::move(marks));
}

bool Value::HasMarks() const {
  if (is_string()) return !marks_.empty();
  if (is_array()) {
    for (const Value& v : as_array()) {
      if (v.HasMarks()) return true;
    }
  }
  if (is_object()) {
    for (const auto& kv : as_object()) {
      if (kv.second.HasMarks()) return true;
    }
  }
  return false;
}

Value Value::Printed() const {
  if (is_string()) return *this;
  std::string text = ToString();
  // A repr() escapes and quotes the strings inside, so their marks cannot
  // follow byte for byte: the whole text counts as marked.
  return HasMarks() ? Marked(std::move(text)) : Value(std::move(text));
}

Value Value::FromJson(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value(None{});
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value(int64_t(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(FromJson(e));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), FromJson(it.value()));
      return Value(std::move(o));
    }
    default: return Value();
  }
}

Value Value::Get(std::string_view key) const {
  if (!is_object()) return Value();
  for (const auto& [k, v] : as_object()) {
    if (k == key) return v;
  }
  return Value();
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_number() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_array()) return !as_array().empty();
  return !as_object().empty();
}

namespace {

std::string FloatText(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // Python prints 1.0, not 1
  return s;
}

std::string QuoteString(const std::string& s) {
  // Python repr(): single quotes unless the text has ' and no ".
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == q) out += '\\';
        out += c;
    }
  }
  return out + q;
}

}  // namespace

std::string Value::ToString() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return FloatText(as_number());
  if (is_string()) return as_string();
  std::string out;
  if (is_array()) {
    out = "[";
    for (size_t i = 0; i < as_array().size(); ++i) out += (i ? ", " : "") + as_array()[i].Repr();
    return out + "]";
  }
  out = "{";
  bool first = true;
  for (const auto& [k, v] : as_object()) {
    out += (first ? "" : ", ") + QuoteString(k) + ": " + v.Repr();
    first = false;
  }
  return out + "}";
}

std::string Value::Repr() const {
  if (is_string()) return QuoteString(as_string());
  if (is_undefined()) return "Undefined";
  return ToString();
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_int() && other.is_int()) return as_int() == other.as_int();
    return as_number() == other.as_number();
  }
  if (is_bool() && other.is_bool()) return as_bool() == other.as_bool();
  if (is_string() && other.is_string()) return as_string() == other.as_string();
  if (is_none() && other.is_none()) return true;
  if (is_undefined() && other.is_undefined()) return true;
  if (is_array() && other.is_array()) {
    const Array& a = as_array();
    const Array& b = other.as_array();
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].Equals(b[i])) return false;
    }
    return true;
  }
  if (is_object() && other.is_object()) {
    const Object& a = as_object();
    if (a.size() != other.as_object().size()) return false;
    for (const auto& [k, v] : a) {
      if (!v.Equals(other.Get(k))) return false;
    }
    return true;
  }
  return false;
}

const char* Value::TypeName() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "none";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "string";
  if (is_array()) return "list";
  return "dict";
}

}  // namespace headway::jinja
