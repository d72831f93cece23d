#include "coordinator/structured/nfa.h"

#include <algorithm>
#include <string>
#include <utility>

namespace headway::structured {
namespace {

struct Fragment {
  int32_t start = 0;
  int32_t end = 0;
};

// Appends UTF-8 of code point `cp` (< 0x110000) to `out`.
void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

class Builder {
 public:
  explicit Builder(size_t max_states) : max_states_(max_states) {}

  Result<Nfa> Compile(const Pattern& pattern) {
    const Fragment f = Build(*pattern);
    if (too_large_) {
      return Status::ResourceExhausted("the grammar needs more than " +
                                       std::to_string(max_states_) +
                                       " automaton states; make repetition counts, lengths or "
                                       "nesting smaller");
    }
    nfa_.start = f.start;
    nfa_.accept = f.end;
    return std::move(nfa_);
  }

 private:
  int32_t NewState() {
    if (nfa_.states.size() >= max_states_) {
      too_large_ = true;
      return 0;  // keeps building harmlessly; Compile reports the error
    }
    nfa_.states.emplace_back();
    return int32_t(nfa_.states.size() - 1);
  }
  void Epsilon(int32_t from, int32_t to) {
    if (!too_large_) nfa_.states[size_t(from)].epsilon.push_back(to);
  }
  void Edge(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
    if (!too_large_) nfa_.states[size_t(from)].edges.push_back({lo, hi, to});
  }

  Fragment Bytes(const std::string& bytes) {
    const int32_t start = NewState();
    int32_t at = start;
    for (unsigned char b : bytes) {
      const int32_t next = NewState();
      Edge(at, b, b, next);
      at = next;
    }
    return {start, at};
  }

  Fragment CharsOf(const CharSet& set) {
    const Fragment f{NewState(), NewState()};
    for (int c = 0; c < 128;) {
      if (!set.ascii.test(size_t(c))) {
        ++c;
        continue;
      }
      int hi = c;
      while (hi + 1 < 128 && set.ascii.test(size_t(hi + 1))) ++hi;
      Edge(f.start, uint8_t(c), uint8_t(hi), f.end);
      c = hi + 1;
    }
    if (set.all_non_ascii) {
      // Every well-formed UTF-8 sequence of 2 to 4 bytes (lead byte ranges
      // of RFC 3629; overlong 3- and 4-byte forms are let through).
      const int32_t one = NewState(), two = NewState(), three = NewState();
      Edge(one, 0x80, 0xBF, f.end);
      Edge(two, 0x80, 0xBF, one);
      Edge(three, 0x80, 0xBF, two);
      Edge(f.start, 0xC2, 0xDF, one);
      Edge(f.start, 0xE0, 0xEF, two);
      Edge(f.start, 0xF0, 0xF4, three);
    } else {
      for (uint32_t cp : set.non_ascii) {
        std::string utf8;
        AppendUtf8(cp, &utf8);
        const Fragment seq = Bytes(utf8);
        Epsilon(f.start, seq.start);
        Epsilon(seq.end, f.end);
      }
    }
    return f;
  }

  Fragment Concat(const std::vector<Pattern>& parts) {
    Fragment f = Bytes("");
    for (const Pattern& p : parts) {
      const Fragment next = Build(*p);
      Epsilon(f.end, next.start);
      f.end = next.end;
    }
    return f;
  }

  Fragment Alternatives(const std::vector<Pattern>& alternatives) {
    const Fragment f{NewState(), NewState()};
    for (const Pattern& p : alternatives) {
      const Fragment a = Build(*p);
      Epsilon(f.start, a.start);
      Epsilon(a.end, f.end);
    }
    return f;
  }

