// The OpenAI-compatible HTTP API (cpp-httplib):
//   POST /v1/completions   non-streaming completions (completion_request.h)
//   GET  /v1/models        the served model
//   GET  /health           200 when every instance is ready, else 503; JSON
//                          with per-instance, per-rank free/total blocks
// Errors use OpenAI's body {"error": {"message", "type", "param", "code"}}.
//
// Each HTTP connection runs on a thread of httplib's pool; handlers tokenize
// there and wait for the Engine.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/completion_request.h"
#include "coordinator/engine.h"
#include "coordinator/tokenizer.h"

namespace httplib {
class Server;
}

namespace headway {

struct ApiServerOptions {
  std::string http_host = "127.0.0.1";
  int http_port = 8000;                  // 0 = any free port (see Bind)
  std::string served_model_name;
  int max_model_len = 2048;
  std::chrono::milliseconds request_timeout{600000};  // engine deadline per request
  int num_http_threads = 64;             // concurrent connections served
};

class ApiServer {
 public:
  // REQUIRES: engine and tokenizer outlive the server.
  ApiServer(ApiServerOptions options, Engine* engine, const Tokenizer* tokenizer);
  ~ApiServer();

  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket and returns the port (the chosen one when
  // http_port is 0). Unavailable naming host and port if it cannot bind.
  Result<int> Bind();

  // Serves until Stop(). REQUIRES: Bind() succeeded. Blocks the caller.
  void Serve();

  // Makes Serve() return. Thread-safe; idempotent.
  void Stop();

  // The response to a completion request body: HTTP status and JSON body.
  // Public so tests can drive it without sockets.
  std::pair<int, nlohmann::json> HandleCompletion(const std::string& body);
  std::pair<int, nlohmann::json> HandleHealth() const;
  nlohmann::json HandleModels() const;

 private:
  std::string NewCompletionId();

  const ApiServerOptions options_;
  Engine* const engine_;
  const Tokenizer* const tokenizer_;
  const CompletionLimits limits_;
  const int64_t created_unix_s_;
  std::unique_ptr<httplib::Server> server_;

  std::mutex id_mu_;
  std::mt19937_64 id_rng_;  // guarded by id_mu_
};

}  // namespace headway
