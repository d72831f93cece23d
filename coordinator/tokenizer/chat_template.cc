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

}  // namespace headway