  // `item` min..max times: min copies, then (max - min) nested optional
  // copies, or one looping copy when unbounded.
  Fragment Repeated(const PatternNode& item, int min, int max) {
    Fragment f = Bytes("");
    for (int i = 0; i < min && !too_large_; ++i) {
      const Fragment copy = Build(item);
      Epsilon(f.end, copy.start);
      f.end = copy.end;
    }
    if (max < 0) {
      const int32_t loop = NewState();
      const Fragment copy = Build(item);
      Epsilon(f.end, loop);
      Epsilon(loop, copy.start);
      Epsilon(copy.end, loop);
      f.end = loop;
      return f;
    }
    const int32_t end = NewState();
    for (int i = min; i < max && !too_large_; ++i) {
      Epsilon(f.end, end);  // stop here
      const Fragment copy = Build(item);
      Epsilon(f.end, copy.start);
      f.end = copy.end;
    }
    Epsilon(f.end, end);
    f.end = end;
    return f;
  }

  Fragment SeparatedBy(const PatternNode& node) {
    const Pattern& item = node.children[0];
    const Pattern& sep = node.children[1];
    if (node.max < 0 && node.min <= 1) {
      // One copy of the item in a loop through the separator.
      const Fragment f{NewState(), NewState()};
      const Fragment i = Build(*item);
      const Fragment s = Build(*sep);
      Epsilon(f.start, i.start);
      Epsilon(i.end, f.end);
      Epsilon(i.end, s.start);
      Epsilon(s.end, i.start);
      if (node.min == 0) Epsilon(f.start, f.end);
      return f;
    }
    if (node.max == 0) return Bytes("");
    const Pattern rest = Repeat(Seq({sep, item}), std::max(node.min - 1, 0),
                                node.max < 0 ? -1 : node.max - 1);
    const Pattern whole = Seq({item, rest});
    return Build(node.min == 0 ? *Optional(whole) : *whole);
  }

  Fragment Build(const PatternNode& node) {
    if (too_large_) return {0, 0};
    switch (node.kind) {
      case PatternNode::Kind::kBytes:
        return Bytes(node.bytes);
      case PatternNode::Kind::kChars:
        return CharsOf(node.chars);
      case PatternNode::Kind::kConcat:
        return Concat(node.children);
      case PatternNode::Kind::kAlt:
        return Alternatives(node.children);
      case PatternNode::Kind::kRepeat:
        return Repeated(*node.children[0], node.min, node.max);
      case PatternNode::Kind::kSepBy:
        return SeparatedBy(node);
    }
    return Bytes("");
  }

  const size_t max_states_;
  bool too_large_ = false;
  Nfa nfa_;
};

// Adds `s` and every state reachable from it by epsilon edges to `set`.
void Closure(const Nfa& nfa, int32_t s, std::vector<char>* in, std::vector<int32_t>* set) {
  std::vector<int32_t> todo = {s};
  while (!todo.empty()) {
    const int32_t x = todo.back();
    todo.pop_back();
    if ((*in)[size_t(x)]) continue;
    (*in)[size_t(x)] = 1;
    set->push_back(x);
    for (int32_t e : nfa.states[size_t(x)].epsilon) todo.push_back(e);
  }
}

}  // namespace

Result<Nfa> CompileNfa(const Pattern& pattern, size_t max_states) {
  return Builder(max_states).Compile(pattern);
}

bool FullMatch(const Nfa& nfa, std::string_view bytes) {
  std::vector<char> in(nfa.states.size(), 0);
  std::vector<int32_t> set;
  Closure(nfa, nfa.start, &in, &set);
  for (unsigned char b : bytes) {
    std::vector<char> next_in(nfa.states.size(), 0);
    std::vector<int32_t> next;
    for (int32_t s : set) {
      for (const NfaState::Edge& e : nfa.states[size_t(s)].edges) {
        if (b >= e.lo && b <= e.hi) Closure(nfa, e.to, &next_in, &next);
      }
    }
    if (next.empty()) return false;
    set = std::move(next);
    in = std::move(next_in);
  }
  return in[size_t(nfa.accept)] != 0;
}

}  // namespace headway::structured
