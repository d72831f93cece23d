#include "coordinator/tokenizer/chat_template.h"

namespace headway {
namespace {

constexpr char kContentBegin = '\xFE';
constexpr char kContentEnd = '\xFF';

}  // namespace

Result<ChatTemplate> ChatTemplate::Create(std::string_view source, std::string bos_token,
                                          std::string eos_token) {
  HW_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source));
  return ChatTemplate(std::move(t), std::move(bos_token), std::move(eos_token));
}

Result<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& gguf, const Tokenizer& tokenizer) {
  const GgufValue* v = gguf.Find("tokenizer.chat_template");
  if (v == nullptr) return Status::NotFound("the model has no tokenizer.chat_template");
  Result<std::string> source = v->AsString();
  if (!source.ok()) return source.status().WithContext("tokenizer.chat_template");
  auto text = [&](int32_t id) -> std::string {
    if (id < 0) return "";
    Result<std::string_view> t = tokenizer.TokenText(id);
    return t.ok() ? std::string(*t) : "";
  };
  Result<ChatTemplate> t = Create(*source, text(tokenizer.bos_id()), text(tokenizer.eos_id()));
  if (!t.ok()) return t.status().WithContext("tokenizer.chat_template");
  return t;
}

Result<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) const {
  jinja::Array list;
  for (const ChatMessage& m : messages) {
    list.emplace_back(jinja::Object{{"role", jinja::Value(m.role)}, {"content", jinja::Value(m.content)}});
  }
  std::map<std::string, jinja::Value> context = {
      {"messages", jinja::Value(std::move(list))},
      {"add_generation_prompt", jinja::Value(add_generation_prompt)},
      {"bos_token", jinja::Value(bos_token_)},
      {"eos_token", jinja::Value(eos_token_)},
  };
  return template_.Render(context);
}

Result<MarkedPrompt> ChatTemplate::ApplyMarked(const std::vector<ChatMessage>& messages,
                                               bool add_generation_prompt) const {
  std::vector<ChatMessage> marked = messages;
  for (size_t i = 0; i < marked.size(); ++i) {
    std::string& content = marked[i].content;
    if (content.find_first_of(std::string{kContentBegin, kContentEnd}) != std::string::npos) {
      return Status::InvalidArgument("messages[" + std::to_string(i) +
                                     "].content is not UTF-8 (it holds a byte 0xFE or 0xFF)");
    }
    content = kContentBegin + content + kContentEnd;
  }
  HW_ASSIGN_OR_RETURN(std::string plain, Apply(messages, add_generation_prompt));
  HW_ASSIGN_OR_RETURN(std::string with_marks, Apply(marked, add_generation_prompt));
  MarkedPrompt out;
  out.text.reserve(plain.size());
  size_t open = std::string::npos;  // where the current content began in out.text
  bool balanced = true;
  for (char c : with_marks) {
    if (c == kContentBegin) {
      balanced = balanced && open == std::string::npos;
      open = out.text.size();
    } else if (c == kContentEnd) {
      balanced = balanced && open != std::string::npos;
      if (open != std::string::npos && out.text.size() > open) {
        out.content_ranges.push_back({open, out.text.size()});
      }
      open = std::string::npos;
    } else {
      out.text.push_back(c);
    }
  }
  if (!balanced || open != std::string::npos || out.text != plain) {
    return Status::FailedPrecondition(
        "the chat template changes message contents (trims or slices them), so Headway cannot "
        "tell their text from the template's; set chat.parse_special_in_content: true to take "
        "special tokens from the whole prompt, as vLLM does");
  }
  return out;
}

}  // namespace headway
