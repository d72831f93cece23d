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

json UsageJson(const std::vector<CompletionOutcome>& choices, int n) {
  int prompt = 0, output = 0, cached = 0, transferred = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionOutcome& o = choices[i];
    output += o.num_output_tokens;
    if (i % size_t(n) != 0) continue;  // a prompt counts once, with its first choice
    prompt += o.num_prompt_tokens;
    cached += o.num_cached_tokens;
    transferred += o.num_transferred_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", output},
          {"total_tokens", prompt + output},
          {"prompt_tokens_details",
           {{"cached_tokens", cached}, {"transferred_tokens", transferred}}}};
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

json CompletionResponseJson(const ResponseHeader& h, const std::vector<CompletionOutcome>& choices,
                            int n, const Tokenizer& tokenizer, bool logprobs) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionOutcome& o = choices[i];
    out.push_back({{"index", i},
                   {"text", o.text},
                   {"logprobs",
                    logprobs ? CompletionLogprobsJson(o.tokens, tokenizer, 0) : json(nullptr)},
                   {"finish_reason", FinishReasonJson(o.finish_reason)},
                   {"stop_reason", StopReasonJson(o)}});
  }
  return {{"id", h.id},   {"object", "text_completion"}, {"created", h.created},
          {"model", h.model}, {"choices", out},           {"usage", UsageJson(choices, n)}};
}

json ChatResponseJson(const ResponseHeader& h, const std::vector<CompletionOutcome>& choices,
                      const Tokenizer& tokenizer, bool logprobs) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionOutcome& o = choices[i];
    out.push_back({{"index", i},
                   {"message", {{"role", "assistant"}, {"content", o.text}}},
                   {"logprobs", logprobs ? ChatLogprobsJson(o.tokens, tokenizer) : json(nullptr)},
                   {"finish_reason", FinishReasonJson(o.finish_reason)},
                   {"stop_reason", StopReasonJson(o)}});
  }
  // Every choice answers the one prompt.
  return {{"id", h.id},       {"object", "chat.completion"}, {"created", h.created},
          {"model", h.model}, {"choices", out}, {"usage", UsageJson(choices, int(choices.size()))}};
}

json CompletionChunkJson(const ResponseHeader& h, int index, const std::string& text,
                         json logprobs, json finish_reason, json stop_reason, bool include_usage) {
  json choice = {{"index", index},
                 {"text", text},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", std::move(finish_reason)},
                 {"stop_reason", std::move(stop_reason)}};
  json chunk = {{"id", h.id}, {"object", "text_completion"}, {"created", h.created},
                {"model", h.model}, {"choices", json::array({choice})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json ChatChunkJson(const ResponseHeader& h, int index, json delta, json logprobs,
                   json finish_reason, json stop_reason, bool include_usage) {
  json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", std::move(finish_reason)},
                 {"stop_reason", std::move(stop_reason)}};
  json chunk = {{"id", h.id}, {"object", "chat.completion.chunk"}, {"created", h.created},
                {"model", h.model}, {"choices", json::array({choice})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json UsageChunkJson(const ResponseHeader& h, const char* object, nlohmann::json usage) {
  return {{"id", h.id},       {"object", object},           {"created", h.created},
          {"model", h.model}, {"choices", json::array()}, {"usage", std::move(usage)}};
}

}  // namespace headway
