// The OpenAI-compatible HTTP API (cpp-httplib):
//   POST /v1/completions       completions (completion_request.h), streamed
//                              with `stream: true`
//   POST /v1/chat/completions  chat completions (chat_request.h): messages
//                              rendered with the model's chat template
//   GET  /v1/models            the served model
//   POST /tokenize, /detokenize  vLLM's tokenizer endpoints (tokenize_request.h)
//   GET  /health               200 when every instance is ready, else 503; JSON
//                              with per-instance, per-rank free/total blocks
// Errors use OpenAI's body {"error": {"message", "type", "param", "code"}}
// with vLLM's HTTP codes (400, 401, 404, 500, 503).
//
// API keys: when ApiServerOptions::http.api_keys is not empty, every path
// but the probes /health, /live and /ready needs `Authorization: Bearer
// <key>` with one of them (else 401). /metrics is open, as on vLLM, where
// Prometheus scrapes without a key, unless http.metrics_require_api_key.
//
// Limits (common/http_config.h; README "Security"): a body over
// max_body_bytes gets 413, headers over max_header_bytes 431, JSON nested
// over max_json_depth 400, a prompt whose bytes cannot fit max_model_len
// tokens 400 before it is tokenized (request_limits.h); connections,
// deadlines and TLS are the HttpListener's (http_listener.h).
//
// Each HTTP connection runs on a thread of its own (HttpListener); handlers
// tokenize there and wait for the Engine. A streaming response first waits for the
// request's first output (so a request refused at admission still gets its
// own HTTP status), then sends SSE chunks as the engine pushes text. When a
// chunk cannot be written (the client went away) the request is cancelled:
// the engine frees its blocks at its next iteration. While a handler waits
// (a non-streaming answer, a stream's first output) it checks every 50 ms
// whether the client closed its connection (HttpListener::PeerClosed) and
// then cancels the request the same way.
#pragma once

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http_config.h"
#include "common/status.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/http/api_keys.h"
#include "coordinator/http/completion_request.h"
#include "coordinator/http/openai_response.h"
#include "coordinator/engine/engine.h"
#include "coordinator/http/stream_renderer.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace headway {

class HttpListener;

struct ApiServerOptions {
  std::string http_host = "127.0.0.1";
  int http_port = 8000;                  // 0 = any free port (see Bind)
  std::string served_model_name;
  int max_model_len = 2048;
  std::chrono::milliseconds request_timeout{600000};  // engine deadline per request
  // Every key that admits a request (config, key file and --api-key
  // together; none = no authentication), TLS files and limits.
  HttpApiConfig http;
  // Chat prompts: false = special tokens only where the chat template
  // writes them, never from message contents; true = from the whole
  // prompt, contents included, as vLLM does (config chat.parse_special_in_content).
  bool parse_special_in_content = false;
};

class ApiServer {
 public:
  // REQUIRES: engine and tokenizer outlive the server. `chat_template` may
  // be nullptr (the model has none: chat requests get a 400 saying so);
  // otherwise it must outlive the server too.
  ApiServer(ApiServerOptions options, Engine* engine, const Tokenizer* tokenizer,
            const ChatTemplate* chat_template = nullptr);
  ~ApiServer();

  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Loads the TLS certificate and key when http.ssl_certfile is set. Errors:
  // InvalidArgument naming the file and the reason. Call before Bind.
  Status LoadTls();

  // Binds the listening socket and returns the port (the chosen one when
  // http_port is 0). Unavailable naming host and port if it cannot bind.
  Result<int> Bind();

  // Serves until Stop(). REQUIRES: Bind() succeeded. Blocks the caller.
  void Serve();

  // Makes Serve() return. Thread-safe; idempotent.
  void Stop();

  // Non-streaming handlers: HTTP status and JSON body. Public so tests can
  // drive them without sockets.
  //
  // GET /health: 200 when requests can be served (CanServe: a ready mixed
  // instance, or a ready decode instance when the deployment has prefill
  // pools), else 503. Body: "status" "ok" (every instance ready, or a
  // vacant standby slot),
  // "degraded" (serving, some instance down, joining or draining) or
  // "unavailable", and per instance its role, state (InstanceStateName),
  // "ready" (all ranks registered), queue and per-rank free/total KV blocks.
  std::pair<int, nlohmann::json> HandleHealth() const;
  // GET /ready: /health's status code with {"status": "ready"|"unavailable"};
  // the Kubernetes readiness probe. (GET /live answers 200 whenever the
  // HTTP server runs: the liveness probe.)
  std::pair<int, nlohmann::json> HandleReady() const;
  // POST /admin/instances/{id}/drain (behind the API key when one is set):
  // Engine::Drain. 202 {"instance_id", "state": "draining"}; 404 for an id
  // the config does not have; 409 when the instance is not ready or
  // already draining.
  std::pair<int, nlohmann::json> HandleDrain(int instance_id);
  nlohmann::json HandleModels() const;
  std::pair<int, nlohmann::json> HandleTokenize(const std::string& body) const;
  std::pair<int, nlohmann::json> HandleDetokenize(const std::string& body) const;

