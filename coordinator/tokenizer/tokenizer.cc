#include "coordinator/tokenizer/tokenizer.h"

#include <algorithm>
#include <limits>
#include <unordered_set>
#include <utility>

namespace headway {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

Result<std::string> ReadString(const GgufFile& gguf, const std::string& key) {
  HW_ASSIGN_OR_RETURN(const GgufValue* value, gguf.Get(key));
  auto text = value->AsString();
  if (!text.ok()) return text.status().WithContext(key);
  return std::move(text).value();
}

Result<std::vector<std::string>> ReadStringArray(const GgufFile& gguf, const std::string& key) {
  HW_ASSIGN_OR_RETURN(const GgufValue* value, gguf.Get(key));
  auto strings = value->AsStringArray();
  if (!strings.ok()) return strings.status().WithContext(key);
  return std::move(strings).value();
}

// Reads an optional token id; -1 when absent.
Result<int32_t> ReadOptionalId(const GgufFile& gguf, const std::string& key, size_t n_vocab) {
  const GgufValue* value = gguf.Find(key);
  if (value == nullptr) return int32_t{-1};
  auto id = value->AsInt();
  if (!id.ok()) return id.status().WithContext(key);
  if (*id < 0 || static_cast<uint64_t>(*id) >= n_vocab) {
    return Status::InvalidArgument(key + " = " + std::to_string(*id) +
                                   " is outside the vocabulary [0, " +
                                   std::to_string(n_vocab) + ")");
  }
  return static_cast<int32_t>(*id);
}

Status CheckSpecialId(const char* name, int32_t id, size_t n_vocab) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n_vocab)) {
    return Status::InvalidArgument(std::string(name) + " id " + std::to_string(id) +
                                   " is outside the vocabulary [0, " +
                                   std::to_string(n_vocab) + ")");
  }
  return Status::Ok();
}

// Control, unknown and user-defined tokens: decoded as their text, split out
// of text before encoding (llama.cpp cache_special_tokens).
bool IsVerbatim(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUnknown ||
         type == TokenType::kUserDefined;
}

Result<bool> ReadOptionalBool(const GgufFile& gguf, const std::string& key, bool fallback) {
  const GgufValue* value = gguf.Find(key);
  if (value == nullptr) return fallback;
  auto flag = value->AsBool();
  if (!flag.ok()) return flag.status().WithContext(key);
  return *flag;
}

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// The byte of a "<0xXX>" token text, or -1 when `text` has another form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Decoded bytes of a non-verbatim "llama" token (llama.cpp token_to_piece
// for LLAMA_VOCAB_TYPE_SPM).
std::string SpmTokenBytes(TokenType type, std::string_view text) {
  if (type == TokenType::kByte) {
    int byte = ParseByteToken(text);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
    return std::string(text);  // malformed byte token: keep its text
  }
  if (type == TokenType::kUnused || type == TokenType::kUndefined) return "";
  std::string bytes;
  bytes.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = text.find(kSpmSpace, pos);
    if (next == std::string_view::npos) next = text.size();
    bytes.append(text, pos, next - pos);
    if (next == text.size()) break;
    bytes.push_back(' ');
    pos = next + kSpmSpace.size();
  }
  return bytes;
}

// Length of the UTF-8 character at the front of `bytes`: > 0 when complete
// and valid, 0 when `bytes` ends inside a still-valid character, -k when the
// first k bytes are an ill-formed sequence to be replaced by one U+FFFD (the
// "maximal subpart" rule of Unicode 15, section 3.9; well-formed sequences
// per Table 3-7).
int Utf8CharLength(std::string_view bytes) {
  auto b0 = static_cast<uint8_t>(bytes[0]);
  if (b0 < 0x80) return 1;
  int length = 0;
  uint8_t low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < length; ++i) {
    if (static_cast<size_t>(i) >= bytes.size()) return 0;
    auto b = static_cast<uint8_t>(bytes[i]);
    uint8_t lo = i == 1 ? low : 0x80;
    uint8_t hi = i == 1 ? high : 0xBF;
    if (b < lo || b > hi) return -i;
  }
  return length;
}

