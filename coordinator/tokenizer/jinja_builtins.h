// The built-ins of the Jinja subset (jinja.h) over values already
// evaluated: global functions, methods of strings and dicts, filters, tests
// and the binary operators other than the short-circuit `and` / `or`, with
// jinja2's (Python's) semantics. Internal to the renderer (jinja_render.cc).
//
// `source` is the template's text and `pos` a byte offset in it, for error
// messages only (SourceError, SourceUnsupported). Errors: InvalidArgument
// for a template error (a wrong type, division by zero, a raised
// exception), Unimplemented for a built-in outside the subset. Pure
// functions: thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "coordinator/tokenizer/jinja_ast.h"

namespace headway::jinja {

// Where the Unicode code points of UTF-8 `s` begin (Python's str indexing
// and len()), then s.size(): code point i is bytes [starts[i], starts[i+1]),
// and there are starts.size() - 1 of them.
std::vector<size_t> CodePointStarts(const std::string& s);

// Bytes [begin, begin + n) of the string `s`, with their marks (jinja.h).
// REQUIRES: s.is_string(), begin + n <= s.as_string().size().
Value Substr(const Value& s, size_t begin, size_t n);

// A string value built piece by piece, keeping the pieces' marks.
class TextBuilder {
 public:
  // Appends what `{{ v }}` prints (Value::Printed), marks included.
  void Append(const Value& v);
  // Appends unmarked text (the template's own).
  void AppendPlain(std::string_view text);
  // The text so far.
  const std::string& text() const { return text_; }
  // The string built; leaves the builder empty.
  Value Take();
  // The text built and its marked byte ranges; leaves the builder empty.
  MarkedText TakeMarked();

 private:
  std::string text_;
  bool has_marks_ = false;  // whether a marked byte was appended
  std::string marks_;       // text_.size() long once has_marks_, else empty
};

// The global function `name` (raise_exception, namespace, range) called at
// `call_pos` with `args` and `kwargs`; `name_pos` is where its name is.
Result<Value> CallFunction(std::string_view source, const std::string& name, const Array& args,
                           const Object& kwargs, size_t call_pos, size_t name_pos);

// self.method(args...): strip, lstrip, rstrip, upper, lower, startswith,
// endswith, replace and split of a string; items, keys, values and get of a
// dict. `pos` is where the method's name is.
Result<Value> CallMethod(std::string_view source, const Value& self, const std::string& method,
                         const Array& args, size_t pos);

// value | filter(args...): trim, upper, lower, capitalize, length (count),
// default (d), string, first, last, join.
Result<Value> ApplyFilter(std::string_view source, const std::string& filter, const Value& value,
                          const Array& args, const Object& kwargs, size_t pos);

// value is test: defined, undefined, none, string, number, integer, float,
// boolean, true, false, mapping, sequence (iterable), odd, even.
Result<bool> ApplyTest(std::string_view source, const std::string& test, const Value& value,
                       size_t pos);

// a op b for op in ~ == != in, not in, < <= > >= + - * / // %.
Result<Value> ApplyBinary(std::string_view source, const std::string& op, const Value& a,
                          const Value& b, size_t pos);

}  // namespace headway::jinja
