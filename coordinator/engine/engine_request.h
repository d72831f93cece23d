// A request as the engine takes it: validated and tokenized by the HTTP
// layer (completion_request.h, chat_request.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/engine/request_output.h"
#include "coordinator/scheduling/sequence.h"

namespace headway {

struct EngineRequest {
  std::vector<int32_t> prompt_ids;  // non-empty
  int max_tokens = 16;              // >= 1
  SamplingOptions sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // each in [0, vocab_size)
  bool ignore_eos = false;
  int min_tokens = 0;               // [0, max_tokens]: StopConditions::min_tokens
  Clock::time_point deadline = Clock::time_point::max();
  // Set for a streaming request: receives text as it is produced, then the
  // outcome (OutputStream::Close). Shared with the HTTP thread.
  std::shared_ptr<OutputStream> stream;
  // Optional: set (by the engine thread) once the request's first token has
  // been sampled, when its prompt's whole blocks are in the prefix cache.
  std::shared_ptr<std::atomic<bool>> first_token;
};

}  // namespace headway
