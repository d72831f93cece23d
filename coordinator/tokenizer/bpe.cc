#include "coordinator/tokenizer/bpe.h"

#include <limits>
#include <queue>

namespace headway {

namespace {

constexpr bool IsPrintableByte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// byte -> code point, as in GPT-2's bytes_to_unicode.
constexpr std::array<uint32_t, 256> kByteToCodePoint = [] {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = IsPrintableByte(b) ? b : next++;
  return table;
}();

constexpr uint32_t kMaxMappedCodePoint = 256 + 68;

// code point -> byte, -1 where the code point is not in the table's image.
constexpr std::array<int16_t, kMaxMappedCodePoint> kCodePointToByte = [] {
  std::array<int16_t, kMaxMappedCodePoint> table{};
  for (auto& entry : table) entry = -1;
  for (int b = 0; b < 256; ++b) table[kByteToCodePoint[b]] = static_cast<int16_t>(b);
  return table;
}();

// Decodes one UTF-8 code point of at most 2 bytes (all mapped code points
// are below U+0800). Returns the number of bytes used, 0 if `text` does not
// start with such a code point.
size_t DecodeShortUtf8(std::string_view text, uint32_t* code_point) {
  auto b0 = static_cast<uint8_t>(text[0]);
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2 && text.size() >= 2) {
    auto b1 = static_cast<uint8_t>(text[1]);
    if ((b1 & 0xC0) != 0x80) return 0;
    *code_point = ((b0 & 0x1Fu) << 6) | (b1 & 0x3Fu);
    return 2;
  }
  return 0;
}

// Symbols form a doubly linked list over a piece's bytes. Id -1 marks a
// byte without a token (it takes part in no merge and is dropped at the
// end) or, once unlinked, a symbol merged into its left neighbour.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;  // -1 at the ends
};

// A candidate merge of a symbol with its right neighbour; the ids tell a
// stale entry (either symbol merged since) from a live one.
struct Bigram {
  int32_t rank;
  int32_t left;  // symbol index
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};

}  // namespace

std::string ByteToUnicodeText(uint8_t byte) {
  uint32_t cp = kByteToCodePoint[byte];
  std::string text;
  if (cp < 0x80) {
    text.push_back(static_cast<char>(cp));
  } else {
    text.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return text;
}

std::string UnicodeTextToBytes(std::string_view text) {
  std::string bytes;
  bytes.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    size_t used = DecodeShortUtf8(text.substr(i), &cp);
    if (used > 0 && cp < kMaxMappedCodePoint && kCodePointToByte[cp] >= 0) {
      bytes.push_back(static_cast<char>(kCodePointToByte[cp]));
      i += used;
    } else {
      // Not a mapped code point: keep the byte as it is.
      bytes.push_back(text[i]);
      ++i;
    }
  }
  return bytes;
}

Result<BpeModel> BpeModel::Create(const std::vector<std::string>& token_texts,
                                  const std::vector<std::string>& merges) {
  if (token_texts.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument("vocabulary of " + std::to_string(token_texts.size()) +
                                   " tokens does not fit int32 ids");
  }
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(token_texts.size());
  for (size_t id = 0; id < token_texts.size(); ++id) {
    ids.emplace(token_texts[id], static_cast<int32_t>(id));  // keeps the first (lowest) id
  }

  BpeModel model;
  for (int b = 0; b < 256; ++b) {
    std::string text = ByteToUnicodeText(static_cast<uint8_t>(b));
    auto it = ids.find(text);
    model.byte_token_ids_[b] = it == ids.end() ? -1 : it->second;
  }

  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& merge = merges[rank];
    size_t space = merge.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      return Status::InvalidArgument("merge " + std::to_string(rank) + " '" + merge +
                                     "' is not two parts separated by one space");
    }
    std::string_view left(merge.data(), space);
    std::string_view right(merge.data() + space + 1, merge.size() - space - 1);
    std::string merged = std::string(left) + std::string(right);
    auto left_it = ids.find(left);
    auto right_it = ids.find(right);
    auto merged_it = ids.find(merged);
    if (left_it == ids.end() || right_it == ids.end() || merged_it == ids.end()) {
      return Status::InvalidArgument("merge " + std::to_string(rank) + " '" + merge +
                                     "' uses or makes text that is not a token");
    }
    // A pair listed twice keeps its first (higher-priority) rank.
    model.merges_.emplace(PairKey(left_it->second, right_it->second),
                          Merge{static_cast<int32_t>(rank), merged_it->second});
  }
  return model;
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  const size_t n = piece.size();
  if (n == 1) {
    int32_t id = byte_token_ids_[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out->push_back(id);
    return;
  }

  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i) {
    symbols[i] = {byte_token_ids_[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i) + 1 : -1};
  }

  // Lowest rank first, then leftmost (llama.cpp llm_bigram_bpe::comparator).
  auto later = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(later)> queue(later);
  auto add_bigram = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged_id});
  };
  for (size_t i = 0; i + 1 < n; ++i) add_bigram(static_cast<int32_t>(i));

  while (!queue.empty()) {
    Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    // Skip entries made stale by an earlier merge of either symbol.
    if (left.id != bigram.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != bigram.right_id) continue;

    left.id = bigram.merged_id;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    add_bigram(left.prev);
    add_bigram(bigram.left);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    if (symbols[i].id >= 0) out->push_back(symbols[i].id);
  }
}

}  // namespace headway
