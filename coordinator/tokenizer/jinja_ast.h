// The syntax tree of a parsed Jinja template (jinja.h). Internal to the
// renderer: built by jinja_parser.cc, walked by jinja_render.cc. Every node
// keeps the byte offset of its first character in the source for errors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/tokenizer/jinja.h"

namespace headway::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args: items
    kDict,      // args: key, value, key, value, ...
    kAttr,      // args[0].name
    kIndex,     // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]]  (null child = omitted bound)
    kCall,      // args[0](args[1..]); kwarg_names for keyword arguments
    kFilter,    // args[0] | name(args[1..])
    kTest,      // args[0] is [not] name(args[1..]); negate
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kBinary,    // args[0] op args[1]: + - * / // % ~ == != < <= > >= in "not in" and or
    kCond,      // args[0] if args[1] else args[2] (args[2] may be null: undefined)
  };
  Kind kind;
  size_t pos = 0;
  Value value;
  std::string name;  // name, attribute, filter, test, or operator
  bool negate = false;
  std::vector<ExprPtr> args;
  // For kCall: the keyword of each argument in args[1..]; "" = positional.
  std::vector<std::string> kwarg_names;
};

struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches
    kFor,     // targets, expr (iterable), filter, body, else_body
    kSet,     // targets[0] (or targets[0].attr when attr non-empty) = expr
  };
  Node(Kind k, size_t p) : kind(k), pos(p) {}
  Kind kind;
  size_t pos = 0;
  std::string text;
  ExprPtr expr;
  // kIf: (condition, body) in order; a null condition is the else branch.
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;
  std::vector<std::string> targets;
  std::string attr;
  ExprPtr filter;
  std::vector<Node> body;
  std::vector<Node> else_body;
};

// "line L, column C" of byte offset `pos` in `source` (1-based).
std::string Where(std::string_view source, size_t pos);
// "chat template line L, column C: <what>" as InvalidArgument (an error in
// the template) or, for a construct outside the supported subset,
// Unimplemented.
Status SourceError(std::string_view source, size_t pos, const std::string& what);
Status SourceUnsupported(std::string_view source, size_t pos, const std::string& what);

// Parses the template (jinja_parser.cc). Errors as Template::Parse.
Result<std::vector<Node>> ParseTemplate(std::string_view source, const TemplateOptions& options);

}  // namespace headway::jinja