// tokenizer.ggml.pre: required by "gpt2" (and checked now, so that the
// error names the file's value early), optional for "llama"; "" if absent.
Result<std::string> ReadPreTokenizerName(const GgufFile& gguf, bool is_spm) {
  if (!is_spm) {
    if (gguf.Find("tokenizer.ggml.pre") == nullptr) {
      return Status::Unimplemented("no tokenizer.ggml.pre in " + gguf.path() +
                                   "; Headway needs a named pre-tokenizer (supported: smollm)");
    }
    HW_ASSIGN_OR_RETURN(std::string pre, ReadString(gguf, "tokenizer.ggml.pre"));
    HW_RETURN_IF_ERROR(PreTokenizer::Create(pre).status());
    return pre;
  }
  if (gguf.Find("tokenizer.ggml.pre") != nullptr) return ReadString(gguf, "tokenizer.ggml.pre");
  return std::string();
}

// A per-token array `key` of `num_entries` entries for `n_vocab` tokens.
Status CheckOnePerToken(const char* key, size_t num_entries, size_t n_vocab) {
  if (num_entries == n_vocab) return Status::Ok();
  return Status::InvalidArgument(std::string(key) + " has " + std::to_string(num_entries) +
                                 " entries for " + std::to_string(n_vocab) + " tokens");
}

// tokenizer.ggml.token_type, one per token; all normal when absent.
Result<std::vector<TokenType>> ReadTokenTypes(const GgufFile& gguf, size_t n_vocab) {
  const GgufValue* types = gguf.Find("tokenizer.ggml.token_type");
  if (types == nullptr) return std::vector<TokenType>(n_vocab, TokenType::kNormal);
  auto values = types->AsIntArray();
  if (!values.ok()) return values.status().WithContext("tokenizer.ggml.token_type");
  HW_RETURN_IF_ERROR(CheckOnePerToken("tokenizer.ggml.token_type", values->size(), n_vocab));
  std::vector<TokenType> token_types;
  token_types.reserve(n_vocab);
  for (size_t id = 0; id < n_vocab; ++id) {
    int64_t type = (*values)[id];
    if (type < 0 || type > static_cast<int64_t>(TokenType::kByte)) {
      return Status::InvalidArgument("tokenizer.ggml.token_type of token " +
                                     std::to_string(id) + " is " + std::to_string(type) +
                                     ", not 0..6");
    }
    token_types.push_back(static_cast<TokenType>(type));
  }
  return token_types;
}

// tokenizer.ggml.scores ("llama" only), one per token; empty when absent.
Result<std::vector<float>> ReadScores(const GgufFile& gguf, size_t n_vocab) {
  const GgufValue* scores = gguf.Find("tokenizer.ggml.scores");
  if (scores == nullptr) return std::vector<float>();
  auto values = scores->AsFloatArray();
  if (!values.ok()) return values.status().WithContext("tokenizer.ggml.scores");
  HW_RETURN_IF_ERROR(CheckOnePerToken("tokenizer.ggml.scores", values->size(), n_vocab));
  return std::vector<float>(values->begin(), values->end());
}

// The special token ids and the add_bos / add_space_prefix flags, with
// llama.cpp's defaults when a key is absent (llama_vocab::impl::load).
Status ReadSpecialTokens(const GgufFile& gguf, bool is_spm, TokenizerVocab* vocab) {
  const size_t n_vocab = vocab->tokens.size();
  HW_ASSIGN_OR_RETURN(vocab->bos_id, ReadOptionalId(gguf, "tokenizer.ggml.bos_token_id", n_vocab));
  HW_ASSIGN_OR_RETURN(vocab->eos_id, ReadOptionalId(gguf, "tokenizer.ggml.eos_token_id", n_vocab));
  HW_ASSIGN_OR_RETURN(vocab->unk_id,
                      ReadOptionalId(gguf, "tokenizer.ggml.unknown_token_id", n_vocab));
  HW_ASSIGN_OR_RETURN(vocab->pad_id,
                      ReadOptionalId(gguf, "tokenizer.ggml.padding_token_id", n_vocab));
  vocab->add_bos = is_spm;
  vocab->add_space_prefix = is_spm;
  HW_ASSIGN_OR_RETURN(vocab->add_bos,
                      ReadOptionalBool(gguf, "tokenizer.ggml.add_bos_token", vocab->add_bos));
  if (is_spm) {
    HW_ASSIGN_OR_RETURN(vocab->add_space_prefix,
                        ReadOptionalBool(gguf, "tokenizer.ggml.add_space_prefix",
                                         vocab->add_space_prefix));
  }
  return Status::Ok();
}

}  // namespace

