#include "coordinator/engine/request_output.h"

#include <algorithm>

namespace headway {

size_t StreamableLength(std::string_view text, const std::vector<std::string>& stop_strings) {
  size_t hold = 0;
  for (const std::string& stop : stop_strings) {
    // Longest k < |stop| with text ending in stop[0, k).
    for (size_t k = std::min(stop.size() - (stop.empty() ? 0 : 1), text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return text.size() - hold;
}

void OutputStream::Push(std::string_view text, GeneratedToken token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    pending_.text.append(text);
    pending_.tokens.push_back(std::move(token));
  }
  cv_.notify_one();
}

void OutputStream::PushPromptLogprobs(std::vector<GeneratedToken> prompt_logprobs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    pending_.prompt_logprobs = std::move(prompt_logprobs);
  }
  cv_.notify_one();
}

void OutputStream::Close(std::string_view final_text, CompletionOutcome outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    pending_.text.append(final_text);
    pending_.final = std::move(outcome);
  }
  cv_.notify_one();
}

OutputStream::Update OutputStream::Take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] {
    return !pending_.text.empty() || !pending_.tokens.empty() || !pending_.prompt_logprobs.empty() ||
           pending_.final.has_value();
  });
  Update out = std::move(pending_);
  pending_ = Update{};
  return out;
}

}  // namespace headway
