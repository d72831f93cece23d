#include "coordinator/tokenizer/chat_template.h"

namespace headway {

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

namespace {

// The template's globals; contents are marked when `mark_contents`.
std::map<std::string, jinja::Value> Context(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt, bool mark_contents,
                                            const std::string& bos, const std::string& eos) {
  jinja::Array list;
  for (const ChatMessage& m : messages) {
    jinja::Value content = mark_contents ? jinja::Value::Marked(m.content) : jinja::Value(m.content);
    list.emplace_back(jinja::Object{{"role", jinja::Value(m.role)}, {"content", std::move(content)}});
  }
  return {
      {"messages", jinja::Value(std::move(list))},
      {"add_generation_prompt", jinja::Value(add_generation_prompt)},
      {"bos_token", jinja::Value(bos)},
      {"eos_token", jinja::Value(eos)},
  };
}

}  // namespace

Result<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) const {
  return template_.Render(Context(messages, add_generation_prompt, /*mark_contents=*/false,
                                  bos_token_, eos_token_));
}

Result<MarkedPrompt> ChatTemplate::ApplyMarked(const std::vector<ChatMessage>& messages,
                                               bool add_generation_prompt) const {
  HW_ASSIGN_OR_RETURN(jinja::MarkedText rendered,
                      template_.RenderMarked(Context(messages, add_generation_prompt,
                                                     /*mark_contents=*/true, bos_token_, eos_token_)));
  MarkedPrompt out;
  out.text = std::move(rendered.text);
  for (const auto& [begin, end] : rendered.marked_ranges) out.content_ranges.push_back({begin, end});
  return out;
}

}  // namespace headway
