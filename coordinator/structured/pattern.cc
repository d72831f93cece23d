#include "coordinator/structured/pattern.h"

#include <algorithm>
#include <utility>

namespace headway::structured {

CharSet CharSet::AllBut(const std::string& excluded, bool no_controls) {
  CharSet s;
  s.ascii.set();
  for (unsigned char c : excluded) {
    if (c < 128) s.ascii.reset(c);
  }
  if (no_controls) {
    for (int c = 0; c < 0x20; ++c) s.ascii.reset(size_t(c));
  }
  s.all_non_ascii = true;
  return s;
}

CharSet CharSet::Of(const std::string& ascii_chars) {
  CharSet s;
  for (unsigned char c : ascii_chars) {
    if (c < 128) s.ascii.set(c);
  }
  return s;
}

CharSet CharSet::Range(char lo, char hi) {
  CharSet s;
  for (int c = static_cast<unsigned char>(lo); c <= static_cast<unsigned char>(hi) && c < 128; ++c) {
    s.ascii.set(size_t(c));
  }
  return s;
}

CharSet& CharSet::Add(const CharSet& other) {
  ascii |= other.ascii;
  all_non_ascii = all_non_ascii || other.all_non_ascii;
  if (all_non_ascii) {
    non_ascii.clear();
  } else {
    non_ascii.insert(non_ascii.end(), other.non_ascii.begin(), other.non_ascii.end());
    std::sort(non_ascii.begin(), non_ascii.end());
    non_ascii.erase(std::unique(non_ascii.begin(), non_ascii.end()), non_ascii.end());
  }
  return *this;
}

namespace {

Pattern Make(PatternNode node) { return std::make_shared<const PatternNode>(std::move(node)); }

}  // namespace

Pattern Literal(std::string bytes) {
  PatternNode n;
  n.kind = PatternNode::Kind::kBytes;
  n.bytes = std::move(bytes);
  return Make(std::move(n));
}

Pattern Chars(CharSet chars) {
  PatternNode n;
  n.kind = PatternNode::Kind::kChars;
  n.chars = std::move(chars);
  return Make(std::move(n));
}

Pattern Seq(std::vector<Pattern> parts) {
  if (parts.size() == 1) return parts[0];
  PatternNode n;
  n.kind = PatternNode::Kind::kConcat;
  n.children = std::move(parts);
  return Make(std::move(n));
}

Pattern Alt(std::vector<Pattern> alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  PatternNode n;
  n.kind = PatternNode::Kind::kAlt;
  n.children = std::move(alternatives);
  return Make(std::move(n));
}

Pattern Repeat(Pattern item, int min, int max) {
  PatternNode n;
  n.kind = PatternNode::Kind::kRepeat;
  n.children = {std::move(item)};
  n.min = min;
  n.max = max;
  return Make(std::move(n));
}

Pattern SepBy(Pattern item, Pattern separator, int min, int max) {
  PatternNode n;
  n.kind = PatternNode::Kind::kSepBy;
  n.children = {std::move(item), std::move(separator)};
  n.min = min;
  n.max = max;
  return Make(std::move(n));
}

}  // namespace headway::structured
