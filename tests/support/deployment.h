// A real Headway deployment (headway-launch + coordinator + workers) started
// by a test on free loopback ports, and an HTTP client for it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"

namespace headway::testing {

struct DeploymentOptions {
  std::string model_path;             // absolute GGUF path
  std::string served_name = "smollm2";  // model.served_name
  int block_size = 16;
  int kv_memory_mb = 64;
  int max_num_seqs = 32;
  std::string admission_policy;       // scheduler.admission_policy ("" = the default)
  int max_num_batched_tokens = 512;
  int max_model_len = 1024;
  int tp_size = 1;
  int num_instances = 1;              // instances of the mixed pool, all alike
  std::string routing_policy;         // routing.policy ("" = the default)
  int num_threads = 0;                // per worker; 0 = the config default
  std::string collective;             // "" = the config default (gloo on cpu)
  std::string device = "cpu";         // the instance's device: cpu or cuda:N
  double gpu_memory_utilization = 0.9;  // cache.gpu_memory_utilization (cuda only)
  // > 0: disaggregated: a prefill pool (one TP 1 instance) and a decode pool
  // (one instance of this TP size), with kv_transfer over UCX TCP; the
  // instance options above are ignored.
  int pd_decode_tp_size = 0;
  int kv_transfer_timeout_ms = 5000;  // disaggregated only
  int max_local_prefill_tokens = 0;   // routing.max_local_prefill_tokens
  // Where the coordinator binds HTTP and control (and, disaggregated, where
  // the prefill instance runs), and where the decode instance runs.
  std::string host = "127.0.0.1";
  std::string decode_host = "127.0.0.1";
  std::string head_pattern;           // model.head_pattern ("" = none)
  bool enable_recycling = true;       // cache.enable_recycling
  bool enable_prefix_caching = true;  // cache.enable_prefix_caching
  std::string kv_cache_dtype;         // cache.kv_cache_dtype ("" = the default)
  std::string kv_cache_dtype_sliding; // cache.kv_cache_dtype_sliding ("" = unset)
  int heartbeat_timeout_ms = 0;       // 0 = the config default
  std::string extra_yaml;             // appended verbatim at top level
};

// An HTTP reply: status code and body (parsed when it is JSON).
struct HttpReply {
  int status = 0;                     // 0 = no connection
  std::string body;
  nlohmann::json json;                // null if the body is not JSON
};

// One request to 127.0.0.1:`port`; status 0 when there is no connection or no
// answer within `timeout_s` seconds.
HttpReply HttpGet(int port, const std::string& path, int timeout_s = 300);
HttpReply HttpPost(int port, const std::string& path, const std::string& body,
                   int timeout_s = 300);
// The same against `host` (an IPv4 address or name) instead of 127.0.0.1.
HttpReply HttpGet(const std::string& host, int port, const std::string& path,
                  int timeout_s = 300);
HttpReply HttpPost(const std::string& host, int port, const std::string& path,
                   const std::string& body, int timeout_s = 300);

// True when `health` (a GET /health reply) says every instance of the
// deployment is ready: 200 with status "ok" (200 alone also means
// "degraded": serving while some instance is missing).
bool EveryInstanceReady(const HttpReply& health);

class Deployment {
 public:
  // Writes a config for `options` into a temp dir, starts headway-launch on
  // it and waits (up to `timeout_s`) until every instance is ready
  // (EveryInstanceReady). On failure
  // returns nullptr and puts the launcher's log in *error.
  static std::unique_ptr<Deployment> Start(const DeploymentOptions& options,
                                           std::string* error, int timeout_s = 120);
  ~Deployment();  // stops every process
  // Stops every process now (SIGTERM to the launcher, which stops the
  // workers, then the coordinator); Log() still reads what they wrote.
  // Idempotent.
  void Stop();

  int http_port() const { return http_port_; }
  const std::string& config_path() const { return config_path_; }
  std::string Log() const { return launcher_->Log(); }

  HttpReply Get(const std::string& path) const;
  HttpReply Post(const std::string& path, const std::string& body) const;
  HttpReply PostJson(const std::string& path, const nlohmann::json& body) const {
    return Post(path, body.dump());
  }

  // Sum of free blocks over every rank, from GET /health; -1 if unreadable.
  long FreeBlocks() const;

 private:
  Deployment() = default;
  int http_port_ = 0;
  std::string dir_;
  std::string config_path_;
  std::unique_ptr<ChildProcess> launcher_;
};

// Six prompts of mixed kinds and lengths (chat turns, plain text, a list) for
// comparing greedy outputs between deployments.
const std::vector<std::string>& SmolLm2TestPrompts();

// SmolLm2TestPrompts() as text, plus two as token ids of exact lengths for a
// block size of 16: shorter than one block (a disaggregated deployment has
// nothing to transfer) and exactly two blocks (the decode side computes the
// last block itself: it holds the position whose logits it needs).
std::vector<nlohmann::json> SmolLm2TransferPrompts();

// The body of a greedy (temperature 0) /v1/completions request to the model
// "smollm2" for `prompt` (text, or an array of token ids).
nlohmann::json GreedyCompletionBody(const nlohmann::json& prompt, int max_tokens);

// The first choice's text of a 200 /v1/completions reply; for any other reply
// "<status N: body>", so that comparing texts shows the error.
std::string CompletionText(const HttpReply& reply);

// True if `text` came from a reply that was not a 200 completion.
bool IsErrorText(const std::string& text);

// Every prompt alone, then all of them `rounds` times over concurrently,
// each sent as GreedyCompletionBody through `post` (body -> reply); the
// CompletionText of every reply, in that order.
std::vector<std::string> GreedyTexts(const std::function<HttpReply(const std::string&)>& post,
                                     const std::vector<nlohmann::json>& prompts, int max_tokens,
                                     int rounds);

// `question` as one user turn in SmolLM2's ChatML chat format, with the
// default system turn of its chat template and the assistant turn opened.
std::string SmolLm2ChatPrompt(const std::string& question);

// The YAML text of a mixed (or disaggregated) deployment for `options` on the given
// ports (used by Deployment and by tests that start binaries themselves).
std::string DeploymentYaml(const DeploymentOptions& options, int http_port, int control_port);

}  // namespace headway::testing