Result<TokenizerVocab> LoadTokenizerVocab(const GgufFile& gguf) {
  TokenizerVocab vocab;
  HW_ASSIGN_OR_RETURN(vocab.model, ReadString(gguf, "tokenizer.ggml.model"));
  const bool is_spm = vocab.model == "llama";
  if (vocab.model != "gpt2" && !is_spm) {
    return Status::Unimplemented("tokenizer model '" + vocab.model + "' (tokenizer.ggml.model in " +
                                 gguf.path() + ") is not supported; supported: gpt2, llama");
  }
  HW_ASSIGN_OR_RETURN(vocab.pre, ReadPreTokenizerName(gguf, is_spm));
  HW_ASSIGN_OR_RETURN(vocab.tokens, ReadStringArray(gguf, "tokenizer.ggml.tokens"));
  if (!is_spm) {
    HW_ASSIGN_OR_RETURN(vocab.merges, ReadStringArray(gguf, "tokenizer.ggml.merges"));
  }
  HW_ASSIGN_OR_RETURN(vocab.token_types, ReadTokenTypes(gguf, vocab.tokens.size()));
  if (is_spm) {
    HW_ASSIGN_OR_RETURN(vocab.scores, ReadScores(gguf, vocab.tokens.size()));
  }
  HW_RETURN_IF_ERROR(ReadSpecialTokens(gguf, is_spm, &vocab));
  return vocab;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerVocab vocab) {
  const bool is_spm = vocab.model == "llama";
  if (vocab.model != "gpt2" && !is_spm) {
    return Status::Unimplemented("tokenizer model '" + vocab.model +
                                 "' is not supported; supported: gpt2, llama");
  }
  const size_t n_vocab = vocab.tokens.size();
  if (n_vocab == 0) return Status::InvalidArgument("tokenizer vocabulary is empty");
  if (n_vocab > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument("vocabulary of " + std::to_string(n_vocab) +
                                   " tokens does not fit int32 ids");
  }
  if (vocab.token_types.empty()) vocab.token_types.assign(n_vocab, TokenType::kNormal);
  if (vocab.token_types.size() != n_vocab) {
    return Status::InvalidArgument("tokenizer has " + std::to_string(vocab.token_types.size()) +
                                   " token types for " + std::to_string(n_vocab) + " tokens");
  }
  HW_RETURN_IF_ERROR(CheckSpecialId("BOS", vocab.bos_id, n_vocab));
  HW_RETURN_IF_ERROR(CheckSpecialId("EOS", vocab.eos_id, n_vocab));
  HW_RETURN_IF_ERROR(CheckSpecialId("unknown", vocab.unk_id, n_vocab));
  HW_RETURN_IF_ERROR(CheckSpecialId("padding", vocab.pad_id, n_vocab));

  std::unique_ptr<Tokenizer> tokenizer;
  if (is_spm) {
    HW_ASSIGN_OR_RETURN(SpmModel spm, SpmModel::Create(vocab.tokens, vocab.scores, vocab.unk_id));
    tokenizer.reset(new Tokenizer(std::move(vocab)));
    tokenizer->spm_.emplace(std::move(spm));
  } else {
    HW_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> pre, PreTokenizer::Create(vocab.pre));
    HW_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::Create(vocab.tokens, vocab.merges));
    tokenizer.reset(new Tokenizer(std::move(vocab)));
    tokenizer->pre_ = std::move(pre);
    tokenizer->bpe_.emplace(std::move(bpe));
  }
  tokenizer->BuildTables();
  return tokenizer;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  HW_ASSIGN_OR_RETURN(TokenizerVocab vocab, LoadTokenizerVocab(gguf));
  auto tokenizer = Create(std::move(vocab));
  if (!tokenizer.ok()) return tokenizer.status().WithContext("tokenizer of " + gguf.path());
  return tokenizer;
}

Tokenizer::Tokenizer(TokenizerVocab vocab) : vocab_(std::move(vocab)) {}

