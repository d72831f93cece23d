#include "coordinator/structured/regex_parser.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace headway::structured {
namespace {

constexpr int kMaxDepth = 100;
constexpr uint32_t kMaxNonAsciiRange = 4096;

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  } else if (cp < 0x10000) {
    out += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
  } else {
    out += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)),
            char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
  }
  return out;
}

class Parser {
 public:
  Parser(std::string_view re, const RegexOptions& options) : re_(re), options_(options) {}

  Result<Pattern> Parse() {
    if (At('^')) ++pos_;
    Pattern p = Alternation(0);
    if (error_.ok() && pos_ < re_.size()) Fail("unbalanced ')'");
    if (!error_.ok()) return error_;
    return p;
  }

 private:
  bool At(char c) const { return pos_ < re_.size() && re_[pos_] == c; }

  // Sets the first error (the parse then unwinds) and returns an empty pattern.
  Pattern Fail(const std::string& what) {
    if (error_.ok()) {
      error_ = Status::InvalidArgument(what + " at offset " + std::to_string(pos_) +
                                       " of the regex");
    }
    return Empty();
  }

  Pattern Alternation(int depth) {
    if (depth > kMaxDepth) return Fail("groups nested deeper than " + std::to_string(kMaxDepth));
    std::vector<Pattern> alternatives = {Concatenation(depth)};
    while (error_.ok() && At('|')) {
      ++pos_;
      alternatives.push_back(Concatenation(depth));
    }
    return Alt(std::move(alternatives));
  }

  Pattern Concatenation(int depth) {
    std::vector<Pattern> parts;
    while (error_.ok() && pos_ < re_.size() && !At('|') && !At(')')) {
      if (At('$') && pos_ + 1 == re_.size()) {
        ++pos_;
        break;
      }
      parts.push_back(Quantified(depth));
    }
    if (parts.empty()) return Empty();
    return Seq(std::move(parts));
  }

  // A decimal number at pos_, or -1 when there is none.
  int Number() {
    if (pos_ >= re_.size() || re_[pos_] < '0' || re_[pos_] > '9') return -1;
    int64_t n = 0;
    while (pos_ < re_.size() && re_[pos_] >= '0' && re_[pos_] <= '9') {
      n = std::min<int64_t>(n * 10 + (re_[pos_] - '0'), int64_t(1) << 30);
      ++pos_;
    }
    return int(n);
  }

  // {n}, {n,}, {n,m} at pos_: true and the bounds, or false with pos_ kept
  // (then '{' is a literal, as in Python).
  bool Braces(int* min, int* max) {
    const size_t start = pos_;
    ++pos_;
    if (At(',') && pos_ + 1 < re_.size() && re_[pos_ + 1] >= '0' && re_[pos_ + 1] <= '9') {
      pos_ = start;
      Fail("'{,n}' (Python reads it as {0,n}, ECMAScript as text; write {0,n})");
      return false;
    }
    *min = Number();
    if (*min >= 0) {
      *max = *min;
      if (At(',')) {
        ++pos_;
        *max = At('}') ? -1 : Number();
        if (*max == -1 && !At('}')) *max = -2;
      }
      if (*max != -2 && At('}')) {
        ++pos_;
        return true;
      }
    }
    pos_ = start;
    return false;
  }

