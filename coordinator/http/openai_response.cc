#include "coordinator/http/openai_response.h"

namespace headway {

using nlohmann::json;

namespace {

std::string TokenString(const Tokenizer& tokenizer, int32_t id) {
  return std::string(tokenizer.TokenBytes(id));
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(int(c));
  return out;
}

json FinishReasonJson(FinishReason reason) {
  const char* name = FinishReasonName(reason);
  return *name ? json(name) : json(nullptr);
}

}  // namespace

json UsageJson(const CompletionOutcome& o) {
  return {{"prompt_tokens", o.num_prompt_tokens},
          {"completion_tokens", o.num_output_tokens},
          {"total_tokens", o.num_prompt_tokens + o.num_output_tokens},
          {"prompt_tokens_details",
           {{"cached_tokens", o.num_cached_tokens},
            {"transferred_tokens", o.num_transferred_tokens}}}};
}

json StopReasonJson(const CompletionOutcome& o) {
  if (!o.stop_reason.empty()) return o.stop_reason;
  if (o.stop_token_id >= 0) return o.stop_token_id;
  return nullptr;
}

size_t TokensByteLength(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer) {
  size_t n = 0;
  for (const GeneratedToken& t : tokens) n += tokenizer.TokenBytes(t.token_id).size();
  return n;
}

json CompletionLogprobsJson(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer,
                            size_t first_offset) {
  json texts = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = first_offset;
  for (const GeneratedToken& t : tokens) {
    std::string text = TokenString(tokenizer, t.token_id);
    texts.push_back(text);
    logprobs.push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top_logprobs) top[TokenString(tokenizer, id)] = lp;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += text.size();
  }
  return {{"tokens", texts}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json ChatLogprobsJson(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer) {
  json content = json::array();
  for (const GeneratedToken& t : tokens) {
    std::string text = TokenString(tokenizer, t.token_id);
    json top = json::array();
    for (const auto& [id, lp] : t.top_logprobs) {
      std::string s = TokenString(tokenizer, id);
      top.push_back({{"token", s}, {"logprob", lp}, {"bytes", Bytes(s)}});
    }
    content.push_back({{"token", text}, {"logprob", t.logprob}, {"bytes", Bytes(text)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json CompletionResponseJson(const ResponseHeader& h, const CompletionOutcome& o,
                            const Tokenizer& tokenizer, bool logprobs) {
  json choice = {{"index", 0},
                 {"text", o.text},
                 {"logprobs", logprobs ? CompletionLogprobsJson(o.tokens, tokenizer, 0) : json(nullptr)},
                 {"finish_reason", FinishReasonJson(o.finish_reason)},
                 {"stop_reason", StopReasonJson(o)}};
  return {{"id", h.id},           {"object", "text_completion"}, {"created", h.created},
          {"model", h.model},     {"choices", json::array({choice})}, {"usage", UsageJson(o)}};
}

json ChatResponseJson(const ResponseHeader& h, const CompletionOutcome& o, const Tokenizer& tokenizer,
                      bool logprobs) {
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", o.text}}},
                 {"logprobs", logprobs ? ChatLogprobsJson(o.tokens, tokenizer) : json(nullptr)},
                 {"finish_reason", FinishReasonJson(o.finish_reason)},
                 {"stop_reason", StopReasonJson(o)}};
  return {{"id", h.id},       {"object", "chat.completion"},    {"created", h.created},
          {"model", h.model}, {"choices", json::array({choice})}, {"usage", UsageJson(o)}};
}

json CompletionChunkJson(const ResponseHeader& h, const std::string& text, json logprobs,
                         json finish_reason, json stop_reason, bool include_usage) {
  json choice = {{"index", 0},
                 {"text", text},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", std::move(finish_reason)},
                 {"stop_reason", std::move(stop_reason)}};
  json chunk = {{"id", h.id}, {"object", "text_completion"}, {"created", h.created},
                {"model", h.model}, {"choices", json::array({choice})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json ChatChunkJson(const ResponseHeader& h, json delta, json logprobs, json finish_reason,
                   json stop_reason, bool include_usage) {
  json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", std::move(finish_reason)},
                 {"stop_reason", std::move(stop_reason)}};
  json chunk = {{"id", h.id}, {"object", "chat.completion.chunk"}, {"created", h.created},
                {"model", h.model}, {"choices", json::array({choice})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json UsageChunkJson(const ResponseHeader& h, const char* object, const CompletionOutcome& o) {
  return {{"id", h.id},       {"object", object},           {"created", h.created},
          {"model", h.model}, {"choices", json::array()}, {"usage", UsageJson(o)}};
}

}  // namespace headway
