// The largest control message the coordinator receives and sends in a
// normal disaggregated run at the largest batch (README "Security" gives
// the figures this prints; coordinator.control_max_message_mb must stay
// above them). The coordinator logs both maxima when it stops:
//   control channel: largest message received N bytes, sent M bytes (limit L)
// The run: pd.yaml's shape (a prefill and a decode instance of SmolLM2,
// KV blocks over UCX TCP), max_num_seqs concurrent completions of distinct
// prompts, each with the most top log-probabilities the API allows, so
// that a decode step's StepResult carries a full batch of them.
#include <gtest/gtest.h>

#include <future>
#include <regex>
#include <string>
#include <vector>

#include "coordinator/http/completion_request.h"
#include "tests/support/deployment.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

TEST(ControlMessageSizeTest, LargestMessagesOfADisaggregatedRunAtTheLargestBatch) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.pd_decode_tp_size = 1;
  options.max_num_seqs = 32;
  options.max_model_len = 2048;
  options.kv_memory_mb = 256;
  std::string error;
  auto d = Deployment::Start(options, &error);
  ASSERT_NE(d, nullptr) << error;

  const std::string passage =
      "The quick brown fox jumps over the lazy dog while the band plays on. ";
  std::vector<std::future<HttpReply>> replies;
  for (int i = 0; i < options.max_num_seqs; ++i) {
    std::string prompt = "Request " + std::to_string(i) + ": ";
    for (int k = 0; k < 6; ++k) prompt += passage;  // about 100 tokens
    const json body = {{"prompt", prompt},     {"max_tokens", 32},
                       {"temperature", 0},     {"ignore_eos", true},
                       {"logprobs", kMaxLogprobs}};
    replies.push_back(std::async(std::launch::async, [&d, body] {
      return d->PostJson("/v1/completions", body);
    }));
  }
  for (auto& r : replies) {
    HttpReply reply = r.get();
    ASSERT_EQ(reply.status, 200) << reply.body;
    EXPECT_EQ(reply.json["choices"][0]["logprobs"]["top_logprobs"][0].size(), size_t(kMaxLogprobs));
  }
  d->Stop();
  const std::string log = d->Log();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m,
                                std::regex("control channel: largest message received ([0-9]+) "
                                           "bytes, sent ([0-9]+) bytes \\(limit ([0-9]+)\\)")))
      << log;
  const long received = std::stol(m[1]), sent = std::stol(m[2]), limit = std::stol(m[3]);
  std::printf("[ info     ] largest control message received by the coordinator: %ld bytes; "
              "sent: %ld bytes; limit: %ld bytes\n",
              received, sent, limit);
  // A step result with one sequence's token and its top log-probabilities
  // (each at least a token id and a float) is the least it must have seen.
  EXPECT_GE(received, kMaxLogprobs * 5);
  EXPECT_LT(received, limit);
  EXPECT_LT(sent, limit);
}

}  // namespace
}  // namespace headway::testing