  // True when `authorization` (the header's value, "" when absent) carries
  // one of the API keys, or when none is set. Compares in constant time
  // (api_keys.h).
  bool Authorized(const std::string& authorization) const;

 private:
  // The constructor's parts, in order. Body size and write timeout:
  void ConfigureConnections();
  // 431 for headers over the limit, then 401 for a guarded path without a
  // valid API key (when keys are set).
  void CheckHeadersAndKey();
  // The endpoints (the table at the top of this file).
  void AddRoutes();
  // OpenAI-style JSON for unrouted paths and for handlers that threw (500).
  void AddErrorHandlers();

  // A validated, tokenized request ready for the engine.
  struct Prepared {
    StreamKind kind;
    std::vector<EngineRequest> requests;  // one per choice: choice i*n+j answers prompt i
    int n = 1;
    bool stream = false;
    bool include_usage = false;
    bool logprobs = false;
    PromptEcho echo;
    // max_tokens 0 with echo: the prompt alone. Each choice runs with
    // max_tokens 1 (its prefill gives the prompt logprobs) and the answer
    // drops what it generated (ScoreOnly).
    bool score_only = false;
  };

  // A submitted choice.
  struct Running {
    std::future<CompletionOutcome> future;
    std::shared_ptr<OutputStream> stream;        // null for a non-streaming choice
    std::shared_ptr<std::atomic<bool>> first_token;  // EngineRequest::first_token
    uint64_t request_id = 0;
    std::optional<OutputStream::Update> first;   // its first output, when taken already
  };

  // 400 for a body nested deeper than http.max_json_depth.
  std::optional<ApiError> CheckBody(const std::string& body) const;
  // 400 for a prompt of `bytes` bytes that cannot fit max_model_len.
  std::optional<ApiError> CheckPromptBytes(size_t bytes, const char* param) const;
  std::variant<Prepared, ApiError> PrepareCompletion(const std::string& body) const;
  std::variant<Prepared, ApiError> PrepareChat(const std::string& body) const;
  // Runs `p` and writes the response (JSON or SSE) into `res`.
  void Respond(Prepared p, httplib::Response& res);
  void RespondStream(Prepared p, httplib::Response& res);
  // Submits every choice of `p` to the engine. The choices of a prompt with
  // n > 1 share its prefill: the first choice of every prompt goes at once,
  // the others once it has sampled its first token (its prompt's whole
  // blocks are then in the prefix cache), or has ended. Streams are
  // attached to the choices of a streaming request.
  std::vector<Running> SubmitChoices(Prepared& p);
  void CancelAll(const std::vector<Running>& running);
  // True when the client of the request being handled has closed its
  // connection (HttpListener::PeerClosed): its choices are then cancelled,
  // and `res` gets 499 and closes the connection, for nobody to read.
  bool ClientLeft(const std::vector<Running>& running, httplib::Response& res);
  std::optional<ApiError> CheckSomethingCanBeSampled(const GenerationParams& params) const;
  struct StreamState;
  // Common tail of Prepare*: length checks and the EngineRequest fields of
  // n choices per prompt (choice j's seed is the request's + j, as vLLM).
  std::variant<Prepared, ApiError> Finish(StreamKind kind,
                                          std::vector<std::vector<int32_t>> prompts,
                                          GenerationParams& params, int default_max_tokens) const;
  // Token ids of a rendered chat prompt, or the template's error as a 400.
  std::variant<std::vector<int32_t>, ApiError> ChatPromptIds(
      const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  std::string NewId(const char* prefix);

  const ApiServerOptions options_;
  Engine* const engine_;
  const Tokenizer* const tokenizer_;
  const ChatTemplate* const chat_template_;
  const CompletionLimits limits_;
  const int64_t created_unix_s_;
  const ApiKeys api_keys_;
  const size_t max_token_bytes_;  // MaxTokenBytes(*tokenizer_)
  std::unique_ptr<HttpListener> server_;
  // Structured output's grammars for this tokenizer, cached.
  const std::unique_ptr<structured::GrammarCompiler> grammars_;

  std::mutex id_mu_;
  std::mt19937_64 id_rng_;  // guarded by id_mu_
};

}  // namespace headway
