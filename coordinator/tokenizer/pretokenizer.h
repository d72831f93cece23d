// Pre-tokenizer: splits text into pieces that byte-level BPE encodes one at a
// time (no merge ever crosses a piece boundary).
//
// Source: llama.cpp `llm_tokenizer_bpe` (src/llama-vocab.cpp), which picks a
// list of regular expressions per `tokenizer.ggml.pre` value, and
// `unicode_regex_split` (src/unicode.cpp), which applies them in order: each
// expression splits every piece produced by the previous one, and the text
// between two matches becomes a piece of its own.
//
// Supported `tokenizer.ggml.pre` values:
//   "smollm" (LLAMA_VOCAB_PRE_TYPE_SMOLLM, shared with starcoder, refact,
//   command-r, codeshell, exaone):
//     1. \p{N}                     every digit on its own
//     2. 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//        (GPT-2's expression; the final \s+ is what llama.cpp's hand-written
//        GPT-2 matcher does for trailing whitespace)
//
// Matching uses PCRE2 in UTF + UCP mode, so \p{L}, \p{N} and \s follow the
// Unicode tables of the installed PCRE2. Bytes that are not valid UTF-8 never
// match an expression; they end up in the pieces between matches, which
// byte-level BPE handles like any other bytes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace headway {

class PreTokenizer {
 public:
  // Builds the pre-tokenizer named by a GGUF `tokenizer.ggml.pre` value.
  // Errors: Unimplemented naming `name` when it is not supported;
  // Internal when PCRE2 rejects a built-in expression.
  static Result<std::unique_ptr<PreTokenizer>> Create(std::string_view name);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits `text` (any bytes) into non-empty pieces that concatenate back to
  // `text`. The views point into `text` and live as long as it does.
  // Thread-safe.
  std::vector<std::string_view> Split(std::string_view text) const;

  const std::string& name() const { return name_; }

 private:
  struct Regex;
  PreTokenizer() = default;

  // Splits every piece of `pieces` with `regex`; the result replaces it.
  static void SplitWith(const Regex& regex, std::vector<std::string_view>* pieces);

  std::string name_;
  std::vector<std::unique_ptr<Regex>> regexes_;  // applied in order
};

}  // namespace headway
