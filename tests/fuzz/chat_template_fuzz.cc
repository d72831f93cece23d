// Chat-template rendering with hostile message contents: the real SmolLM2
// template (copied from its GGUF) and Gemma 3's (tests/fuzz/data/README.md),
// through ChatTemplate::Apply and ApplyMarked, as a chat request's messages
// reach them.
//
// Input: byte 0 picks the template (bit 0) and add_generation_prompt
// (bit 1); the rest is messages separated by 0x00, each a role byte (mod 3:
// system, user, assistant; the roles ParseChatRequest lets through) and
// then the content.
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;

std::vector<std::unique_ptr<ChatTemplate>>* templates = nullptr;

std::unique_ptr<ChatTemplate> Load(const std::string& file, const std::string& bos,
                                   const std::string& eos) {
  const std::string path = fuzz::DataDir() + "/" + file;
  std::ifstream in(path, std::ios::binary);
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FUZZ_CHECK(!source.empty(), "cannot read " + path);
  Result<ChatTemplate> t = ChatTemplate::Create(source, bos, eos);
  FUZZ_CHECK(t.ok(), path + ": " + t.status().ToString());
  return std::make_unique<ChatTemplate>(std::move(*t));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  templates = new std::vector<std::unique_ptr<ChatTemplate>>();
  templates->push_back(Load("smollm2.jinja", "<|im_start|>", "<|im_end|>"));
  // One copy of the Gemma 3 instruct template serves the chat tests and this target.
  templates->push_back(Load("../../data/chat_template/gemma3-it.jinja", "<bos>", "<eos>"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool smollm2 = (data[0] & 1) == 0;
  const ChatTemplate& t = *(*templates)[smollm2 ? 0 : 1];
  const bool add_generation_prompt = (data[0] & 2) != 0;
  static const char* const kRoles[] = {"system", "user", "assistant"};
  std::vector<ChatMessage> messages;
  size_t at = 1;
  while (at < size) {
    size_t end = at;
    while (end < size && data[end] != 0) ++end;
    if (end > at) {
      messages.push_back({kRoles[data[at] % 3],
                          std::string(reinterpret_cast<const char*>(data) + at + 1, end - at - 1)});
    }
    at = end + 1;
  }
  if (messages.empty()) return 0;  // ParseChatRequest refuses an empty list

  Result<std::string> text = t.Apply(messages, add_generation_prompt);
  Result<MarkedPrompt> marked = t.ApplyMarked(messages, add_generation_prompt);
  if (!text.ok()) {
    const StatusCode code = text.status().code();
    FUZZ_CHECK(code == StatusCode::kInvalidArgument || code == StatusCode::kUnimplemented,
               text.status().ToString());
    FUZZ_CHECK(!marked.ok(), "ApplyMarked rendered what Apply refused");
    return 0;
  }
  if (!marked.ok()) {
    // Contents carry marks, not marker bytes: any content renders, except
    // one the template uses as a dict key.
    FUZZ_CHECK(marked.status().code() == StatusCode::kUnimplemented, marked.status().ToString());
    return 0;
  }
  FUZZ_CHECK(marked->text == *text, "ApplyMarked's text differs from Apply's");
  std::string from_ranges;
  size_t last_end = 0;
  for (const Tokenizer::TextRange& r : marked->content_ranges) {
    FUZZ_CHECK(r.begin >= last_end && r.begin <= r.end && r.end <= text->size(),
               "range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")");
    from_ranges.append(*text, r.begin, r.end - r.begin);
    last_end = r.end;
  }
  if (smollm2) {
    std::string contents;
    for (const ChatMessage& m : messages) contents += m.content;
    FUZZ_CHECK(from_ranges == contents, "the content ranges do not hold the contents");
  }
  return 0;
}
