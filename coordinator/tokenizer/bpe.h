// Byte-level BPE (GPT-2 style): the merge step of the tokenizer.
//
// Sources: openai/gpt-2 src/encoder.py (`bytes_to_unicode`, `bpe`) and
// llama.cpp `llm_tokenizer_bpe_session::tokenize` (src/llama-vocab.cpp).
//
// Byte-level vocabularies never store raw bytes: every byte 0..255 is first
// mapped to a printable code point (`bytes_to_unicode`: the printable Latin-1
// ranges '!'..'~', '¡'..'¬', '®'..'ÿ' map to themselves, the other 68 bytes to
// U+0100.. in order, so ' ' becomes 'Ġ' and '\n' becomes 'Ċ'). Token texts and
// merges are written in these code points.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace headway {

// UTF-8 text of the code point `bytes_to_unicode` assigns to `byte`.
std::string ByteToUnicodeText(uint8_t byte);

// Inverse mapping of a whole token text: each UTF-8 code point that is in the
// image of `bytes_to_unicode` becomes its byte; any other code point (or
// invalid UTF-8) is kept as its original bytes.
std::string UnicodeTextToBytes(std::string_view text);

class BpeModel {
 public:
  // `token_texts`: vocabulary text per token id (bytes_to_unicode form).
  // `merges`: "left right" pairs, highest priority first (rank = index).
  // A byte whose code point has no token (SmolLM2 has none for 21 bytes that
  // never occur in valid UTF-8 text or are rare control characters) is
  // dropped by Encode, as llama.cpp and Hugging Face `tokenizers` (without
  // byte fallback) do.
  // Errors: InvalidArgument when a merge is not two non-empty parts separated
  // by one space, or a part or the merged text is not a token (Hugging Face
  // `tokenizers` rejects such vocabularies too). When two tokens share a text
  // the lower id wins.
  static Result<BpeModel> Create(const std::vector<std::string>& token_texts,
                                 const std::vector<std::string>& merges);

  // Appends the token ids of one pre-tokenized piece (raw bytes, any values)
  // to `out`, less bytes that have no token. Repeatedly merges the adjacent pair of lowest rank (leftmost
  // first) until no pair has a merge. O(n log n) in the piece length.
  // Thread-safe.
  void Encode(std::string_view piece, std::vector<int32_t>* out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  std::array<int32_t, 256> byte_token_ids_{};     // byte -> its one-code-point token, or -1
  std::unordered_map<uint64_t, Merge> merges_;    // (left id, right id) -> merge
};

}  // namespace headway