void Tokenizer::BuildTables() {
  const size_t n_vocab = vocab_.tokens.size();
  const bool is_spm = spm_.has_value();
  token_bytes_.reserve(n_vocab);
  // SpmModel has its own text -> id table; one of 262144 entries takes a
  // good part of the load time.
  if (!is_spm) text_to_id_.reserve(n_vocab);
  std::vector<int32_t> specials;
  for (size_t i = 0; i < n_vocab; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& text = vocab_.tokens[i];
    const TokenType type = vocab_.token_types[i];
    if (IsVerbatim(type)) {
      token_bytes_.push_back(text);
    } else if (!is_spm) {
      token_bytes_.push_back(UnicodeTextToBytes(text));
    } else {
      token_bytes_.push_back(SpmTokenBytes(type, text));
    }
    if (!is_spm) text_to_id_.emplace(text, id);  // keeps the lowest id of a repeated text
    if (IsVerbatim(type) && !text.empty()) specials.push_back(id);
  }

  // Longest first; llama.cpp leaves equal lengths in std::sort's order, Headway
  // takes the lower id first.
  std::stable_sort(specials.begin(), specials.end(), [this](int32_t a, int32_t b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });
  special_rank_.assign(n_vocab, -1);
  trie_token_.assign(1, -1);
  for (size_t rank = 0; rank < specials.size(); ++rank) {
    const int32_t id = specials[rank];
    special_rank_[id] = static_cast<int32_t>(rank);
    int32_t node = 0;
    for (char c : vocab_.tokens[id]) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = trie_edges_.emplace(key, static_cast<int32_t>(trie_token_.size()));
      if (inserted) trie_token_.push_back(-1);
      node = it->second;
    }
    if (trie_token_[node] < 0) trie_token_[node] = id;  // a repeated text keeps the first
  }
}

std::vector<Tokenizer::SpecialMatch> Tokenizer::FindSpecials(
    std::string_view text, bool parse_special,
    const std::vector<TextRange>& literal_ranges) const {
  // The special tokens that occur in `text` and may be split out.
  std::vector<int32_t> found;
  std::unordered_set<int32_t> seen;
  for (size_t begin = 0; begin < text.size(); ++begin) {
    int32_t node = 0;
    for (size_t pos = begin; pos < text.size(); ++pos) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[pos]);
      auto it = trie_edges_.find(key);
      if (it == trie_edges_.end()) break;
      node = it->second;
      const int32_t id = trie_token_[node];
      if (id < 0) continue;
      if (!parse_special && vocab_.token_types[id] != TokenType::kUserDefined) continue;
      if (seen.insert(id).second) found.push_back(id);
    }
  }
  std::vector<SpecialMatch> matches;
  if (found.empty()) return matches;
  std::sort(found.begin(), found.end(),
            [this](int32_t a, int32_t b) { return special_rank_[a] < special_rank_[b]; });

  // llama.cpp's partition: one token at a time in rank order, each splitting
  // every fragment of unclaimed text at its occurrences, left to right.
  // Literal text starts as fragments of its own, so that no match crosses
  // its edges, and only user-defined tokens split it.
  constexpr int32_t kText = -1;     // unclaimed text
  constexpr int32_t kLiteral = -2;  // unclaimed text of a literal range
  struct Fragment {
    size_t begin;
    size_t length;
    int32_t id;  // a special token, or kText, kLiteral
  };
  std::vector<Fragment> fragments;
  size_t covered = 0;
  for (const TextRange& range : literal_ranges) {
    if (range.begin > covered) fragments.push_back({covered, range.begin - covered, kText});
    if (range.end > range.begin) fragments.push_back({range.begin, range.end - range.begin, kLiteral});
    covered = range.end;
  }
  if (covered < text.size() || fragments.empty()) {
    fragments.push_back({covered, text.size() - covered, kText});
  }
  std::vector<Fragment> next;
  for (int32_t id : found) {
    const std::string& special = vocab_.tokens[id];
    const bool user_defined = vocab_.token_types[id] == TokenType::kUserDefined;
    next.clear();
    for (const Fragment& fragment : fragments) {
      if (fragment.id >= 0 || (fragment.id == kLiteral && !user_defined)) {
        next.push_back(fragment);
        continue;
      }
      const size_t end = fragment.begin + fragment.length;
      size_t begin = fragment.begin;
      while (begin < end) {
        size_t match = text.substr(0, end).find(special, begin);
        if (match == std::string_view::npos) break;
        if (match > begin) next.push_back({begin, match - begin, fragment.id});
        next.push_back({match, special.size(), id});
        begin = match + special.size();
      }
      if (begin < end) next.push_back({begin, end - begin, fragment.id});
    }
    fragments.swap(next);
  }
  for (const Fragment& fragment : fragments) {
    if (fragment.id >= 0) matches.push_back({fragment.begin, fragment.id});
  }
  return matches;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  return EncodeAround(text, FindSpecials(text, parse_special, {}));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text,
                                       const std::vector<TextRange>& literal_ranges) const {
  return EncodeAround(text, FindSpecials(text, /*parse_special=*/true, literal_ranges));
}

