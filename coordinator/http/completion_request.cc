#include "coordinator/http/completion_request.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "coordinator/http/request_field_policy.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/http/structured_output_fields.h"

namespace headway {
namespace {

using nlohmann::json;
using namespace request_fields;

// Shortest decimal form of v ("2", "-0.5", "1e+10").
std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// One prompt: a string or an array of token ids; `where` names it.
std::optional<ApiError> ReadOnePrompt(const json& p, const std::string& where, int vocab_size,
                                      CompletionPrompt* out) {
  const char* expected = "a string, an array of token ids, or an array of one of those";
  if (p.is_string()) {
    out->text = p.get<std::string>();
    if (out->text.empty()) return ApiError::BadRequest("'" + where + "' must not be empty", "prompt");
    return std::nullopt;
  }
  if (!p.is_array()) return WrongType("prompt", expected);
  out->is_ids = true;
  for (const json& t : p) {
    if (!t.is_number_integer()) return WrongType("prompt", expected);
  }
  if (auto e = ReadTokenIds(p, "prompt", vocab_size, &out->ids)) return e;
  if (out->ids.empty()) return ApiError::BadRequest("'" + where + "' must not be empty", "prompt");
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const json& body, int vocab_size, CompletionRequest* req) {
  const json* p = Field(body, "prompt");
  if (!p) return ApiError::BadRequest("'prompt' is required", "prompt");
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    // A batch of prompts: a list of strings or of token-id lists.
    for (size_t i = 0; i < p->size(); ++i) {
      const json& one = (*p)[i];
      if (!one.is_string() && !one.is_array()) {
        return WrongType("prompt", "a string, an array of token ids, or an array of one of those");
      }
      CompletionPrompt prompt;
      if (auto e = ReadOnePrompt(one, "prompt[" + std::to_string(i) + "]", vocab_size, &prompt)) {
        return e;
      }
      req->prompts.push_back(std::move(prompt));
    }
    return std::nullopt;
  }
  CompletionPrompt prompt;
  if (auto e = ReadOnePrompt(*p, "prompt", vocab_size, &prompt)) return e;
  req->prompts.push_back(std::move(prompt));
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const json& body, GenerationParams* out) {
  const json* s = Field(body, "stop");
  if (!s) return std::nullopt;
  if (s->is_string()) {
    if (!s->get<std::string>().empty()) out->stop.push_back(s->get<std::string>());
    return std::nullopt;
  }
  if (!s->is_array()) return WrongType("stop", "a string or an array of strings");
  for (const json& e : *s) {
    if (!e.is_string()) return WrongType("stop", "a string or an array of strings");
    if (!e.get<std::string>().empty()) out->stop.push_back(e.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadStream(const json& body, GenerationParams* out) {
  if (auto e = ReadBool(body, "stream", &out->stream)) return e;
  const json* options = Field(body, "stream_options");
  if (!options) return std::nullopt;
  if (!out->stream) {
    return ApiError::BadRequest("Stream options can only be defined when `stream=True`.",
                                "stream_options");
  }
  if (!options->is_object()) return WrongType("stream_options", "an object");
  if (auto e = ReadBool(*options, "include_usage", &out->include_usage)) {
    e->param = "stream_options";
    return e;
  }
  return std::nullopt;
}

// n, and best_of (only at its default).
std::optional<ApiError> ReadChoices(const json& body, GenerationParams* out) {
  std::optional<int> n;
  if (auto e = ReadIntInRange(body, "n", 1, kMaxChoicesPerRequest,
                              "must be in [1, " + std::to_string(kMaxChoicesPerRequest) + "]",
                              &n)) {
    return e;
  }
  if (n) out->n = *n;
  std::optional<int64_t> best_of;
  if (auto e = ReadInteger(body, "best_of", &best_of)) return e;
  if (best_of && *best_of != 1) return Unsupported("best_of", "best_of other than 1");
  return std::nullopt;
}

// A number in [lo, hi] (vLLM's wording: "<name> must be in [lo, hi], got v.").
std::optional<ApiError> ReadInRange(const json& body, const char* name, double lo, double hi,
                                    float* out) {
  std::optional<double> v;
  if (auto e = ReadNumber(body, name, &v)) return e;
  if (!v) return std::nullopt;
  if (!(*v >= lo && *v <= hi)) {
    return ApiError::BadRequest(std::string(name) + " must be in [" + FormatNumber(lo) + ", " +
                                    FormatNumber(hi) + "], got " + FormatNumber(*v) + ".",
                                name);
  }
  *out = float(*v);
  return std::nullopt;
}

// min_p, the penalties, logit_bias and min_tokens.
std::optional<ApiError> ReadLogitProcessors(const json& body, int vocab_size,
                                            GenerationParams* out) {
  SamplingOptions& s = out->sampling;
  if (auto e = ReadInRange(body, "min_p", 0.0, 1.0, &s.min_p)) return e;
  if (auto e = ReadInRange(body, "presence_penalty", -2.0, 2.0, &s.presence_penalty)) return e;
  if (auto e = ReadInRange(body, "frequency_penalty", -2.0, 2.0, &s.frequency_penalty)) return e;
  std::optional<double> repetition;
  if (auto e = ReadNumber(body, "repetition_penalty", &repetition)) return e;
  if (repetition) {
    if (!(*repetition > 0)) {
      return ApiError::BadRequest("repetition_penalty must be greater than zero, got " +
                                      FormatNumber(*repetition) + ".",
                                  "repetition_penalty");
    }
    s.repetition_penalty = float(*repetition);
  }
  if (const json* bias = Field(body, "logit_bias")) {
    if (!bias->is_object()) return WrongType("logit_bias", "an object of token id -> bias");
    for (const auto& [key, value] : bias->items()) {
      int64_t id = -1;
      const bool numeric = !key.empty() && key.size() <= 10 &&
                           std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (numeric) id = std::stoll(key);
      if (!numeric || id >= vocab_size) {
        return ApiError::BadRequest("logit_bias key '" + key +
                                        "' is not a token id in [0, " +
                                        std::to_string(vocab_size) + ")",
                                    "logit_bias");
      }
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
        return ApiError::BadRequest("logit_bias['" + key + "'] must be a number in [-100, 100]",
                                    "logit_bias");
      }
      s.logit_bias.emplace_back(int32_t(id), value.get<float>());
    }
  }
  if (const json* allowed = Field(body, "allowed_token_ids")) {
    if (auto e = ReadTokenIds(*allowed, "allowed_token_ids", vocab_size, &s.allowed_token_ids)) {
      return e;
    }
    if (s.allowed_token_ids.empty()) {
      return ApiError::BadRequest("allowed_token_ids is not allowed to be empty.",
                                  "allowed_token_ids");
    }
  }
  if (const json* words = Field(body, "bad_words")) {
    if (!words->is_array()) return WrongType("bad_words", "an array of strings");
    for (const json& w : *words) {
      if (!w.is_string() || w.get<std::string>().empty()) {
        return WrongType("bad_words", "an array of non-empty strings");
      }
      out->bad_words.push_back(w.get<std::string>());
    }
  }
  std::optional<int> min_tokens;
  if (auto e = ReadIntInRange(body, "min_tokens", 0, std::numeric_limits<int64_t>::max(),
                              "must be greater than or equal to 0", &min_tokens)) {
    return e;
  }
  if (min_tokens) out->min_tokens = *min_tokens;
  return std::nullopt;
}

// temperature, top_p, top_k and seed into out->sampling.
std::optional<ApiError> ReadSampling(const json& body, GenerationParams* out) {
  std::optional<double> temperature, top_p;
  if (auto e = ReadNumber(body, "temperature", &temperature)) return e;
  if (temperature) {
    if (*temperature < 0) {
      return ApiError::BadRequest("temperature must be non-negative, got " +
                                      std::to_string(*temperature) + ".",
                                  "temperature");
    }
    out->sampling.temperature = float(*temperature);
  }
  if (auto e = ReadNumber(body, "top_p", &top_p)) return e;
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return ApiError::BadRequest("top_p must be in (0, 1], got " + std::to_string(*top_p) + ".",
                                  "top_p");
    }
    out->sampling.top_p = float(*top_p);
  }
  std::optional<int64_t> top_k, seed;
  if (auto e = ReadInteger(body, "top_k", &top_k)) return e;
  if (top_k) {
    if (*top_k < -1) {
      return ApiError::BadRequest(
          "top_k must be -1 (disable), or at least 1, got " + std::to_string(*top_k) + ".", "top_k");
    }
    out->sampling.top_k = int(std::min<int64_t>(*top_k, std::numeric_limits<int>::max()));
  }
  if (auto e = ReadInteger(body, "seed", &seed)) return e;
  if (seed) out->sampling.seed = uint64_t(*seed);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadGenerationParams(const json& body, const CompletionLimits& limits,
                                             GenerationParams* out) {
  if (const json* m = Field(body, "model")) {
    if (!m->is_string()) return WrongType("model", "a string");
    out->model = m->get<std::string>();
  }
  if (auto e = ReadStream(body, out)) return e;
  if (auto e = ReadChoices(body, out)) return e;
  // No effect (README "Request fields"), but typed as OpenAI's.
  if (const json* user = Field(body, "user"); user && !user->is_string()) {
    return WrongType("user", "a string");
  }
  // 0 is read here and refused after, unless a completions echo asks for
  // the prompt alone (ParseCompletionRequest).
  if (auto e = ReadIntInRange(body, "max_tokens", 0, std::numeric_limits<int64_t>::max(),
                              "must be at least 1", &out->max_tokens)) {
    return e;
  }
  if (auto e = ReadSampling(body, out)) return e;
  if (auto e = ReadLogitProcessors(body, limits.vocab_size, out)) return e;
  std::optional<int> prompt_logprobs;
  if (auto e = ReadIntInRange(body, "prompt_logprobs", 0, kMaxLogprobs,
                              "must be in [0, " + std::to_string(kMaxLogprobs) + "]",
                              &prompt_logprobs)) {
    return e;
  }
  out->prompt_logprobs = prompt_logprobs.value_or(-1);
  out->sampling.prompt_logprobs = out->prompt_logprobs;
  if (auto e = ReadBool(body, "ignore_eos", &out->ignore_eos)) return e;
  if (auto e = ReadStop(body, out)) return e;
  if (const json* ids = Field(body, "stop_token_ids")) {
    if (auto e = ReadTokenIds(*ids, "stop_token_ids", limits.vocab_size, &out->stop_token_ids)) return e;
  }
  return std::nullopt;
}

ApiError ZeroMaxTokens() {
  return ApiError::BadRequest("max_tokens must be at least 1, got 0.", "max_tokens");
}

std::optional<ApiError> CheckModel(const std::string& model, const CompletionLimits& limits) {
  if (!model.empty() && model != limits.served_model_name) {
    return ApiError::NotFound("The model `" + model + "` does not exist.");
  }
  return std::nullopt;
}

ParsedCompletion ParseCompletionRequest(std::string_view body_text, const CompletionLimits& limits) {
  json body;
  if (auto e = ParseObject(body_text, &body)) return *e;
  if (auto e = CheckFieldNames(body, ApiEndpoint::kCompletions)) return *e;
  CompletionRequest req;
  if (auto e = ReadGenerationParams(body, limits, &req.params)) return *e;
  if (auto e = ReadStructuredOutput(body, body_text, req.params, &req.params.structured_output)) {
    return *e;
  }

  if (auto e = ReadBool(body, "echo", &req.echo)) return *e;
  if (const json* s = Field(body, "suffix")) {
    if (!s->is_string() || !s->get<std::string>().empty()) return Unsupported("suffix", "suffix");
  }
  const std::string logprobs_range = "must be in [0, " + std::to_string(kMaxLogprobs) + "]";
  std::optional<int> logprobs;
  if (auto e = ReadIntInRange(body, "logprobs", 0, kMaxLogprobs, logprobs_range, &logprobs)) {
    return *e;
  }
  if (logprobs) {
    req.params.sampling.logprobs = true;
    req.params.sampling.num_top_logprobs = *logprobs;
  }
  if (req.params.max_tokens == 0 && (!req.echo || req.params.stream)) {
    if (req.echo) return Unsupported("max_tokens", "max_tokens: 0 with stream: true");
    return ZeroMaxTokens();
  }
  // echo's logprobs cover the prompt too, with the same number of alternatives.
  const int echo_logprobs = req.echo && logprobs ? *logprobs : -1;
  req.params.sampling.prompt_logprobs = std::max(req.params.prompt_logprobs, echo_logprobs);
  if (auto e = ReadPrompt(body, limits.vocab_size, &req)) return *e;
  if (req.prompts.size() * size_t(req.params.n) > size_t(kMaxChoicesPerRequest)) {
    return ApiError::BadRequest("n x the number of prompts must be at most " +
                                    std::to_string(kMaxChoicesPerRequest) + ", got " +
                                    std::to_string(req.params.n) + " x " +
                                    std::to_string(req.prompts.size()) + ".",
                                "n");
  }
  if (auto e = CheckModel(req.params.model, limits)) return *e;
  return req;
}

std::variant<int, ApiError> ResolveMaxTokens(int num_prompt_tokens, std::optional<int> max_tokens,
                                             int max_model_len, int default_max_tokens) {
  if (num_prompt_tokens >= max_model_len) {
    return ApiError::BadRequest(
        "This model's maximum context length is " + std::to_string(max_model_len) +
            " tokens. However, your request has " + std::to_string(num_prompt_tokens) +
            " input tokens. Please reduce the length of the input messages.",
        "prompt");
  }
  if (!max_tokens) return std::min(default_max_tokens, max_model_len - num_prompt_tokens);
  if (int64_t(num_prompt_tokens) + *max_tokens > max_model_len) {
    return ApiError::BadRequest(
        "This model's maximum context length is " + std::to_string(max_model_len) +
            " tokens. However, you requested " +
            std::to_string(int64_t(num_prompt_tokens) + *max_tokens) + " tokens (" +
            std::to_string(num_prompt_tokens) + " in the messages, " +
            std::to_string(*max_tokens) +
            " in the completion). Please reduce the length of the messages or completion.",
        "max_tokens");
  }
  return *max_tokens;
}

}  // namespace headway
