// A renderer for the subset of Jinja2 that chat templates use (the
// `tokenizer.chat_template` of a GGUF file, written for Hugging Face's
// `apply_chat_template`, which renders with jinja2 and
// trim_blocks=True, lstrip_blocks=True).
//
// Supported (https://jinja.palletsprojects.com/en/3.1.x/templates/):
//   text, {{ expr }}, {# comment #}, whitespace control `{%-`, `-%}`, `{{-`,
//   `-}}`, `{%+`, `+%}`; trim_blocks and lstrip_blocks;
//   {% if %} / {% elif %} / {% else %} / {% endif %};
//   {% for x in expr [if cond] %} ... [{% else %}] {% endfor %} with tuple
//   targets (`for k, v in d.items()`) and `loop.index`, `loop.index0`,
//   `loop.revindex`, `loop.revindex0`, `loop.first`, `loop.last`,
//   `loop.length`;
//   {% set name = expr %} and {% set ns.attr = expr %} (with namespace());
//   expressions: string, integer, float, true/false/none literals, lists,
//   dicts, names, `a.b`, `a[b]`, slices `a[i:j]`, calls, `x if c else y`,
//   `+ - * / // %`, `~`, `== != < <= > >=`, `in`, `not in`, `and or not`,
//   filters `trim length count upper lower default string first last join
//   capitalize`, tests `is [not] defined/undefined/none/string/number/
//   mapping/sequence/iterable/boolean/true/false/odd/even`;
//   functions `raise_exception(msg)`, `namespace(...)`, `range(...)`;
//   methods: strings `strip lstrip rstrip upper lower startswith endswith
//   split replace`, dicts `items keys values get`.
// Anything else (macros, `{% raw %}`, `{% break %}`, other filters and
// tests, `%` formatting) is an Unimplemented error naming the construct and
// its line and column, at parse time when it can be seen there.
//
// Semantics follow Python jinja2 3.1 with its default Undefined: printing an
// undefined value gives "", its attributes are an error; a missing key of a
// dict is undefined; `set` inside a for loop does not leak out of it.
//
// Marked strings. A string may carry marks saying which of its bytes came
// from marked input (Value::Marked: chat message contents, whose special
// tokens must stay text). Marks follow the bytes through every string
// operation: concatenation (`~`, `+`, join, output), slicing and indexing,
// trim and strip, upper/lower/capitalize, split and replace, so that
// RenderMarked can say which bytes of the output came from marked input
// however the template rewrote it. Text a template derives from marked bytes
// is marked too: a replace() whose match touches a marked byte inserts a
// marked replacement, and a list or dict printed whole is marked whole when
// it holds a marked string. A marked string used as a dict key is refused
// (Unimplemented), since keys carry no marks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace headway::jinja {

class Value;
using Array = std::vector<Value>;
// Insertion-ordered, as Python dicts are.
using Object = std::vector<std::pair<std::string, Value>>;

// A dynamically typed template value. Arrays and objects are shared (copies
// are cheap and alias, as Python references do); only namespace() objects
// are ever mutated.
class Value {
 public:
  struct Undefined {};
  struct None {};

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  // A string with `marks`: empty (no byte marked) or one byte per byte of
  // `s`, nonzero where marked. REQUIRES: marks.empty() || marks.size() == s.size().
  Value(std::string s, std::string marks);
  // A string whose every byte is marked.
  static Value Marked(std::string s);
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}

  // JSON null -> none, numbers, strings, arrays and objects as themselves.
  static Value FromJson(const nlohmann::json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }

  // REQUIRES: the matching is_*().
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_number() const { return is_int() ? double(as_int()) : std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Object& mutable_object() { return *std::get<std::shared_ptr<Object>>(v_); }

  // A string's marks: empty when no byte is marked, else one byte per byte
  // of as_string(), nonzero where marked. Empty for other types.
  const std::string& marks() const { return marks_; }
  // Whether this string, or any string inside this list or dict, has a
  // marked byte.
  bool HasMarks() const;

  // The value of `key` in an object, or undefined (also for non-objects).
  Value Get(std::string_view key) const;

  // Python truthiness: undefined, none, false, 0, "", [], {} are false.
  bool Truthy() const;

  // What `{{ value }}` prints (Python str(): None, True, ['a', 1], ...);
  // undefined prints "".
  std::string ToString() const;

  // ToString as a string value with marks: a string keeps its own; a list
  // or dict is marked whole when HasMarks(); other values are unmarked.
  Value Printed() const;

  // Python repr() (strings quoted), for list and dict contents.
  std::string Repr() const;

  // Python ==, with 1 == 1.0 and deep comparison of lists and dicts.
  bool Equals(const Value& other) const;

  // Short type name for error messages ("string", "list", ...).
  const char* TypeName() const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      v_;
  std::string marks_;  // strings only; see marks()
};

// Rendered text and the byte ranges of it that came from marked strings.
struct MarkedText {
  std::string text;
  // [begin, end) byte offsets into text: sorted, disjoint, not adjacent,
  // not empty.
  std::vector<std::pair<size_t, size_t>> marked_ranges;
};

struct TemplateOptions {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // drop spaces and tabs before a block tag on its line
};

struct Node;  // jinja_ast.h

// A parsed template; immutable, Render is thread-safe.
class Template {
 public:
  // Parses `source`. Errors: InvalidArgument for a syntax error,
  // Unimplemented for a construct outside the subset; both say
  // "line L, column C" (1-based) and what was found there.
  static Result<Template> Parse(std::string_view source, TemplateOptions options = {});

  // Renders with `context`'s keys as the global variables.
  // Errors: InvalidArgument for raise_exception(msg) (the message is msg)
  // and for type errors (e.g. "x" + 1, an attribute of an undefined value),
  // Unimplemented for an unsupported filter, test, function or method met
  // while rendering; each names its line and column.
  Result<std::string> Render(const std::map<std::string, Value>& context) const;

  // Render, and where the output's marked bytes are (see "Marked strings"
  // above): the bytes of Value::Marked strings in `context`, wherever the
  // template moved them. Errors: Render's. The text equals Render's.
  Result<MarkedText> RenderMarked(const std::map<std::string, Value>& context) const;

  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

 private:
  Template(std::string source, std::vector<Node> body);

  std::shared_ptr<const std::string> source_;  // for line/column in errors
  std::shared_ptr<const std::vector<Node>> body_;
};

}  // namespace headway::jinja
