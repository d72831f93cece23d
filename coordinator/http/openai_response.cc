#include "coordinator/http/openai_response.h"

#include <algorithm>

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

size_t TextLength(std::string_view bytes) {
  // A character per byte that does not continue one (UTF-8: 10xxxxxx).
  return size_t(std::count_if(bytes.begin(), bytes.end(),
                              [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

size_t TokensTextLength(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer) {
  size_t n = 0;
  for (const GeneratedToken& t : tokens) n += TextLength(tokenizer.TokenBytes(t.token_id));
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
    // OpenAI's legacy shape always holds the chosen token (up to k + 1 entries).
    if (!top.contains(text)) top[text] = t.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += TextLength(text);
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

json EchoLogprobsJson(int32_t first_token_id, const std::vector<GeneratedToken>& prompt,
                      const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer) {
  std::vector<GeneratedToken> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::string first = TokenString(tokenizer, first_token_id);
  json rest = CompletionLogprobsJson(all, tokenizer, TextLength(first));
  json texts = json::array({first}), logprobs = json::array({nullptr});
  json tops = json::array({nullptr}), offsets = json::array({0});
  for (json& v : rest["tokens"]) texts.push_back(std::move(v));
  for (json& v : rest["token_logprobs"]) logprobs.push_back(std::move(v));
  for (json& v : rest["top_logprobs"]) tops.push_back(std::move(v));
  for (json& v : rest["text_offset"]) offsets.push_back(std::move(v));
  return {{"tokens", texts},
          {"token_logprobs", logprobs},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json PromptLogprobsJson(const std::vector<GeneratedToken>& prompt, int num_top,
                        const Tokenizer& tokenizer) {
  json out = json::array({nullptr});
  for (const GeneratedToken& t : prompt) {
    json position = json::object();
    auto add = [&](int32_t id, float logprob, int rank) {
      const std::string key = std::to_string(id);
      if (position.contains(key)) return;
      position[key] = {{"logprob", logprob}, {"rank", rank},
                       {"decoded_token", TokenString(tokenizer, id)}};
    };
    add(t.token_id, t.logprob, t.rank);
    for (size_t j = 0; j < t.top_logprobs.size() && int(j) < num_top; ++j) {
      add(t.top_logprobs[j].first, t.top_logprobs[j].second, int(j) + 1);
    }
    out.push_back(std::move(position));
  }
  return out;
}

json CompletionResponseJson(const ResponseHeader& h, const std::vector<CompletionOutcome>& choices,
                            int n, const Tokenizer& tokenizer, bool logprobs,
                            const PromptEcho* echo) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionOutcome& o = choices[i];
    const size_t prompt = i / size_t(n);
    const CompletionOutcome& first = choices[prompt * size_t(n)];  // holds the prompt logprobs
    const bool echoed = echo != nullptr && echo->echo;
    json lp = nullptr;
    if (logprobs) {
      lp = echoed ? EchoLogprobsJson(echo->first_token_ids[prompt], first.prompt_logprobs,
                                     o.tokens, tokenizer)
                  : CompletionLogprobsJson(o.tokens, tokenizer, 0);
    }
    json choice = {{"index", i},
                   {"text", echoed ? echo->texts[prompt] + o.text : o.text},
                   {"logprobs", std::move(lp)},
                   {"finish_reason", FinishReasonJson(o.finish_reason)},
                   {"stop_reason", StopReasonJson(o)}};
    if (echo != nullptr && echo->prompt_logprobs >= 0) {
      choice["prompt_logprobs"] =
          PromptLogprobsJson(first.prompt_logprobs, echo->prompt_logprobs, tokenizer);
    }
    out.push_back(std::move(choice));
  }
  return {{"id", h.id},   {"object", "text_completion"}, {"created", h.created},
          {"model", h.model}, {"choices", out},           {"usage", UsageJson(choices, n)}};
}

json ChatResponseJson(const ResponseHeader& h, const std::vector<CompletionOutcome>& choices,
                      const Tokenizer& tokenizer, bool logprobs, int prompt_logprobs,
                      const std::string& echo_text) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionOutcome& o = choices[i];
    out.push_back({{"index", i},
                   {"message", {{"role", "assistant"}, {"content", echo_text + o.text}}},
                   {"logprobs", logprobs ? ChatLogprobsJson(o.tokens, tokenizer) : json(nullptr)},
                   {"finish_reason", FinishReasonJson(o.finish_reason)},
                   {"stop_reason", StopReasonJson(o)}});
  }
  // Every choice answers the one prompt.
  json response = {{"id", h.id},       {"object", "chat.completion"},
                   {"created", h.created}, {"model", h.model},
                   {"choices", out},   {"usage", UsageJson(choices, int(choices.size()))}};
  if (prompt_logprobs >= 0 && !choices.empty()) {
    response["prompt_logprobs"] =
        PromptLogprobsJson(choices[0].prompt_logprobs, prompt_logprobs, tokenizer);
  }
  return response;
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
