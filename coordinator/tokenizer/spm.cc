#include "coordinator/tokenizer/spm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <utility>

namespace headway {

namespace {

// llama.cpp unicode_len_utf8: the sequence length the lead byte announces;
// continuation and invalid lead bytes count as 1.
size_t Utf8LengthFromLeadByte(char c) {
  static constexpr size_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[static_cast<uint8_t>(c) >> 4];
}

// Symbols form a doubly linked list over the characters of the text; a
// symbol is a byte range, and length 0 marks one merged into its left
// neighbour.
struct Symbol {
  uint32_t begin;
  uint32_t length;
  int32_t prev;
  int32_t next;  // -1 at the ends
};

// A candidate merge of two neighbouring symbols into a token.
struct Bigram {
  float score;
  int32_t left;   // symbol index
  int32_t right;  // symbol index
  uint32_t length;  // bytes of the merged text, to detect stale entries
};

// One symbol per character of `text` (non-empty), linked in order.
std::vector<Symbol> CharacterSymbols(std::string_view text) {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t length = std::min(Utf8LengthFromLeadByte(text[pos]), text.size() - pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(length), index - 1,
                       pos + length == text.size() ? -1 : index + 1});
    pos += length;
  }
  return symbols;
}

}  // namespace

Result<SpmModel> SpmModel::Create(std::vector<std::string> token_texts, std::vector<float> scores,
                                  int32_t unk_id) {
  const size_t n_vocab = token_texts.size();
  if (n_vocab > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument("vocabulary of " + std::to_string(n_vocab) +
                                   " tokens does not fit int32 ids");
  }
  if (scores.empty()) scores.assign(n_vocab, 0.0f);
  if (scores.size() != n_vocab) {
    return Status::InvalidArgument("tokenizer has " + std::to_string(scores.size()) +
                                   " scores for " + std::to_string(n_vocab) + " tokens");
  }
  for (size_t id = 0; id < n_vocab; ++id) {
    if (std::isnan(scores[id])) {
      return Status::InvalidArgument("score of token " + std::to_string(id) + " is NaN");
    }
  }
  if (unk_id < -1 || (unk_id >= 0 && static_cast<size_t>(unk_id) >= n_vocab)) {
    return Status::InvalidArgument("unknown id " + std::to_string(unk_id) +
                                   " is outside the vocabulary [0, " + std::to_string(n_vocab) +
                                   ")");
  }

  SpmModel model;
  model.texts_ = std::move(token_texts);
  model.scores_ = std::move(scores);
  model.ids_.reserve(n_vocab);
  for (size_t id = 0; id < n_vocab; ++id) {
    model.ids_.emplace(model.texts_[id], static_cast<int32_t>(id));  // keeps the lowest id
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char fallback[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    int32_t id = model.Find(std::string_view(fallback, 6));
    if (id < 0) id = model.Find(std::string(1, static_cast<char>(b)));
    model.byte_ids_[b] = id >= 0 ? id : unk_id;
  }
  return model;
}

int32_t SpmModel::Find(std::string_view text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

void SpmModel::EncodeBytes(std::string_view bytes, std::vector<int32_t>* out) const {
  for (char c : bytes) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) out->push_back(id);
  }
}

void SpmModel::Encode(std::string_view escaped, std::vector<int32_t>* out) const {
  if (escaped.empty()) return;
  std::vector<Symbol> symbols = CharacterSymbols(escaped);
  // Highest score first, then leftmost (llama.cpp llm_bigram_spm::comparator).
  auto later = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(later)> queue(later);
  auto add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t length = symbols[left].length + symbols[right].length;
    int32_t id = Find(escaped.substr(symbols[left].begin, length));
    if (id < 0) return;
    queue.push({scores_[id], left, right, length});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    add_bigram(static_cast<int32_t>(i) - 1, static_cast<int32_t>(i));
  }

  while (!queue.empty()) {
    Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // A symbol only grows or vanishes, so a changed length means an earlier
    // merge made this entry stale.
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    add_bigram(left.prev, bigram.left);
    add_bigram(bigram.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    std::string_view text = escaped.substr(symbols[i].begin, symbols[i].length);
    // A merged symbol is always a token; only single characters can miss.
    int32_t id = Find(text);
    if (id >= 0) {
      out->push_back(id);
    } else {
      EncodeBytes(text, out);
    }
  }
}

}  // namespace headway
