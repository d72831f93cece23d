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

// The Unicode code points of UTF-8 `s`, one string each (Python's str
// indexing and len()).
std::vector<std::string> CodePoints(const std::string& s);

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
