#include "coordinator/completion_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace headway {
namespace {

using nlohmann::json;

// A field that is absent or JSON null counts as not given.
const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError WrongType(const std::string& name, const char* expected) {
  return ApiError::BadRequest("'" + name + "' must be " + expected, name);
}

ApiError Unsupported(const std::string& name, const std::string& what) {
  return ApiError::BadRequest(what + " is not supported yet", name);
}

// Reads a number field; error if present and not a number.
std::optional<ApiError> ReadNumber(const json& body, const char* name, std::optional<double>* out) {
  const json* v = Field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return WrongType(name, "a number");
  *out = v->get<double>();
  if (!std::isfinite(**out)) return WrongType(name, "a finite number");
  return std::nullopt;
}

std::optional<ApiError> ReadInteger(const json& body, const char* name, std::optional<int64_t>* out) {
  const json* v = Field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return WrongType(name, "an integer in range");
    *out = int64_t(u);
    return std::nullopt;
  }
  if (!v->is_number_integer()) return WrongType(name, "an integer");
  *out = v->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const json& body, const char* name, bool* out) {
  const json* v = Field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return WrongType(name, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

// Token ids of one prompt given as an array of integers.
std::optional<ApiError> ReadIds(const json& arr, int vocab_size, std::vector<int32_t>* ids) {
  for (const json& t : arr) {
    if (!t.is_number_integer()) {
      return WrongType("prompt", "a string, an array of token ids, or an array of one of those");
    }
    int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return ApiError::BadRequest("token id " + std::to_string(id) +
                                      " in 'prompt' is outside the vocabulary [0, " +
                                      std::to_string(vocab_size) + ")",
                                  "prompt");
    }
    ids->push_back(int32_t(id));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const json& body, int vocab_size, CompletionRequest* req) {
  const json* p = Field(body, "prompt");
  if (!p) return ApiError::BadRequest("'prompt' is required", "prompt");
  const json* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    // A batch of prompts: a list of strings or of token-id lists.
    if (p->size() != 1) {
      return ApiError::BadRequest("only one prompt per request is supported (got " +
                                      std::to_string(p->size()) + ")",
                                  "prompt");
    }
    one = &p->front();
  }
  if (one->is_string()) {
    req->prompt_text = one->get<std::string>();
    if (req->prompt_text.empty()) return ApiError::BadRequest("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  if (one->is_array()) {
    req->prompt_is_ids = true;
    if (auto e = ReadIds(*one, vocab_size, &req->prompt_ids)) return e;
    if (req->prompt_ids.empty()) return ApiError::BadRequest("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  return WrongType("prompt", "a string, an array of token ids, or an array of one of those");
}

std::optional<ApiError> ReadStop(const json& body, CompletionRequest* req) {
  const json* s = Field(body, "stop");
  if (!s) return std::nullopt;
  if (s->is_string()) {
    if (!s->get<std::string>().empty()) req->stop.push_back(s->get<std::string>());
    return std::nullopt;
  }
  if (!s->is_array()) return WrongType("stop", "a string or an array of strings");
  for (const json& e : *s) {
    if (!e.is_string()) return WrongType("stop", "a string or an array of strings");
    if (!e.get<std::string>().empty()) req->stop.push_back(e.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadUnsupported(const json& body) {
  bool flag = false;
  if (auto e = ReadBool(body, "stream", &flag)) return e;
  if (flag) return Unsupported("stream", "streaming (stream: true)");
  flag = false;
  if (auto e = ReadBool(body, "echo", &flag)) return e;
  if (flag) return Unsupported("echo", "echo: true");
  if (Field(body, "logprobs")) return Unsupported("logprobs", "logprobs");
  if (const json* s = Field(body, "suffix")) {
    if (!s->is_string() || !s->get<std::string>().empty()) return Unsupported("suffix", "suffix");
  }
  std::optional<int64_t> n;
  if (auto e = ReadInteger(body, "n", &n)) return e;
  if (n && *n != 1) return ApiError::BadRequest("'n' must be 1 (one choice per request)", "n");
  std::optional<int64_t> best_of;
  if (auto e = ReadInteger(body, "best_of", &best_of)) return e;
  if (best_of && *best_of != 1) return Unsupported("best_of", "best_of other than 1");
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    std::optional<double> v;
    if (auto e = ReadNumber(body, name, &v)) return e;
    if (v && *v != 0.0) return Unsupported(name, std::string(name) + " other than 0");
  }
  return std::nullopt;
}

}  // namespace

ParsedCompletion ParseCompletionRequest(std::string_view body_text, const CompletionLimits& limits) {
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return ApiError::BadRequest("the request body is not valid JSON");
  if (!body.is_object()) return ApiError::BadRequest("the request body must be a JSON object");

  CompletionRequest req;
  if (const json* m = Field(body, "model")) {
    if (!m->is_string()) return WrongType("model", "a string");
    req.model = m->get<std::string>();
  }
  if (auto e = ReadUnsupported(body)) return *e;

  std::optional<int64_t> max_tokens;
  if (auto e = ReadInteger(body, "max_tokens", &max_tokens)) return *e;
  if (max_tokens) {
    if (*max_tokens < 1) {
      return ApiError::BadRequest("max_tokens must be at least 1, got " +
                                      std::to_string(*max_tokens) + ".",
                                  "max_tokens");
    }
    req.max_tokens = int(std::min<int64_t>(*max_tokens, std::numeric_limits<int>::max()));
  }

  std::optional<double> temperature, top_p;
  if (auto e = ReadNumber(body, "temperature", &temperature)) return *e;
  if (temperature) {
    if (*temperature < 0) {
      return ApiError::BadRequest("temperature must be non-negative, got " +
                                      std::to_string(*temperature) + ".",
                                  "temperature");
    }
    req.sampling.temperature = float(*temperature);
  }
  if (auto e = ReadNumber(body, "top_p", &top_p)) return *e;
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return ApiError::BadRequest("top_p must be in (0, 1], got " + std::to_string(*top_p) + ".",
                                  "top_p");
    }
    req.sampling.top_p = float(*top_p);
  }
  std::optional<int64_t> top_k, seed;
  if (auto e = ReadInteger(body, "top_k", &top_k)) return *e;
  if (top_k) {
    if (*top_k < -1) {
      return ApiError::BadRequest(
          "top_k must be -1 (disable), or at least 1, got " + std::to_string(*top_k) + ".", "top_k");
    }
    req.sampling.top_k = int(std::min<int64_t>(*top_k, std::numeric_limits<int>::max()));
  }
  if (auto e = ReadInteger(body, "seed", &seed)) return *e;
  if (seed) req.sampling.seed = uint64_t(*seed);
  if (auto e = ReadBool(body, "ignore_eos", &req.ignore_eos)) return *e;
  if (auto e = ReadStop(body, &req)) return *e;
  if (auto e = ReadPrompt(body, limits.vocab_size, &req)) return *e;

  // Last, as vLLM: a well-formed request for another model is a 404.
  if (!req.model.empty() && req.model != limits.served_model_name) {
    return ApiError::NotFound("The model `" + req.model + "` does not exist.");
  }
  return req;
}

std::variant<int, ApiError> ResolveMaxTokens(int num_prompt_tokens, std::optional<int> max_tokens,
                                             int max_model_len) {
  if (num_prompt_tokens >= max_model_len) {
    return ApiError::BadRequest(
        "This model's maximum context length is " + std::to_string(max_model_len) +
            " tokens. However, your request has " + std::to_string(num_prompt_tokens) +
            " input tokens. Please reduce the length of the input messages.",
        "prompt");
  }
  if (!max_tokens) return std::min(kDefaultMaxTokens, max_model_len - num_prompt_tokens);
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
