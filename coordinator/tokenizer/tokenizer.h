// Tokenizer: text <-> token ids for the vocabularies of a GGUF file:
//   tokenizer.ggml.model = "gpt2":  byte-level BPE (coordinator/bpe.h) after a
//     named pre-tokenizer (coordinator/pretokenizer.h), e.g. SmolLM2;
//   tokenizer.ggml.model = "llama": SentencePiece-style BPE with scores and
//     byte fallback (coordinator/spm.h), e.g. Gemma 3.
//
// Encoding: split out special tokens verbatim (below), then encode each run
// of ordinary text: "gpt2" pre-tokenizes and byte-level BPEs each piece;
// "llama" replaces every ' ' by U+2581 "▁" (first prepending ' ' when
// add_space_prefix and the run is at the start or follows a special token)
// and SPM-encodes the run. Decoding: concatenate each token's bytes.
// Matches llama.cpp's `llama_vocab::tokenize` (with add_special = false) and
// `token_to_piece` (with special = true): checked against llama.cpp's test
// vocabulary file ggml-vocab-smollm.gguf.out and against llama.cpp on Gemma 3
// 270M (see tests/data/tokenizer/).
//
// Special tokens (llama.cpp `tokenizer_st_partition`): the tokens of type
// control, user-defined and unknown, taken longest text first (equal lengths:
// lower id first); each one's occurrences are split out of the text not yet
// claimed, left to right without overlap. User-defined tokens are always
// split out (Gemma 3's "\n", "\n\n", runs of spaces or tabs, "<table>", ...);
// control and unknown tokens only when parse_special.
//
// GGUF keys read (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
//   tokenizer.ggml.model        string, "gpt2" or "llama"
//   tokenizer.ggml.pre          string, e.g. "smollm" (required for "gpt2";
//                               ignored for "llama", as llama.cpp does)
//   tokenizer.ggml.tokens       string[n_vocab]
//   tokenizer.ggml.scores       float32[n_vocab]  ("llama" only; optional,
//                               default 0)
//   tokenizer.ggml.token_type   int32[n_vocab]   (optional, default normal)
//   tokenizer.ggml.merges       string[]          "left right", by priority
//                               ("gpt2" only)
//   tokenizer.ggml.{bos,eos,unknown,padding}_token_id   uint32 (optional)
//   tokenizer.ggml.add_bos_token bool              (optional; default false
//                               for "gpt2", true for "llama", as llama.cpp)
//   tokenizer.ggml.add_space_prefix bool           ("llama" only; optional,
//                               default true, as llama.cpp)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/gguf.h"
#include "common/status.h"
#include "coordinator/tokenizer/bpe.h"
#include "coordinator/tokenizer/pretokenizer.h"
#include "coordinator/tokenizer/spm.h"

namespace headway {

// llama.cpp `enum llama_token_type` values, as stored in
// tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // e.g. <|im_start|>, <|endoftext|>, <start_of_turn>
  kUserDefined = 4,  // e.g. Gemma 3's "\n\n", "<table>"
  kUnused = 5,
  kByte = 6,         // "llama" byte fallback, "<0x0A>"
};

// Everything a Tokenizer is built from; plain data.
struct TokenizerVocab {
  std::string model;                  // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;                    // tokenizer.ggml.pre, e.g. "smollm"; "gpt2" only
  std::vector<std::string> tokens;    // [n_vocab] text per id: bytes_to_unicode form
                                      // ("gpt2") or with "▁" for ' ' ("llama")
  std::vector<TokenType> token_types; // [n_vocab]; empty: all normal
  std::vector<float> scores;          // [n_vocab] merge priority, "llama" only; empty: all 0
  std::vector<std::string> merges;    // "left right", highest priority first; "gpt2" only
  int32_t bos_id = -1;                // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;               // prepend BOS when building a prompt
  bool add_space_prefix = false;      // "llama": ' ' before text that starts a run
};

// Reads the tokenizer keys of `gguf` (see the top of this file).
// Errors: Unimplemented naming the value when tokenizer.ggml.model is neither
// "gpt2" nor "llama", or for "gpt2" tokenizer.ggml.pre is absent or not
// supported by PreTokenizer; NotFound for a missing required key;
// InvalidArgument when a key has the wrong type, token_type's or scores'
// length differs from tokens', a token type is not 0..6, or a special id is
// negative or not below n_vocab.
Result<TokenizerVocab> LoadTokenizerVocab(const GgufFile& gguf);

// An immutable tokenizer; all methods are const and thread-safe.
class Tokenizer {
 public:
  // Validates `vocab` and builds the lookup tables.
  // Errors: Unimplemented (model, or for "gpt2" pre-tokenizer, not supported,
  // naming it); InvalidArgument (empty vocabulary, token_types or scores
  // length mismatch, special id out of range, bad merges: see
  // BpeModel::Create, bad scores: see SpmModel::Create).
  static Result<std::unique_ptr<Tokenizer>> Create(TokenizerVocab vocab);

