// Regular expressions (vLLM's guided_regex, structured_outputs.regex, and a
// JSON schema's "pattern") parsed into a Pattern (pattern.h).
//
// The syntax is the common core of Python's re and ECMAScript:
//   literals (UTF-8), escapes \n \r \t \f \v \0 \xHH \uHHHH and escaped
//   punctuation; . (any character but \n); classes [...] with ranges,
//   negation [^...] and \d \w \s \D \W \S (ASCII meanings: \w is
//   [A-Za-z0-9_], \s is [ \t\n\r\f\v]); groups (...), (?:...),
//   (?P<name>...) and (?<name>...); alternation |; quantifiers * + ? {n}
//   {n,} {n,m}, greedy or lazy (the same language); ^ at the start and $ at
//   the end (the whole output always matches the whole expression).
// Refused with InvalidArgument naming the construct and its offset:
// backreferences, lookaround, \b and other assertions, \p{...}, inline
// flags, possessive quantifiers, POSIX classes, negated classes listing
// non-ASCII characters, non-ASCII ranges wider than 4096 code points,
// surrogate code points (\uD800-\uDFFF), {,n} (Python's {0,n}, ECMAScript's
// text),
// repetition counts above kMaxRegexRepeat, nesting deeper than 100 groups.
#pragma once

#include <string_view>

#include "common/status.h"
#include "coordinator/structured/pattern.h"

namespace headway::structured {

inline constexpr int kMaxRegexRepeat = 1000;

struct RegexOptions {
  // The expression describes the contents of a JSON string (a schema's
  // "pattern"): '"', '\' and U+0000..U+001F, which JSON must escape, are
  // never generated; a literal one is refused.
  bool json_string_content = false;
  // The expression describes whitespace between JSON tokens (vLLM's
  // guided_whitespace_pattern): it may match only ' ', '\t', '\n' and '\r';
  // classes keep just those, any other literal is refused.
  bool json_whitespace = false;
};

// Errors: InvalidArgument "<what> at offset <n> of the regex" for the
// constructs above, malformed syntax (an unclosed group or class, a
// quantifier with nothing to repeat, {m,n} with m > n) and invalid UTF-8.
Result<Pattern> ParseRegex(std::string_view regex, const RegexOptions& options = {});

}  // namespace headway::structured
