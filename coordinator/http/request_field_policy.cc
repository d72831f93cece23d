#include "coordinator/http/request_field_policy.h"

#include <string_view>

#include "coordinator/http/request_fields.h"

namespace headway {

const std::vector<RequestField>& RequestFields() {
  using S = FieldSupport;
  // name, support, completions, chat.
  static const std::vector<RequestField> fields = {
      // Both endpoints.
      {"model", S::kSupported, true, true},
      {"max_tokens", S::kSupported, true, true},
      {"temperature", S::kSupported, true, true},
      {"top_p", S::kSupported, true, true},
      {"top_k", S::kSupported, true, true},
      {"min_p", S::kSupported, true, true},
      {"seed", S::kSupported, true, true},
      {"stop", S::kSupported, true, true},
      {"stop_token_ids", S::kSupported, true, true},
      {"ignore_eos", S::kSupported, true, true},
      {"stream", S::kSupported, true, true},
      {"stream_options", S::kSupported, true, true},
      {"logprobs", S::kSupported, true, true},
      {"n", S::kSupported, true, true},
      {"presence_penalty", S::kSupported, true, true},
      {"frequency_penalty", S::kSupported, true, true},
      {"repetition_penalty", S::kSupported, true, true},
      {"logit_bias", S::kSupported, true, true},
      {"min_tokens", S::kSupported, true, true},
      {"allowed_token_ids", S::kSupported, true, true},
      {"bad_words", S::kSupported, true, true},
      {"user", S::kNoEffect, true, true},
      // Completions.
      {"prompt", S::kSupported, true, false},
      {"echo", S::kSupported, true, true},
      {"prompt_logprobs", S::kSupported, true, true},
      {"suffix", S::kSupported, true, false},   // "" only
      {"best_of", S::kSupported, true, false},  // 1 only, as vLLM V1
      // Chat completions.
      {"messages", S::kSupported, false, true},
      {"max_completion_tokens", S::kSupported, false, true},
      {"top_logprobs", S::kSupported, false, true},
      {"add_generation_prompt", S::kSupported, false, true},
      {"tools", S::kSupported, false, true},            // [] only
      {"functions", S::kSupported, false, true},        // [] only
      {"tool_choice", S::kSupported, false, true},      // "none" or "auto" without tools
      {"parallel_tool_calls", S::kNoEffect, false, true},
      // Structured output (structured_output_fields.h), both endpoints as vLLM.
      {"response_format", S::kSupported, true, true},
      {"structured_outputs", S::kSupported, true, true},
      {"guided_json", S::kSupported, true, true},
      {"guided_regex", S::kSupported, true, true},
      {"guided_choice", S::kSupported, true, true},
      {"guided_whitespace_pattern", S::kSupported, true, true},
      {"guided_decoding_backend", S::kNoEffect, true, true},  // one engine
      // OpenAI and vLLM fields Headway does not implement yet.
      {"guided_grammar", S::kNotYet, false, false},
      {"use_beam_search", S::kNotYet, false, false},
      {"length_penalty", S::kNotYet, false, false},
      {"include_stop_str_in_output", S::kNotYet, false, false},
      {"skip_special_tokens", S::kNotYet, false, false},
      {"spaces_between_special_tokens", S::kNotYet, false, false},
      {"truncate_prompt_tokens", S::kNotYet, false, false},
      {"return_tokens_as_token_ids", S::kNotYet, false, false},
      {"logits_processors", S::kNotYet, false, false},
      {"add_special_tokens", S::kNotYet, false, false},
      {"priority", S::kNotYet, false, false},
      {"request_id", S::kNotYet, false, false},
      {"cache_salt", S::kNotYet, false, false},
      {"kv_transfer_params", S::kNotYet, false, false},
      {"continue_final_message", S::kNotYet, false, false},
      {"chat_template", S::kNotYet, false, false},
      {"chat_template_kwargs", S::kNotYet, false, false},
      {"documents", S::kNotYet, false, false},
      {"function_call", S::kNotYet, false, false},
      {"store", S::kNotYet, false, false},
      {"metadata", S::kNotYet, false, false},
      {"service_tier", S::kNotYet, false, false},
      {"modalities", S::kNotYet, false, false},
      {"audio", S::kNotYet, false, false},
      {"prediction", S::kNotYet, false, false},
      {"reasoning_effort", S::kNotYet, false, false},
      {"web_search_options", S::kNotYet, false, false},
  };
  return fields;
}

std::optional<ApiError> CheckFieldNames(const nlohmann::json& body, ApiEndpoint endpoint) {
  const bool chat = endpoint == ApiEndpoint::kChatCompletions;
  for (const auto& [name, value] : body.items()) {
    if (value.is_null()) continue;
    const RequestField* known = nullptr;
    for (const RequestField& f : RequestFields()) {
      if (name == f.name) {
        known = &f;
        break;
      }
    }
    if (!known) {
      return ApiError::BadRequest("Unrecognized request argument supplied: " + name, name);
    }
    if (!(chat ? known->chat : known->completions)) {
      return request_fields::Unsupported(name, "'" + name + "'");
    }
  }
  return std::nullopt;
}

}  // namespace headway
