#include "coordinator/tokenizer.h"

#include <algorithm>
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

bool IsVerbatim(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUserDefined;
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

}  // namespace

Result<TokenizerVocab> LoadTokenizerVocab(const GgufFile& gguf) {
  TokenizerVocab vocab;
  HW_ASSIGN_OR_RETURN(vocab.model, ReadString(gguf, "tokenizer.ggml.model"));
  if (vocab.model != "gpt2") {
    return Status::Unimplemented("tokenizer model '" + vocab.model + "' (tokenizer.ggml.model in " +
                                 gguf.path() + ") is not supported; supported: gpt2");
  }
  if (gguf.Find("tokenizer.ggml.pre") == nullptr) {
    return Status::Unimplemented("no tokenizer.ggml.pre in " + gguf.path() +
                                 "; Headway needs a named pre-tokenizer (supported: smollm)");
  }
  HW_ASSIGN_OR_RETURN(vocab.pre, ReadString(gguf, "tokenizer.ggml.pre"));
  // Check now so that the error names the file's value early.
  HW_RETURN_IF_ERROR(PreTokenizer::Create(vocab.pre).status());

  HW_ASSIGN_OR_RETURN(vocab.tokens, ReadStringArray(gguf, "tokenizer.ggml.tokens"));
  HW_ASSIGN_OR_RETURN(vocab.merges, ReadStringArray(gguf, "tokenizer.ggml.merges"));
  const size_t n_vocab = vocab.tokens.size();

  if (const GgufValue* types = gguf.Find("tokenizer.ggml.token_type")) {
    auto values = types->AsIntArray();
    if (!values.ok()) return values.status().WithContext("tokenizer.ggml.token_type");
    if (values->size() != n_vocab) {
      return Status::InvalidArgument("tokenizer.ggml.token_type has " +
                                     std::to_string(values->size()) + " entries for " +
                                     std::to_string(n_vocab) + " tokens");
    }
    vocab.token_types.reserve(n_vocab);
    for (size_t id = 0; id < n_vocab; ++id) {
      int64_t type = (*values)[id];
      if (type < 0 || type > static_cast<int64_t>(TokenType::kByte)) {
        return Status::InvalidArgument("tokenizer.ggml.token_type of token " +
                                       std::to_string(id) + " is " + std::to_string(type) +
                                       ", not 0..6");
      }
      vocab.token_types.push_back(static_cast<TokenType>(type));
    }
  } else {
    vocab.token_types.assign(n_vocab, TokenType::kNormal);
  }

  HW_ASSIGN_OR_RETURN(vocab.bos_id, ReadOptionalId(gguf, "tokenizer.ggml.bos_token_id", n_vocab));
  HW_ASSIGN_OR_RETURN(vocab.eos_id, ReadOptionalId(gguf, "tokenizer.ggml.eos_token_id", n_vocab));
  HW_ASSIGN_OR_RETURN(vocab.unk_id,
                      ReadOptionalId(gguf, "tokenizer.ggml.unknown_token_id", n_vocab));
  HW_ASSIGN_OR_RETURN(vocab.pad_id,
                      ReadOptionalId(gguf, "tokenizer.ggml.padding_token_id", n_vocab));
  if (const GgufValue* add_bos = gguf.Find("tokenizer.ggml.add_bos_token")) {
    auto flag = add_bos->AsBool();
    if (!flag.ok()) return flag.status().WithContext("tokenizer.ggml.add_bos_token");
    vocab.add_bos = *flag;
  }
  return vocab;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerVocab vocab) {
  if (vocab.model != "gpt2") {
    return Status::Unimplemented("tokenizer model '" + vocab.model +
                                 "' is not supported; supported: gpt2");
  }
  const size_t n_vocab = vocab.tokens.size();
  if (n_vocab == 0) return Status::InvalidArgument("tokenizer vocabulary is empty");
  if (vocab.token_types.empty()) vocab.token_types.assign(n_vocab, TokenType::kNormal);
  if (vocab.token_types.size() != n_vocab) {
    return Status::InvalidArgument("tokenizer has " + std::to_string(vocab.token_types.size()) +
                                   " token types for " + std::to_string(n_vocab) + " tokens");
  }
  HW_RETURN_IF_ERROR(CheckSpecialId("BOS", vocab.bos_id, n_vocab));
  HW_RETURN_IF_ERROR(CheckSpecialId("EOS", vocab.eos_id, n_vocab));
  HW_RETURN_IF_ERROR(CheckSpecialId("unknown", vocab.unk_id, n_vocab));
  HW_RETURN_IF_ERROR(CheckSpecialId("padding", vocab.pad_id, n_vocab));
  HW_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> pre, PreTokenizer::Create(vocab.pre));
  HW_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::Create(vocab.tokens, vocab.merges));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(vocab), std::move(pre), std::move(bpe)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  HW_ASSIGN_OR_RETURN(TokenizerVocab vocab, LoadTokenizerVocab(gguf));
  auto tokenizer = Create(std::move(vocab));
  if (!tokenizer.ok()) return tokenizer.status().WithContext("tokenizer of " + gguf.path());
  return tokenizer;
}

Tokenizer::Tokenizer(TokenizerVocab vocab, std::unique_ptr<PreTokenizer> pre, BpeModel bpe)
    : vocab_(std::move(vocab)), pre_(std::move(pre)), bpe_(std::move(bpe)) {
  const size_t n_vocab = vocab_.tokens.size();
  token_bytes_.reserve(n_vocab);
  text_to_id_.reserve(n_vocab);
  std::vector<int32_t> specials;
  for (size_t i = 0; i < n_vocab; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& text = vocab_.tokens[i];
    const bool verbatim = IsVerbatim(vocab_.token_types[i]);
    token_bytes_.push_back(verbatim ? text : UnicodeTextToBytes(text));
    text_to_id_.emplace(text, id);  // keeps the lowest id of a repeated text
    if (verbatim && !text.empty()) specials.push_back(id);
  }
  std::stable_sort(specials.begin(), specials.end(), [this](int32_t a, int32_t b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });
  for (int32_t id : specials) {
    specials_by_first_byte_[static_cast<uint8_t>(vocab_.tokens[id][0])].push_back(id);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  if (!parse_special) {
    EncodeOrdinary(text, &ids);
    return ids;
  }
  size_t segment_begin = 0;  // start of ordinary text not yet encoded
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t found = -1;
    for (int32_t id : specials_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      if (text.substr(pos).starts_with(vocab_.tokens[id])) {
        found = id;
        break;  // candidates are longest first
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    EncodeOrdinary(text.substr(segment_begin, pos - segment_begin), &ids);
    ids.push_back(found);
    pos += vocab_.tokens[found].size();
    segment_begin = pos;
  }
  EncodeOrdinary(text.substr(segment_begin), &ids);
  return ids;
}

void Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  for (std::string_view piece : pre_->Split(text)) bpe_.Encode(piece, out);
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
  auto it = text_to_id_.find(piece);
  if (it == text_to_id_.end()) {
    return Status::NotFound("no token with text '" + std::string(piece) + "'");
  }
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && IsVerbatim(vocab_.token_types[id]);
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
