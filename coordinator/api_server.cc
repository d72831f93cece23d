#include "coordinator/api_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <cstdio>

namespace headway {
namespace {

using nlohmann::json;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // Replace, never throw, should any invalid UTF-8 reach a body.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

std::pair<int, json> Error(const ApiError& e) { return {e.http_status, e.ToJson()}; }

}  // namespace

ApiServer::ApiServer(ApiServerOptions options, Engine* engine, const Tokenizer* tokenizer)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      limits_{options_.served_model_name, int(tokenizer->vocab_size()), options_.max_model_len},
      created_unix_s_(UnixSeconds()),
      server_(std::make_unique<httplib::Server>()),
      id_rng_(std::random_device{}()) {
  int num_threads = options_.num_http_threads;
  server_->new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
  server_->set_read_timeout(std::chrono::seconds(30));
  server_->set_write_timeout(std::chrono::seconds(30));
  server_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    auto [status, body] = HandleCompletion(req.body);
    Reply(res, status, body);
  });
  server_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Reply(res, 200, HandleModels());
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    auto [status, body] = HandleHealth();
    Reply(res, status, body);
  });
  server_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "no route for " + req.method + " " + req.path,
               res.status == 404 ? "NotFoundError" : "invalid_request_error", "", ""};
    Reply(res, res.status, e.ToJson());
  });
  server_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("HTTP handler failed: {}", what);
        Reply(res, 500, ApiError::Internal("internal error: " + what).ToJson());
      });
}

ApiServer::~ApiServer() { Stop(); }

Result<int> ApiServer::Bind() {
  int port = options_.http_port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.http_host);
    if (port <= 0) {
      return Status::Unavailable("cannot bind HTTP on " + options_.http_host + " (any port)");
    }
  } else if (!server_->bind_to_port(options_.http_host, port)) {
    return Status::Unavailable("cannot bind HTTP on " + options_.http_host + ":" +
                               std::to_string(port) + " (in use or not a local address)");
  }
  return port;
}

void ApiServer::Serve() { server_->listen_after_bind(); }

void ApiServer::Stop() {
  if (server_) server_->stop();
}

std::string ApiServer::NewCompletionId() {
  std::lock_guard<std::mutex> lock(id_mu_);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "cmpl-%016llx%016llx", (unsigned long long)id_rng_(),
                (unsigned long long)id_rng_());
  return buf;
}

std::pair<int, json> ApiServer::HandleCompletion(const std::string& body) {
  ParsedCompletion parsed = ParseCompletionRequest(body, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  CompletionRequest& req = std::get<CompletionRequest>(parsed);

  std::vector<int32_t> ids;
  if (req.prompt_is_ids) {
    ids = std::move(req.prompt_ids);
  } else {
    // As vLLM: special-token texts in a prompt (a chat template applied by
    // the client) become their tokens.
    if (tokenizer_->add_bos() && tokenizer_->bos_id() >= 0) ids.push_back(tokenizer_->bos_id());
    std::vector<int32_t> text_ids = tokenizer_->Encode(req.prompt_text, /*parse_special=*/true);
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    if (ids.empty()) return Error(ApiError::BadRequest("'prompt' encodes to no tokens", "prompt"));
  }
  std::variant<int, ApiError> max_tokens =
      ResolveMaxTokens(int(ids.size()), req.max_tokens, options_.max_model_len);
  if (auto* e = std::get_if<ApiError>(&max_tokens)) return Error(*e);

  EngineRequest er;
  er.prompt_ids = std::move(ids);
  er.max_tokens = std::get<int>(max_tokens);
  er.sampling = req.sampling;
  er.stop = std::move(req.stop);
  er.ignore_eos = req.ignore_eos;
  er.deadline = Clock::now() + options_.request_timeout;
  CompletionOutcome out = engine_->Submit(std::move(er)).get();
  if (out.error) return Error(*out.error);

  json choice = {{"index", 0},
                 {"text", out.text},
                 {"finish_reason", FinishReasonName(out.finish_reason)},
                 {"logprobs", nullptr}};
  json response = {
      {"id", NewCompletionId()},
      {"object", "text_completion"},
      {"created", UnixSeconds()},
      {"model", options_.served_model_name},
      {"choices", json::array({choice})},
      {"usage",
       {{"prompt_tokens", out.num_prompt_tokens},
        {"completion_tokens", out.num_output_tokens},
        {"total_tokens", out.num_prompt_tokens + out.num_output_tokens}}}};
  return {200, response};
}

std::pair<int, json> ApiServer::HandleHealth() const {
  std::vector<InstanceHealth> health = engine_->Health();
  bool all_ready = !health.empty();
  json instances = json::array();
  for (const InstanceHealth& h : health) {
    all_ready = all_ready && h.ready;
    json ranks = json::array();
    for (const RankHealth& r : h.ranks) {
      ranks.push_back({{"tp_rank", r.tp_rank},
                       {"registered", r.registered},
                       {"free_blocks", r.free_blocks},
                       {"total_blocks", r.total_blocks}});
    }
    instances.push_back({{"instance_id", h.instance_id},
                         {"tp_size", h.tp_size},
                         {"ready", h.ready},
                         {"num_waiting", h.num_waiting},
                         {"num_running", h.num_running},
                         {"ranks", ranks}});
  }
  json body = {{"status", all_ready ? "ok" : "unavailable"}, {"instances", instances}};
  return {all_ready ? 200 : 503, body};
}

json ApiServer::HandleModels() const {
  json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_unix_s_},
                {"owned_by", "headway"},
                {"root", options_.served_model_name},
                {"max_model_len", options_.max_model_len}};
  return {{"object", "list"}, {"data", json::array({model})}};
}

}  // namespace headway
