// Tokenizer: text <-> token ids for byte-level BPE vocabularies stored in a
// GGUF file (`tokenizer.ggml.model = "gpt2"`).
//
// Encoding: (optionally) split out special tokens verbatim, pre-tokenize
// (coordinator/pretokenizer.h), then byte-level BPE each piece
// (coordinator/bpe.h). Decoding: concatenate each token's bytes.
// Matches llama.cpp's `llama_vocab::tokenize` / `token_to_piece` for the
// supported pre-tokenizers (checked against llama.cpp's test vocabulary file
// ggml-vocab-smollm.gguf.out, see tests/data/tokenizer/).
//
// GGUF keys read (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
//   tokenizer.ggml.model        string, must be "gpt2"
//   tokenizer.ggml.pre          string, e.g. "smollm"
//   tokenizer.ggml.tokens       string[n_vocab]
//   tokenizer.ggml.token_type   int32[n_vocab]   (optional, default normal)
//   tokenizer.ggml.merges       string[]          "left right", by priority
//   tokenizer.ggml.{bos,eos,unknown,padding}_token_id   uint32 (optional)
//   tokenizer.ggml.add_bos_token bool              (optional, default false)
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/gguf.h"
#include "common/status.h"
#include "coordinator/bpe.h"
#include "coordinator/pretokenizer.h"

namespace headway {

// llama.cpp `enum llama_token_type` values, as stored in
// tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // e.g. <|im_start|>, <|endoftext|>
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything a Tokenizer is built from; plain data.
struct TokenizerVocab {
  std::string model;                  // tokenizer.ggml.model, e.g. "gpt2"
  std::string pre;                    // tokenizer.ggml.pre, e.g. "smollm"
  std::vector<std::string> tokens;    // [n_vocab] text per id, bytes_to_unicode form
  std::vector<TokenType> token_types; // [n_vocab]
  std::vector<std::string> merges;    // "left right", highest priority first
  int32_t bos_id = -1;                // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;               // prepend BOS when building a prompt
};

// Reads the tokenizer keys of `gguf` (see the top of this file).
// Errors: Unimplemented naming the value when tokenizer.ggml.model is not
// "gpt2" or tokenizer.ggml.pre is absent or not supported by PreTokenizer;
// NotFound for a missing required key; InvalidArgument when a key has the
// wrong type, token_type's length differs from tokens', a token type is not
// 0..6, or a special id is negative or not below n_vocab.
Result<TokenizerVocab> LoadTokenizerVocab(const GgufFile& gguf);

// An immutable tokenizer; all methods are const and thread-safe.
class Tokenizer {
 public:
  // Validates `vocab` and builds the lookup tables.
  // Errors: Unimplemented (model or pre-tokenizer not supported, naming it);
  // InvalidArgument (empty vocabulary, token_types length mismatch, special id
  // out of range, bad merges: see BpeModel::Create).
  static Result<std::unique_ptr<Tokenizer>> Create(TokenizerVocab vocab);

  // LoadTokenizerVocab + Create.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text` (any bytes; invalid UTF-8 is encoded byte by byte).
  // A byte with no token of its own is dropped, as llama.cpp and Hugging Face
  // do (SmolLM2 lacks 21: 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1-0xFF).
  // Never adds BOS/EOS. When `parse_special`, the texts of control and
  // user-defined tokens (e.g. "<|im_start|>") found in `text` become those
  // tokens (at each position the longest one wins, scanning left to right);
  // otherwise all of `text` is ordinary text, so user input cannot inject
  // special tokens.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // The bytes that `ids` spell: byte-level tokens give their bytes, control
  // and user-defined tokens their text verbatim. Ids outside [0, vocab_size)
  // are skipped; use DecodeChecked to reject them. The result may be invalid
  // UTF-8 when the ids split a character.
  std::string Decode(const std::vector<int32_t>& ids) const;

  // Decode, or InvalidArgument naming the first id outside [0, vocab_size)
  // and its position.
  Result<std::string> DecodeChecked(const std::vector<int32_t>& ids) const;

  // The bytes of one token; empty for an id out of range.
  std::string_view TokenBytes(int32_t id) const;

  // The vocabulary text of `id` (bytes_to_unicode form, e.g. "Ġhello").
  // Errors: InvalidArgument when `id` is outside [0, vocab_size).
  // The view lives as long as this Tokenizer.
  Result<std::string_view> TokenText(int32_t id) const;

  // The id whose vocabulary text is exactly `piece` (bytes_to_unicode form
  // for ordinary tokens, e.g. "Ġhello"; verbatim for "<|im_end|>").
  // Errors: NotFound naming `piece`.
  Result<int32_t> TokenId(std::string_view piece) const;

  // True for control and user-defined tokens; false for ids out of range.
  bool IsSpecial(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const { return vocab_.bos_id; }  // -1: none
  int32_t eos_id() const { return vocab_.eos_id; }  // -1: none
  int32_t pad_id() const { return vocab_.pad_id; }  // -1: none
  bool add_bos() const { return vocab_.add_bos; }

 private:
  Tokenizer(TokenizerVocab vocab, std::unique_ptr<PreTokenizer> pre, BpeModel bpe);

  // Encodes text with no special tokens in it.
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const;

  // Constant after construction.
  TokenizerVocab vocab_;
  std::unique_ptr<PreTokenizer> pre_;
  BpeModel bpe_;
  std::vector<std::string> token_bytes_;                   // [n_vocab] decoded bytes
  std::unordered_map<std::string_view, int32_t> text_to_id_;  // views into vocab_.tokens
  // Special token ids by first byte of their text, longest text first.
  std::array<std::vector<int32_t>, 256> specials_by_first_byte_;
};

// Turns a stream of generated token ids into text that only ever contains
// whole UTF-8 characters: bytes of a character split across tokens are held
// back until the character is complete. Bytes that can never form a valid
// character (and ids out of range) come out as U+FFFD, so every output is
// valid UTF-8. Not thread-safe; one per sequence.
class StreamDecoder {
 public:
  // REQUIRES: `tokenizer` outlives this decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Adds one token; returns the text that became complete (may be empty).
  std::string Push(int32_t id);

  // Returns whatever is held back (an incomplete character becomes U+FFFD)
  // and resets the decoder.
  std::string Flush();

 private:
  // Moves the complete characters at the front of pending_ to the result;
  // when `final`, incomplete ones too (as U+FFFD).
  std::string Drain(bool final);

  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes not yet emitted
};

}  // namespace headway
