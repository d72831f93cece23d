// SmolLM2's tokenizer (byte-level BPE, loaded once from the model's GGUF) on
// arbitrary bytes: Encode with and without special tokens, and with the
// first half of the input as a literal (message content) range, then
// Decode. Every id must be in the vocabulary, and decoding must give the
// input back, less the bytes SmolLM2's vocabulary has no token for (which
// Encode drops, as llama.cpp and Hugging Face do).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;

const Tokenizer* tokenizer = nullptr;
std::array<bool, 256> dropped{};  // bytes with no token of their own

void CheckRoundTrip(const std::vector<int32_t>& ids, const std::string& expected,
                    const char* how) {
  for (int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer->vocab_size(), std::string(how) + ": id " + std::to_string(id));
  }
  const std::string decoded = tokenizer->Decode(ids);
  FUZZ_CHECK(decoded == expected, std::string(how) + ": decodes to other bytes");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string path = fuzz::RequireModel("SmolLM2-135M-Instruct.Q4_1.gguf");
  Result<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(path);
  FUZZ_CHECK(gguf.ok(), gguf.status().ToString());
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::FromGguf(**gguf);
  FUZZ_CHECK(t.ok(), t.status().ToString());
  tokenizer = t->release();
  for (int b = 0; b < 256; ++b) {
    dropped[size_t(b)] = tokenizer->Encode(std::string(1, char(b)), false).empty();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string expected;
  for (unsigned char c : text) {
    if (!dropped[c]) expected.push_back(char(c));
  }
  CheckRoundTrip(tokenizer->Encode(text, false), expected, "Encode(text, false)");
  CheckRoundTrip(tokenizer->Encode(text, true), expected, "Encode(text, true)");
  const std::vector<Tokenizer::TextRange> literal = {{0, size / 2}};
  CheckRoundTrip(tokenizer->Encode(text, literal), expected, "Encode(text, ranges)");
  return 0;
}