std::vector<int32_t> Tokenizer::EncodeAround(std::string_view text,
                                             const std::vector<SpecialMatch>& specials) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t segment_begin = 0;  // start of ordinary text not yet encoded
  bool follows_special = true;
  for (const SpecialMatch& match : specials) {
    if (match.begin > segment_begin) {
      EncodeOrdinary(text.substr(segment_begin, match.begin - segment_begin), follows_special,
                     &ids);
    }
    ids.push_back(match.id);
    follows_special = true;
    segment_begin = match.begin + vocab_.tokens[match.id].size();
  }
  if (segment_begin < text.size()) {
    EncodeOrdinary(text.substr(segment_begin), follows_special, &ids);
  }
  return ids;
}

void Tokenizer::EncodeOrdinary(std::string_view text, bool follows_special,
                               std::vector<int32_t>* out) const {
  if (text.empty()) return;
  if (spm_.has_value()) {
    std::string escaped;
    escaped.reserve(text.size() + text.size() / 2 + 3);
    if (vocab_.add_space_prefix && follows_special) escaped.append(kSpmSpace);
    for (char c : text) {
      if (c == ' ') {
        escaped.append(kSpmSpace);
      } else {
        escaped.push_back(c);
      }
    }
    spm_->Encode(escaped, out);
    return;
  }
  for (std::string_view piece : pre_->Split(text)) bpe_->Encode(piece, out);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) text.append(TokenBytes(id));
  return text;
}

Result<std::string> Tokenizer::DecodeChecked(const std::vector<int32_t>& ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return Status::InvalidArgument("token id " + std::to_string(ids[i]) + " at position " +
                                     std::to_string(i) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab_size()) + ")");
    }
  }
  return Decode(ids);
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

Result<std::string_view> Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return Status::InvalidArgument("token id " + std::to_string(id) +
                                   " is outside the vocabulary [0, " +
                                   std::to_string(vocab_size()) + ")");
  }
  return std::string_view(vocab_.tokens[id]);
}

Result<int32_t> Tokenizer::TokenId(std::string_view piece) const {
  int32_t id = -1;
  if (spm_.has_value()) {
    id = spm_->Find(piece);
  } else if (auto it = text_to_id_.find(piece); it != text_to_id_.end()) {
    id = it->second;
  }
  if (id < 0) return Status::NotFound("no token with text '" + std::string(piece) + "'");
  return id;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const TokenType type = vocab_.token_types[id];
  return type == TokenType::kControl || type == TokenType::kUnknown;
}

std::string StreamDecoder::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    // Whatever was held back can no longer be completed.
    std::string text = Drain(/*final=*/true);
    text.append(kReplacementChar);
    return text;
  }
  pending_.append(tokenizer_->TokenBytes(id));
  return Drain(/*final=*/false);
}

std::string StreamDecoder::Flush() { return Drain(/*final=*/true); }

std::string StreamDecoder::Drain(bool final) {
  std::string text;
  size_t pos = 0;
  while (pos < pending_.size()) {
    int length = Utf8CharLength(std::string_view(pending_).substr(pos));
    if (length > 0) {
      text.append(pending_, pos, length);
      pos += length;
    } else if (length == 0 && !final) {
      break;  // wait for the rest of the character
    } else if (length == 0) {
      text.append(kReplacementChar);  // truncated at the end of the stream
      pos = pending_.size();
    } else {
      text.append(kReplacementChar);
      pos += -length;
    }
  }
  pending_.erase(0, pos);
  return text;
}

}  // namespace headway
