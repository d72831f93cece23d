// A byte-level BPE vocabulary small enough to write by hand, for tests of
// the tokenizer and of what decodes tokens (no model file).
#pragma once

#include <cstdint>

#include "coordinator/tokenizer/bpe.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway::testing {

// A vocabulary of the 256 byte tokens (id = the byte) plus "ab" (256), "bc"
// (257), "abc" (258) and the control token "<|s|>" (259); no EOS.
inline TokenizerVocab TinyVocab() {
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.pre = "smollm";
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(ByteToUnicodeText(static_cast<uint8_t>(b)));
  vocab.tokens.push_back("ab");      // 256
  vocab.tokens.push_back("bc");      // 257
  vocab.tokens.push_back("abc");     // 258
  vocab.tokens.push_back("<|s|>");   // 259
  vocab.token_types.assign(vocab.tokens.size(), TokenType::kNormal);
  vocab.token_types[259] = TokenType::kControl;
  vocab.merges = {"b c", "a b", "a bc"};
  return vocab;
}

}  // namespace headway::testing
