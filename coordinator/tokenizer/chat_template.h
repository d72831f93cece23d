// A model's chat template: turns OpenAI chat messages into the prompt text
// the model was trained on, as Hugging Face's apply_chat_template does
// (jinja2 with trim_blocks and lstrip_blocks; variables `messages`,
// `add_generation_prompt`, `bos_token`, `eos_token`; `raise_exception`).
// The template comes from the GGUF key `tokenizer.chat_template`.
#pragma once

#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/status.h"
#include "coordinator/tokenizer/jinja.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;  // text (content parts already joined)
};

// A rendered chat prompt and where the messages' contents lie in it.
struct MarkedPrompt {
  std::string text;                                  // Apply's result
  std::vector<Tokenizer::TextRange> content_ranges;  // sorted, disjoint
};

class ChatTemplate {
 public:
  // Parses `source`. Errors: Template::Parse's (InvalidArgument for a syntax
  // error, Unimplemented for a construct outside the supported subset), with
  // line and column.
  static Result<ChatTemplate> Create(std::string_view source, std::string bos_token,
                                     std::string eos_token);

  // The template of `gguf`, with the tokenizer's BOS/EOS texts (e.g.
  // "<|im_start|>"; "" when the vocabulary has none). Errors: NotFound when
  // the file has no tokenizer.chat_template; InvalidArgument when it is not
  // a string; Create's errors.
  static Result<ChatTemplate> FromGguf(const GgufFile& gguf, const Tokenizer& tokenizer);

  // The prompt text for `messages`; with `add_generation_prompt` it ends
  // with the header of an assistant turn. Errors: InvalidArgument (the
  // template called raise_exception: its message; a type error) and
  // Unimplemented (an unsupported construct met while rendering). Thread-safe.
  Result<std::string> Apply(const std::vector<ChatMessage>& messages,
                            bool add_generation_prompt) const;

  // Apply, and the byte ranges of the prompt that came from message
  // contents, so that the tokenizer can take special tokens only from the
  // template's own text (Tokenizer::Encode with literal ranges). Contents
  // are rendered as marked strings (jinja.h), whose marks follow them
  // through the template's trim, slicing, case changes and concatenation;
  // text the template derives from a content (a replace() inside it, a
  // list printed whole) counts as content too. Errors: Apply's, and
  // Unimplemented for a content used as a dict key. Thread-safe.
  Result<MarkedPrompt> ApplyMarked(const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt) const;

 private:
  ChatTemplate(jinja::Template t, std::string bos, std::string eos)
      : template_(std::move(t)), bos_token_(std::move(bos)), eos_token_(std::move(eos)) {}

  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace headway
