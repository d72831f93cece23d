// SentencePiece-style BPE (llama.cpp "SPM", `tokenizer.ggml.model =
// "llama"`): the merge step of the tokenizer for vocabularies with scores and
// byte fallback, such as Gemma 3's.
//
// Source: llama.cpp `llm_tokenizer_spm_session::tokenize` and
// `llama_vocab::byte_to_token` (src/llama-vocab.cpp), itself after
// SentencePiece's bpe_model.cc.
//
// Algorithm, for one piece of escaped text (every ' ' already replaced by
// U+2581 "▁" by the caller):
//   1. split into UTF-8 characters (the length comes from the lead byte alone:
//      0xC0.. 2 bytes, 0xE0.. 3, 0xF0.. 4, anything else 1; cut at the end);
//   2. repeatedly merge the adjacent pair whose concatenation is a token of
//      the highest score (ties: the leftmost pair), until no adjacent pair
//      concatenates to a token. Every token text takes part, whatever its
//      type, as in llama.cpp;
//   3. emit each symbol's token; a symbol with no token (a character outside
//      the vocabulary) becomes one byte-fallback token "<0xXX>" per byte, or
//      else the token whose text is that single byte, or else the unknown
//      token, or else nothing.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace headway {

class SpmModel {
 public:
  // `token_texts`: vocabulary text per token id ("▁" for a space);
  // `scores`: merge priority per token id (higher merges first), or empty
  // for all 0 (llama.cpp's default without tokenizer.ggml.scores);
  // `unk_id`: the unknown token, or -1.
  // When two tokens share a text the lower id wins.
  // Errors: InvalidArgument when `scores` is neither empty nor as long as
  // `token_texts`, a score is NaN, the vocabulary does not fit int32 ids, or
  // `unk_id` is outside [-1, n_vocab).
  static Result<SpmModel> Create(std::vector<std::string> token_texts, std::vector<float> scores,
                                 int32_t unk_id);

  SpmModel(SpmModel&&) = default;
  SpmModel& operator=(SpmModel&&) = default;

  // Appends the token ids of `escaped` (any bytes, spaces already replaced by
  // "▁") to `out`, by the algorithm above. O(n log n) in the length of
  // `escaped`. Thread-safe.
  void Encode(std::string_view escaped, std::vector<int32_t>* out) const;

  // The id whose text is exactly `text`, or -1.
  int32_t Find(std::string_view text) const;

 private:
  SpmModel() = default;

  // Appends the byte-fallback tokens of `bytes` (step 3 above).
  void EncodeBytes(std::string_view bytes, std::vector<int32_t>* out) const;

  std::vector<std::string> texts_;  // [n_vocab]
  std::vector<float> scores_;       // [n_vocab]
  // Views into texts_: the strings stay in place when this model (and so
  // texts_) is moved.
  std::unordered_map<std::string_view, int32_t> ids_;
  std::array<int32_t, 256> byte_ids_{};  // byte -> its fallback token, or -1
};

}  // namespace headway