  Pattern Quantified(int depth) {
    Pattern atom = Atom(depth);
    if (!error_.ok() || pos_ >= re_.size()) return atom;
    int min = 0, max = -1;
    const char c = re_[pos_];
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      ++pos_;
      min = 1;
    } else if (c == '?') {
      ++pos_;
      max = 1;
    } else if (c == '{' && Braces(&min, &max) && error_.ok()) {
      if (max >= 0 && min > max) return Fail("{m,n} with m > n");
      if (min > kMaxRegexRepeat || max > kMaxRegexRepeat) {
        return Fail("a repetition count above " + std::to_string(kMaxRegexRepeat));
      }
    } else {
      return atom;
    }
    if (At('?')) ++pos_;  // lazy: the same language
    if (At('+')) return Fail("a possessive quantifier");
    if (At('*') || At('+') || At('?') || (At('{') && pos_ + 1 < re_.size() &&
                                          re_[pos_ + 1] >= '0' && re_[pos_ + 1] <= '9')) {
      return Fail("a repeated quantifier");
    }
    return Repeat(std::move(atom), min, max);
  }

  // The code point of the UTF-8 character at pos_ (advancing), or fails.
  uint32_t Character() {
    const auto b = static_cast<unsigned char>(re_[pos_]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + size_t(len) > re_.size()) {
      Fail("invalid UTF-8");
      return 0;
    }
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto c = static_cast<unsigned char>(re_[pos_ + size_t(i)]);
      if ((c >> 6) != 2) {
        Fail("invalid UTF-8");
        return 0;
      }
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      Fail("invalid UTF-8");
      return 0;
    }
    pos_ += size_t(len);
    return cp;
  }

  // A character (code point) matched literally, under the JSON options.
  Pattern LiteralChar(uint32_t cp) {
    if (options_.json_string_content && (cp == '"' || cp == '\\' || cp < 0x20)) {
      return Fail("a character JSON must escape ('\"', '\\' or a control character)");
    }
    if (options_.json_whitespace && !IsJsonWhitespace(cp)) {
      return Fail("a character other than JSON whitespace (space, \\t, \\n, \\r)");
    }
    return Literal(Utf8(cp));
  }

  static bool IsJsonWhitespace(uint32_t cp) {
    return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r';
  }

  Pattern Set(CharSet set) {
    if (options_.json_whitespace) {
      CharSet ws = CharSet::Of(" \t\n\r");
      ws.ascii &= set.ascii;
      set = ws;
    }
    if (options_.json_string_content) {
      set.ascii.reset('"');
      set.ascii.reset('\\');
      for (size_t c = 0; c < 0x20; ++c) set.ascii.reset(c);
    }
    if (set.empty()) return Fail("a class that matches no character");
    return Chars(std::move(set));
  }

  int Hex(int digits) {
    int v = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      if (pos_ >= re_.size() || !isxdigit(static_cast<unsigned char>(re_[pos_]))) {
        Fail("a malformed hexadecimal escape");
        return 0;
      }
      const char c = char(tolower(re_[pos_]));
      v = v * 16 + (c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return v;
  }

  // After a backslash: a class escape (\d ...) into *set and true, or a
  // single character into *cp and false.
  bool Escape(CharSet* set, uint32_t* cp) {
    if (pos_ >= re_.size()) {
      Fail("a trailing backslash");
      return false;
    }
    const char c = re_[pos_++];
    static const CharSet kDigit = CharSet::Range('0', '9');
    static const CharSet kWord =
        CharSet(CharSet::Range('a', 'z')).Add(CharSet::Range('A', 'Z')).Add(kDigit).Add(
            CharSet::Of("_"));
    static const CharSet kSpace = CharSet::Of(" \t\n\r\f\v");
    auto negate = [](const CharSet& s) {
      CharSet n = CharSet::AllBut("");
      n.ascii &= ~s.ascii;
      return n;
    };
    switch (c) {
      case 'd': *set = kDigit; return true;
      case 'w': *set = kWord; return true;
      case 's': *set = kSpace; return true;
      case 'D': *set = negate(kDigit); return true;
      case 'W': *set = negate(kWord); return true;
      case 'S': *set = negate(kSpace); return true;
      case 'n': *cp = '\n'; return false;
      case 'r': *cp = '\r'; return false;
      case 't': *cp = '\t'; return false;
      case 'f': *cp = '\f'; return false;
      case 'v': *cp = '\v'; return false;
      case '0': *cp = 0; return false;
      case 'x': *cp = uint32_t(Hex(2)); return false;
      case 'u':
        *cp = uint32_t(Hex(4));
        if (*cp >= 0xD800 && *cp <= 0xDFFF) Fail("a surrogate code point (\\uD800-\\uDFFF)");
        return false;
      default: break;
    }
    if ((c >= '1' && c <= '9') || c == 'k') {
      --pos_;
      Fail("a backreference");
    } else if (c == 'b' || c == 'B' || c == 'A' || c == 'z' || c == 'Z' || c == 'G') {
      --pos_;
      Fail(std::string("the assertion \\") + c);
    } else if (c == 'p' || c == 'P') {
      --pos_;
      Fail("a Unicode property class \\" + std::string(1, c));
    } else if (isalnum(static_cast<unsigned char>(c))) {
      --pos_;
      Fail(std::string("the unknown escape \\") + c);
    }
    *cp = static_cast<unsigned char>(c);
    return false;
  }

  Pattern Group(int depth) {
    ++pos_;  // '('
    if (At('?')) {
      const std::string_view rest = re_.substr(pos_);
      if (rest.substr(0, 2) == "?:") {
        pos_ += 2;
      } else if (rest.substr(0, 3) == "?P<" || (rest.substr(0, 2) == "?<" &&
                                                rest.substr(0, 3) != "?<=" &&
                                                rest.substr(0, 3) != "?<!")) {
        const size_t close = re_.find('>', pos_);
        if (close == std::string_view::npos) return Fail("an unclosed group name");
        pos_ = close + 1;
      } else if (rest.substr(0, 2) == "?=" || rest.substr(0, 2) == "?!" ||
                 rest.substr(0, 3) == "?<=" || rest.substr(0, 3) == "?<!") {
        return Fail("a lookaround");
      } else {
        return Fail("the group construct '(" + std::string(rest.substr(0, 2)) + "'");
      }
    }
    Pattern inner = Alternation(depth + 1);
    if (!error_.ok()) return inner;
    if (!At(')')) return Fail("an unclosed group");
    ++pos_;
    return inner;
  }

  Pattern Class() {
    ++pos_;  // '['
    bool negated = false;
    if (At('^')) {
      negated = true;
      ++pos_;
    }
    CharSet set;
    bool first = true;
    while (error_.ok()) {
      if (pos_ >= re_.size()) return Fail("an unclosed character class");
      if (At(']') && !first) break;
      first = false;
      if (re_.substr(pos_, 2) == "[:") return Fail("a POSIX character class");
      uint32_t lo = 0;
      if (At('\\')) {
        ++pos_;
        CharSet escaped;
        if (Escape(&escaped, &lo)) {
          set.Add(escaped);
          continue;
        }
      } else {
        lo = Character();
      }
      uint32_t hi = lo;
      if (At('-') && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
        ++pos_;
        CharSet unused;
        if (At('\\')) {
          ++pos_;
          if (Escape(&unused, &hi)) return Fail("a class escape as a range end");
        } else {
          hi = Character();
        }
        if (hi < lo) return Fail("a range whose end comes before its start");
      }
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 127); ++c) set.ascii.set(c);
      if (hi >= 128) {
        const uint32_t from = std::max<uint32_t>(lo, 128);
        if (hi - from >= kMaxNonAsciiRange) {
          return Fail("a non-ASCII range wider than " + std::to_string(kMaxNonAsciiRange));
        }
        for (uint32_t c = from; c <= hi; ++c) {
          if (c < 0xD800 || c > 0xDFFF) set.non_ascii.push_back(c);  // surrogates are no characters
        }
      }
    }
    if (!error_.ok()) return Empty();
    ++pos_;  // ']'
    if (!negated) return Set(std::move(set));
    if (!set.non_ascii.empty() && !set.all_non_ascii) {
      return Fail("a negated class listing non-ASCII characters");
    }
    CharSet complement = CharSet::AllBut("");
    complement.ascii &= ~set.ascii;
    complement.all_non_ascii = !set.all_non_ascii;
    return Set(std::move(complement));
  }

  Pattern Atom(int depth) {
    const char c = re_[pos_];
    switch (c) {
      case '(':
        return Group(depth);
      case '[':
        return Class();
      case '.':
        ++pos_;
        return Set(CharSet::AllBut("\n"));
      case '*':
      case '+':
      case '?':
        return Fail("a quantifier with nothing to repeat");
      case '^':
        return Fail("'^' other than at the start");
      case '$':
        return Fail("'$' other than at the end");
      case '\\': {
        ++pos_;
        CharSet set;
        uint32_t cp = 0;
        if (Escape(&set, &cp)) return Set(std::move(set));
        return error_.ok() ? LiteralChar(cp) : Empty();
      }
      default:
        return LiteralChar(Character());
    }
  }

  std::string_view re_;
  const RegexOptions options_;
  size_t pos_ = 0;
  Status error_;
};

}  // namespace

Result<Pattern> ParseRegex(std::string_view regex, const RegexOptions& options) {
  return Parser(regex, options).Parse();
}

}  // namespace headway::structured
