// A regular language over UTF-8 bytes, as a tree: what the regex parser
// (regex_parser.h) and the JSON-schema compiler (json_schema.h) build, and
// what the token automaton (token_automaton.h) compiles into a byte-level
// NFA (Thompson's construction) and then, lazily, a DFA.
//
// Characters are Unicode code points written as UTF-8: a CharSet of
// non-ASCII code points matches their UTF-8 byte sequences, so a language of
// characters is a language of bytes and tokens that end inside a character
// are handled byte by byte.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace headway::structured {

// A set of characters (code points).
struct CharSet {
  std::bitset<128> ascii;              // the ASCII members
  bool all_non_ascii = false;          // every code point >= 0x80
  std::vector<uint32_t> non_ascii;     // listed code points >= 0x80 (when !all_non_ascii)

  // Every character but the ASCII ones in `excluded` (e.g. a negated class,
  // or a JSON string character: CharSet::AllBut("\"\\", true)).
  // `no_controls`: also excludes U+0000..U+001F.
  static CharSet AllBut(const std::string& excluded, bool no_controls = false);
  static CharSet Of(const std::string& ascii_chars);  // those ASCII characters
  static CharSet Range(char lo, char hi);             // ASCII lo..hi, inclusive
  CharSet& Add(const CharSet& other);                 // union, in place
  bool empty() const { return ascii.none() && !all_non_ascii && non_ascii.empty(); }
};

struct PatternNode;
using Pattern = std::shared_ptr<const PatternNode>;

struct PatternNode {
  enum class Kind {
    kBytes,    // the byte string `bytes` (empty: the empty string)
    kChars,    // one character of `chars`
    kConcat,   // children in order
    kAlt,      // any one child
    kRepeat,   // children[0] repeated [min, max] times (max -1: unbounded)
    kSepBy,    // children[0] repeated [min, max] times with children[1] between
  };
  Kind kind = Kind::kBytes;
  std::string bytes;
  CharSet chars;
  std::vector<Pattern> children;
  int min = 0;
  int max = -1;
};

// Builders. None of them fails; sizes are checked when the pattern is
// compiled (TokenAutomaton::Create refuses one whose NFA is too large).
Pattern Literal(std::string bytes);    // the exact bytes (UTF-8 text)
inline Pattern Empty() { return Literal(""); }
Pattern Chars(CharSet chars);          // one character of `chars`
Pattern Seq(std::vector<Pattern> parts);
Pattern Alt(std::vector<Pattern> alternatives);  // REQUIRES: not empty
// `item` repeated [min, max] times; max -1 = unbounded. Each bounded copy
// is a copy in the NFA. REQUIRES: 0 <= min, max == -1 || min <= max.
Pattern Repeat(Pattern item, int min, int max);
inline Pattern Optional(Pattern item) { return Repeat(std::move(item), 0, 1); }
// `item` [min, max] times with `separator` between two items: "a,b,c".
// Unbounded (max -1) with min <= 1 keeps one copy of `item` in the NFA (a
// loop), which is what keeps nested JSON values linear in size.
// REQUIRES: 0 <= min, max == -1 || min <= max.
Pattern SepBy(Pattern item, Pattern separator, int min, int max);

}  // namespace headway::structured