  // LoadTokenizerVocab + Create. About 0.25 s for Gemma 3's 262144 tokens
  // (and as much again for GgufFile::Open).
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text` (any bytes; invalid UTF-8 is encoded byte by byte).
  // "gpt2": a byte with no token of its own is dropped, as llama.cpp and
  // Hugging Face do (SmolLM2 lacks 21: 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1
  // 0xF1-0xFF); "llama": a character outside the vocabulary becomes its byte
  // tokens "<0xXX>" (see SpmModel; as there, a stray UTF-8 lead byte takes
  // the next bytes into its character, so a space right after one comes back
  // from Decode as the bytes of "▁", as in llama.cpp). Never adds BOS/EOS. The texts of
  // user-defined tokens found in `text` always become those tokens; those of
  // control and unknown tokens (e.g. "<|im_start|>", "<start_of_turn>") only
  // when `parse_special` (order of matching: top of this file). Without
  // `parse_special` a control token's text is ordinary text, so user input
  // cannot inject it as such ("gpt2"; for "llama", as in llama.cpp, an SPM
  // merge could still produce a control token whose text is a concatenation
  // of two tokens; Gemma 3's are not).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // A byte range [begin, end) of a text.
  struct TextRange {
    size_t begin;
    size_t end;
  };

  // Encode(text, true), except that inside `literal_ranges` (sorted, not
  // overlapping, within `text`) control and unknown tokens' texts stay
  // ordinary text, as Encode(..., false) would leave them: a chat prompt
  // whose message contents cannot add control tokens such as
  // "<|im_start|>" (ChatTemplate::ApplyMarked gives the ranges). A special
  // token's text that crosses a range's edge is ordinary text too. Ordinary
  // text is encoded across the edges as one run, so the ids equal
  // Encode(text, true)'s wherever the contents hold no special token's text.
  std::vector<int32_t> Encode(std::string_view text,
                              const std::vector<TextRange>& literal_ranges) const;

  // The bytes that `ids` spell (TokenBytes of each). Ids outside
  // [0, vocab_size) are skipped; use DecodeChecked to reject them. The result
  // may be invalid UTF-8 when the ids split a character.
  std::string Decode(const std::vector<int32_t>& ids) const;

  // Decode, or InvalidArgument naming the first id outside [0, vocab_size)
  // and its position.
  Result<std::string> DecodeChecked(const std::vector<int32_t>& ids) const;

  // The bytes of one token; empty for an id out of range. Control, unknown
  // and user-defined tokens give their text verbatim. "gpt2": other tokens
  // their text mapped back through bytes_to_unicode. "llama": normal tokens
  // their text with each "▁" as ' ', byte tokens "<0xXX>" that byte, unused
  // and undefined tokens nothing (llama.cpp's token_to_piece).
  std::string_view TokenBytes(int32_t id) const;

  // The vocabulary text of `id` (e.g. "Ġhello" for "gpt2", "▁hello" for
  // "llama").
  // Errors: InvalidArgument when `id` is outside [0, vocab_size).
  // The view lives as long as this Tokenizer.
  Result<std::string_view> TokenText(int32_t id) const;

  // The id whose vocabulary text is exactly `piece` (vocabulary form for
  // ordinary tokens, e.g. "Ġhello" or "▁hello"; verbatim for "<|im_end|>").
  // Errors: NotFound naming `piece`.
  Result<int32_t> TokenId(std::string_view piece) const;

  // True for control and unknown tokens (e.g. "<|im_end|>", "<eos>",
  // "<unk>"): the ones llama.cpp's token_to_piece leaves out unless asked for
  // special tokens, and Hugging Face's skip_special_tokens drops. False for
  // user-defined tokens (Gemma 3's "\n" is one) and ids out of range.
  bool IsSpecial(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const { return vocab_.bos_id; }  // -1: none
  int32_t eos_id() const { return vocab_.eos_id; }  // -1: none
  int32_t pad_id() const { return vocab_.pad_id; }  // -1: none
  bool add_bos() const { return vocab_.add_bos; }
  const std::string& model() const { return vocab_.model; }  // "gpt2" or "llama"

 private:
  // A special token whose text starts at byte `begin` of the encoded text.
  struct SpecialMatch {
    size_t begin;
    int32_t id;
  };

  explicit Tokenizer(TokenizerVocab vocab);

  // Builds token_bytes_, text_to_id_ and the special-token trie.
  void BuildTables();

  // The special tokens to split out of `text`, in text order
  // (tokenizer_st_partition; see the top of this file).
  // `literal_ranges`: as Encode's; empty = none.
  std::vector<SpecialMatch> FindSpecials(std::string_view text, bool parse_special,
                                         const std::vector<TextRange>& literal_ranges) const;

  // Encodes `text` around the given special tokens.
  std::vector<int32_t> EncodeAround(std::string_view text,
                                    const std::vector<SpecialMatch>& specials) const;

  // Encodes a run of text with no special tokens in it; `follows_special`:
  // the run starts the text or follows a special token.
  void EncodeOrdinary(std::string_view text, bool follows_special,
                      std::vector<int32_t>* out) const;

  // Constant after construction.
  TokenizerVocab vocab_;
  std::unique_ptr<PreTokenizer> pre_;  // "gpt2" only
  std::optional<BpeModel> bpe_;        // "gpt2" only
  std::optional<SpmModel> spm_;        // "llama" only
  std::vector<std::string> token_bytes_;                   // [n_vocab] decoded bytes
  // "gpt2" only ("llama" asks spm_); views into vocab_.tokens.
  std::unordered_map<std::string_view, int32_t> text_to_id_;
  // Trie over the texts of the special tokens: node 0 is the root; an edge is
  // (node << 8 | byte) -> child node; trie_token_[node] is the special token
  // spelled by the path to `node`, or -1.
  std::unordered_map<uint64_t, int32_t> trie_edges_;
  std::vector<int32_t> trie_token_;
  // [n_vocab] matching priority of a special token (0 first), -1 otherwise.
  std::vector<int32_t> special_rank_;
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
