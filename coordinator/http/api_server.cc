#include "coordinator/http/api_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "coordinator/http/chat_request.h"
#include "coordinator/http/http_listener.h"
#include "coordinator/metrics/metrics.h"
#include "coordinator/http/openai_response.h"
#include "coordinator/http/request_limits.h"
#include "coordinator/http/structured_output_fields.h"
#include "coordinator/http/tokenize_request.h"

namespace headway {
namespace {

using nlohmann::json;

// How long a streaming response waits on its OutputStream before it checks
// that the client is still there.
constexpr std::chrono::milliseconds kStreamPoll(50);
// How often the other choices of a prompt look whether its first choice
// has sampled a token.
constexpr std::chrono::milliseconds kFirstTokenPoll(2);

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

bool IsEmpty(const OutputStream::Update& u) {
  return u.text.empty() && u.tokens.empty() && u.prompt_logprobs.empty() && !u.final.has_value();
}

// The bytes of the request's headers as sent ("Name: value\r\n" each),
// without the ones httplib adds itself.
size_t HeaderBytes(const httplib::Request& req) {
  size_t bytes = 0;
  for (const auto& [name, value] : req.headers) {
    if (name == "REMOTE_ADDR" || name == "REMOTE_PORT" || name == "LOCAL_ADDR" ||
        name == "LOCAL_PORT") {
      continue;
    }
    bytes += name.size() + value.size() + 4;
  }
  return bytes;
}

// A request refused before its body was read: the unread body would be
// taken for the next request, so the connection closes after the answer.
void RefuseBeforeBody(httplib::Response& res) {
  res.set_header("Connection", "close");
  HttpListener::CloseAfterResponse();
}

HttpListenerOptions ListenerOptions(const HttpApiConfig& http) {
  HttpListenerOptions o;
  o.max_connections = http.max_connections;
  o.max_header_bytes = http.max_header_bytes;
  o.read_timeout = std::chrono::milliseconds(http.read_timeout_ms);
  o.keep_alive_timeout = std::chrono::milliseconds(http.keep_alive_timeout_ms);
  o.ssl_certfile = http.ssl_certfile;
  o.ssl_keyfile = http.ssl_keyfile;
  return o;
}

// vLLM's tokenization of bad_words (SamplingParams.update_from_tokenizer):
// each word without leading whitespace, and with one space before it when that
// starts with another token and has as many tokens (the word in the middle
// of a text).
std::vector<std::vector<int32_t>> BadWordsIds(const std::vector<std::string>& words,
                                              const Tokenizer& tokenizer) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& word : words) {
    const std::string bare =
        word.substr(std::min(word.find_first_not_of(" \t\n\r\f\v"), word.size()));
    // As a Hugging Face tokenizer's encode: special-token texts become their tokens.
    std::vector<int32_t> plain = tokenizer.Encode(bare, /*parse_special=*/true);
    if (plain.empty()) continue;
    std::vector<int32_t> spaced = tokenizer.Encode(" " + bare, /*parse_special=*/true);
    const bool second = spaced.size() == plain.size() && spaced.front() != plain.front();
    out.push_back(std::move(plain));
    if (second) out.push_back(std::move(spaced));
  }
  return out;
}

}  // namespace

// 400 when allowed_token_ids leaves nothing that can be sampled: each
// allowed id is a one-token bad word, or a stop token banned by min_tokens.
std::optional<ApiError> ApiServer::CheckSomethingCanBeSampled(const GenerationParams& params) const {
  const std::vector<int32_t>& allowed = params.sampling.allowed_token_ids;
  if (allowed.empty()) return std::nullopt;
  std::vector<int32_t> banned;
  for (const std::vector<int32_t>& word : params.sampling.bad_words_ids) {
    if (word.size() == 1) banned.push_back(word[0]);
  }
  if (params.min_tokens > 0) {
    banned.insert(banned.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
    if (!params.ignore_eos && tokenizer_->eos_id() >= 0) banned.push_back(tokenizer_->eos_id());
  }
  for (int32_t id : allowed) {
    if (std::find(banned.begin(), banned.end(), id) == banned.end()) return std::nullopt;
  }
  return ApiError::BadRequest(
      "every token of allowed_token_ids is banned (a one-token bad word, or a stop token before "
      "min_tokens): nothing could be sampled",
      "allowed_token_ids");
}

// The state a streaming response's content provider keeps between calls.
struct ApiServer::StreamState {
  std::vector<Running> choices;  // `first`: taken before the response started
  StreamRenderer renderer;
  Engine* engine;
};

ApiServer::ApiServer(ApiServerOptions options, Engine* engine, const Tokenizer* tokenizer,
                     const ChatTemplate* chat_template)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      limits_{options_.served_model_name, int(tokenizer->vocab_size()), options_.max_model_len},
      created_unix_s_(UnixSeconds()),
      api_keys_(options_.http.api_keys),
      max_token_bytes_(MaxTokenBytes(*tokenizer)),
      server_(std::make_unique<HttpListener>(ListenerOptions(options_.http))),
      grammars_(std::make_unique<structured::GrammarCompiler>(GrammarVocabulary(*tokenizer))),
      id_rng_(std::random_device{}()) {
  ConfigureConnections();
  CheckHeadersAndKey();
  AddRoutes();
  AddErrorHandlers();
}

void ApiServer::ConfigureConnections() {
  // httplib answers 413 itself (AddErrorHandlers words it).
  server_->set_payload_max_length(size_t(options_.http.max_body_bytes));
}

void ApiServer::CheckHeadersAndKey() {
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (HeaderBytes(req) > size_t(options_.http.max_header_bytes)) {
      ApiError e{431,
                 "the request's headers exceed coordinator.http_max_header_bytes = " +
                     std::to_string(options_.http.max_header_bytes) + " bytes",
                 "invalid_request_error", "", ""};
      Reply(res, 431, e.ToJson());
      RefuseBeforeBody(res);
      return httplib::Server::HandlerResponse::Handled;
    }
    // Probes stay open for Kubernetes and load balancers, which send no key.
    const bool probe = req.path == "/health" || req.path == "/live" || req.path == "/ready";
    const bool open = probe || (req.path == "/metrics" && !options_.http.metrics_require_api_key);
    if (!open && !Authorized(req.get_header_value("Authorization"))) {
      ApiError e{401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>)",
                 "invalid_request_error", "", "invalid_api_key"};
      Reply(res, 401, e.ToJson());
      RefuseBeforeBody(res);
      return httplib::Server::HandlerResponse::Handled;
    }
    // httplib bounds only a body with a Content-Length (payload_max_length);
    // it would read a chunked one, or one that ends with the connection
    // (which it expects of these methods), without limit.
    const bool body_method = req.method == "POST" || req.method == "PUT" ||
                             req.method == "PATCH" || req.method == "DELETE" || req.method == "PRI";
    if (req.has_header("Transfer-Encoding") || (body_method && !req.has_header("Content-Length"))) {
      ApiError e{411,
                 "a request body needs a Content-Length header and no Transfer-Encoding (e.g. "
                 "curl -d '...')",
                 "invalid_request_error", "", ""};
      Reply(res, 411, e.ToJson());
      RefuseBeforeBody(res);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

void ApiServer::AddRoutes() {
  server_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckBody(req.body)) return Reply(res, e->http_status, e->ToJson());
    std::variant<Prepared, ApiError> p = PrepareCompletion(req.body);
    if (auto* e = std::get_if<ApiError>(&p)) return Reply(res, e->http_status, e->ToJson());
    Respond(std::move(std::get<Prepared>(p)), res);
  });
  server_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckBody(req.body)) return Reply(res, e->http_status, e->ToJson());
    std::variant<Prepared, ApiError> p = PrepareChat(req.body);
    if (auto* e = std::get_if<ApiError>(&p)) return Reply(res, e->http_status, e->ToJson());
    Respond(std::move(std::get<Prepared>(p)), res);
  });
  server_->Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckBody(req.body)) return Reply(res, e->http_status, e->ToJson());
    auto [status, body] = HandleTokenize(req.body);
    Reply(res, status, body);
  });
  server_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckBody(req.body)) return Reply(res, e->http_status, e->ToJson());
    auto [status, body] = HandleDetokenize(req.body);
    Reply(res, status, body);
  });
  server_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Reply(res, 200, HandleModels());
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    auto [status, body] = HandleHealth();
    Reply(res, status, body);
  });
  server_->Post(R"(/admin/instances/(\d{1,9})/drain)",
                [this](const httplib::Request& req, httplib::Response& res) {
                  auto [status, body] = HandleDrain(std::stoi(req.matches[1].str()));
                  Reply(res, status, body);
                });
  server_->Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
    auto [status, body] = HandleReady();
    Reply(res, status, body);
  });
  // Liveness: answering at all is the proof (the HTTP threads run); the
  // engine thread's death ends the process.
  server_->Get("/live", [](const httplib::Request&, httplib::Response& res) {
    Reply(res, 200, json{{"status", "live"}});
  });
  // Open without the API key unless metrics_require_api_key (CheckHeadersAndKey).
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(engine_->metrics().RenderPrometheus(), kPrometheusContentType);
  });
}

void ApiServer::AddErrorHandlers() {
  const int64_t max_body_bytes = options_.http.max_body_bytes;
  server_->set_error_handler([max_body_bytes](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return;
    // httplib answers 400 itself to a request it cannot read: a body cut
    // short, or a head or body still arriving at http_read_timeout_ms.
    std::string message = "no route for " + req.method + " " + req.path;
    if (res.status == 413) {
      message = "the request body exceeds coordinator.http_max_body_bytes = " +
                std::to_string(max_body_bytes) + " bytes";
    } else if (res.status != 404) {
      message = "cannot read the request " + req.method + " " + req.path + " (HTTP " +
                std::to_string(res.status) + ")";
    }
    ApiError e{res.status, message, res.status == 404 ? "NotFoundError" : "invalid_request_error",
               "", ""};
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

Status ApiServer::LoadTls() { return server_->LoadTls(); }

Result<int> ApiServer::Bind() { return server_->Bind(options_.http_host, options_.http_port); }

void ApiServer::Serve() { server_->Serve(); }

void ApiServer::Stop() {
  if (server_) server_->Stop();
}

bool ApiServer::Authorized(const std::string& authorization) const {
  return api_keys_.Admits(authorization);
}

std::optional<ApiError> ApiServer::CheckBody(const std::string& body) const {
  return CheckJsonDepth(body, options_.http.max_json_depth);
}

std::optional<ApiError> ApiServer::CheckPromptBytes(size_t bytes, const char* param) const {
  return headway::CheckPromptBytes(bytes, max_token_bytes_, options_.max_model_len, param);
}

std::string ApiServer::NewId(const char* prefix) {
  std::lock_guard<std::mutex> lock(id_mu_);
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%s-%016llx%016llx", prefix, (unsigned long long)id_rng_(),
                (unsigned long long)id_rng_());
  return buf;
}

std::variant<ApiServer::Prepared, ApiError> ApiServer::Finish(
    StreamKind kind, std::vector<std::vector<int32_t>> prompts, GenerationParams& params,
    int default_max_tokens) const {
  Prepared p{kind, {}, params.n, params.stream, params.include_usage,
             params.sampling.logprobs, PromptEcho{}};
  p.echo.prompt_logprobs = params.prompt_logprobs;
  params.sampling.bad_words_ids = BadWordsIds(params.bad_words, *tokenizer_);
  if (auto e = CheckSomethingCanBeSampled(params)) return *e;
  if (params.structured_output) {
    Result<std::shared_ptr<structured::TokenAutomaton>> grammar =
        grammars_->Compile(*params.structured_output);
    if (!grammar.ok()) {
      const std::string& field = params.structured_output->field;
      return ApiError::BadRequest("'" + field + "': " + grammar.status().message(), field);
    }
    params.sampling.grammar = *grammar;
  }
  for (std::vector<int32_t>& ids : prompts) {
    std::variant<int, ApiError> max_tokens = ResolveMaxTokens(
        int(ids.size()), params.max_tokens, options_.max_model_len, default_max_tokens);
    if (auto* e = std::get_if<ApiError>(&max_tokens)) return *e;
    if (params.min_tokens > std::get<int>(max_tokens)) {
      return ApiError::BadRequest("min_tokens must be less than or equal to max_tokens=" +
                                      std::to_string(std::get<int>(max_tokens)) + ", got " +
                                      std::to_string(params.min_tokens) + ".",
                                  "min_tokens");
    }
    p.score_only = std::get<int>(max_tokens) == 0;
    for (int j = 0; j < params.n; ++j) {
      EngineRequest er;
      er.prompt_ids = ids;
      er.max_tokens = std::max(1, std::get<int>(max_tokens));
      er.sampling = params.sampling;
      if (er.sampling.seed) *er.sampling.seed += uint64_t(j);
      // The first choice computes the prompt logprobs; the others find its
      // blocks in the prefix cache (SubmitChoices), and the response
      // repeats its logprobs.
      if (j > 0) er.sampling.prompt_logprobs = -1;
      er.stop = params.stop;
      er.stop_token_ids = params.stop_token_ids;
      er.ignore_eos = params.ignore_eos;
      er.min_tokens = params.min_tokens;
      er.deadline = Clock::now() + options_.request_timeout;
      p.requests.push_back(std::move(er));
    }
  }
  return p;
}

std::variant<ApiServer::Prepared, ApiError> ApiServer::PrepareCompletion(const std::string& body) const {
  ParsedCompletion parsed = ParseCompletionRequest(body, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  CompletionRequest& req = std::get<CompletionRequest>(parsed);
  std::vector<std::vector<int32_t>> prompts;
  PromptEcho echo{req.echo, {}, {}, req.params.prompt_logprobs};
  for (CompletionPrompt& prompt : req.prompts) {
    std::vector<int32_t> ids;
    if (prompt.is_ids) {
      ids = std::move(prompt.ids);
      if (req.echo) echo.texts.push_back(tokenizer_->Decode(ids));
    } else {
      if (req.echo) echo.texts.push_back(prompt.text);
      // As vLLM: special-token texts in a prompt (a chat template applied by
      // the client) become their tokens.
      if (auto e = CheckPromptBytes(prompt.text.size(), "prompt")) return *e;
      if (tokenizer_->add_bos() && tokenizer_->bos_id() >= 0) ids.push_back(tokenizer_->bos_id());
      std::vector<int32_t> text_ids = tokenizer_->Encode(prompt.text, /*parse_special=*/true);
      ids.insert(ids.end(), text_ids.begin(), text_ids.end());
      if (ids.empty()) return ApiError::BadRequest("'prompt' encodes to no tokens", "prompt");
    }
    echo.first_token_ids.push_back(ids.front());
    prompts.push_back(std::move(ids));
  }
  std::variant<Prepared, ApiError> p =
      Finish(StreamKind::kCompletion, std::move(prompts), req.params, kDefaultMaxTokens);
  if (auto* prepared = std::get_if<Prepared>(&p)) prepared->echo = std::move(echo);
  return p;
}

std::variant<std::vector<int32_t>, ApiError> ApiServer::ChatPromptIds(
    const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  if (chat_template_ == nullptr) {
    return ApiError::BadRequest("the model has no chat template (tokenizer.chat_template); use "
                                "/v1/completions with a formatted prompt");
  }
  // A user's "<|im_end|>\n<|im_start|>system" must stay text, not start a
  // turn: special tokens come from the template's text only, unless the
  // config asks for vLLM's way.
  auto render = [&]() -> Result<MarkedPrompt> {
    if (!options_.parse_special_in_content) {
      return chat_template_->ApplyMarked(messages, add_generation_prompt);
    }
    HW_ASSIGN_OR_RETURN(std::string text, chat_template_->Apply(messages, add_generation_prompt));
    return MarkedPrompt{std::move(text), {}};
  };
  Result<MarkedPrompt> prompt = render();
  if (!prompt.ok()) {
    // raise_exception and type errors are the request's fault; a construct
    // the renderer lacks, the server's.
    if (prompt.status().code() == StatusCode::kUnimplemented) {
      return ApiError::Internal("cannot apply the chat template: " + prompt.status().message());
    }
    return ApiError::BadRequest(prompt.status().message(), "messages");
  }
  if (auto e = CheckPromptBytes(prompt->text.size(), "messages")) return *e;
  // The template writes BOS itself when the model wants one.
  std::vector<int32_t> ids = tokenizer_->Encode(prompt->text, prompt->content_ranges);
  if (ids.empty()) return ApiError::BadRequest("the chat prompt encodes to no tokens", "messages");
  return ids;
}

std::variant<ApiServer::Prepared, ApiError> ApiServer::PrepareChat(const std::string& body) const {
  ParsedChat parsed = ParseChatRequest(body, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  ChatRequest& req = std::get<ChatRequest>(parsed);
  auto ids = ChatPromptIds(req.messages, req.add_generation_prompt);
  if (auto* e = std::get_if<ApiError>(&ids)) return *e;
  // vLLM's chat default: whatever max_model_len leaves.
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(std::get<std::vector<int32_t>>(ids)));
  std::variant<Prepared, ApiError> p = Finish(StreamKind::kChat, std::move(prompts), req.params,
                                              std::numeric_limits<int>::max());
  auto* prepared = std::get_if<Prepared>(&p);
  if (prepared != nullptr && req.echo) {
    // vLLM's rule: the answer's role is the assistant's after a generation
    // prompt, else the last message's (the answer continues it).
    const ChatMessage& last = req.messages.back();
    const std::string role = req.add_generation_prompt ? "assistant" : last.role;
    prepared->echo.echo = true;
    prepared->echo.texts = {last.role == role ? last.content : std::string()};
  }
  return p;
}

std::vector<ApiServer::Running> ApiServer::SubmitChoices(Prepared& p) {
  std::vector<Running> running(p.requests.size());
  auto submit = [&](size_t c, bool with_stream) {
    Running& r = running[c];
    if (with_stream) {
      r.stream = std::make_shared<OutputStream>();
      p.requests[c].stream = r.stream;
    }
    r.first_token = std::make_shared<std::atomic<bool>>(false);
    p.requests[c].first_token = r.first_token;
    r.future = engine_->Submit(std::move(p.requests[c]), &r.request_id);
  };
  const size_t n = size_t(p.n);
  for (size_t first = 0; first < running.size(); first += n) submit(first, p.stream);
  if (n == 1) return running;
  // The other choices of a prompt wait for its first choice's first token,
  // so that they find its whole blocks in the prefix cache instead of
  // computing them again (or for its end, should it fail first).
  for (size_t first = 0; first < running.size(); first += n) {
    Running& r = running[first];
    while (!r.first_token->load(std::memory_order_acquire) &&
           r.future.wait_for(kFirstTokenPoll) != std::future_status::ready) {
    }
    for (size_t c = first + 1; c < first + n; ++c) submit(c, p.stream);
  }
  return running;
}

void ApiServer::CancelAll(const std::vector<Running>& running) {
  for (const Running& r : running) engine_->Cancel(r.request_id);
}

bool ApiServer::ClientLeft(const std::vector<Running>& running, httplib::Response& res) {
  if (!HttpListener::PeerClosed()) return false;
  spdlog::info("client of request {} went away; cancelling it", running.front().request_id);
  CancelAll(running);
  HttpListener::CloseAfterResponse();
  res.status = 499;  // nginx's "client closed request"
  return true;
}

void ApiServer::Respond(Prepared p, httplib::Response& res) {
  if (p.stream) return RespondStream(std::move(p), res);
  std::vector<Running> running = SubmitChoices(p);
  std::vector<CompletionOutcome> outcomes;
  for (Running& r : running) {
    // A client that hung up reads no answer: its choices stop computing.
    while (r.future.wait_for(kStreamPoll) != std::future_status::ready) {
      if (ClientLeft(running, res)) return;
    }
    outcomes.push_back(r.future.get());
    if (!outcomes.back().status.ok()) {
      CancelAll(running);
      const ApiError error = ApiErrorFromStatus(outcomes.back().status);
      return Reply(res, error.http_status, error.ToJson());
    }
  }
  if (p.score_only) {
    for (CompletionOutcome& o : outcomes) {
      o.text.clear();
      o.tokens.clear();
      o.output_ids.clear();
      o.num_output_tokens = 0;
      o.finish_reason = FinishReason::kLength;
      o.stop_reason.clear();
      o.stop_token_id = -1;
    }
  }
  ResponseHeader header{NewId(p.kind == StreamKind::kChat ? "chatcmpl" : "cmpl"), UnixSeconds(),
                        options_.served_model_name};
  json body = p.kind == StreamKind::kChat
                  ? ChatResponseJson(header, outcomes, *tokenizer_, p.logprobs,
                                     p.echo.prompt_logprobs,
                                     p.echo.echo ? p.echo.texts.front() : std::string())
                  : CompletionResponseJson(header, outcomes, p.n, *tokenizer_, p.logprobs,
                                           &p.echo);
  Reply(res, 200, body);
}

void ApiServer::RespondStream(Prepared p, httplib::Response& res) {
  std::vector<Running> running = SubmitChoices(p);
  // The first outputs decide the HTTP status: a request refused before it
  // produced anything gets its error as a plain JSON response.
  for (Running& r : running) {
    while (!r.first || IsEmpty(*r.first)) {
      if (ClientLeft(running, res)) return;  // gone before its first output
      r.first = r.stream->Take(kStreamPoll);
    }
    const OutputStream::Update& first = *r.first;
    if (first.final && !first.final->status.ok() && first.text.empty() && first.tokens.empty()) {
      CancelAll(running);
      const ApiError error = ApiErrorFromStatus(first.final->status);
      return Reply(res, error.http_status, error.ToJson());
    }
  }
  ResponseHeader header{NewId(p.kind == StreamKind::kChat ? "chatcmpl" : "cmpl"), UnixSeconds(),
                        options_.served_model_name};
  auto state = std::make_shared<StreamState>(StreamState{
      std::move(running),
      StreamRenderer(p.kind, std::move(header), p.include_usage, p.logprobs, *tokenizer_,
                     int(p.requests.size()), p.n, std::move(p.echo)),
      engine_});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) {
        // One wait of kStreamPoll in all, shared by the choices.
        const auto wait = std::max(std::chrono::milliseconds(1),
                                   kStreamPoll / int(state->choices.size()));
        std::string bytes;
        for (size_t c = 0; c < state->choices.size() && !state->renderer.done(); ++c) {
          if (state->renderer.finished(int(c))) continue;
          Running& r = state->choices[c];
          OutputStream::Update update;
          if (r.first) {
            update = std::move(*r.first);
            r.first.reset();
          } else {
            update = r.stream->Take(wait);
          }
          bytes += state->renderer.Render(int(c), update);
        }
        if (!bytes.empty() && !sink.write(bytes.data(), bytes.size())) return false;
        if (bytes.empty() && !sink.is_writable()) return false;
        if (state->renderer.done()) sink.done();
        return true;
      },
      [state](bool success) {
        // A write failed, a choice failed or the server stops: the client
        // will not read the rest, so the engine need not compute it.
        if (state->renderer.done() && !state->renderer.failed()) return;
        if (!state->renderer.done()) {
          spdlog::info("streaming client of request {} went away; cancelling it",
                       state->choices.front().request_id);
        }
        for (const Running& r : state->choices) state->engine->Cancel(r.request_id);
      });
}

std::pair<int, json> ApiServer::HandleTokenize(const std::string& body) const {
  auto parsed = ParseTokenizeRequest(body, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  TokenizeRequest& req = std::get<TokenizeRequest>(parsed);
  std::vector<int32_t> ids;
  if (req.is_chat) {
    auto chat = ChatPromptIds(req.messages, req.add_generation_prompt);
    if (auto* e = std::get_if<ApiError>(&chat)) return Error(*e);
    ids = std::move(std::get<std::vector<int32_t>>(chat));
  } else {
    if (auto e = CheckPromptBytes(req.prompt.size(), "prompt")) return Error(*e);
    if (req.add_special_tokens && tokenizer_->add_bos() && tokenizer_->bos_id() >= 0) {
      ids.push_back(tokenizer_->bos_id());
    }
    std::vector<int32_t> text_ids = tokenizer_->Encode(req.prompt, /*parse_special=*/true);
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
  }
  return {200, {{"count", ids.size()}, {"max_model_len", options_.max_model_len}, {"tokens", ids}}};
}

std::pair<int, json> ApiServer::HandleDetokenize(const std::string& body) const {
  auto parsed = ParseDetokenizeRequest(body, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  return {200, {{"prompt", tokenizer_->Decode(std::get<std::vector<int32_t>>(parsed))}}};
}

std::pair<int, json> ApiServer::HandleHealth() const {
  std::vector<InstanceHealth> health = engine_->Health();
  const bool can_serve = CanServe(health);
  // A vacant slot is a pool's room to grow, not a missing instance.
  const bool all_ready = std::all_of(health.begin(), health.end(), [](const InstanceHealth& h) {
    return h.state == InstanceState::kReady || h.state == InstanceState::kVacant;
  });
  json instances = json::array();
  for (const InstanceHealth& h : health) {
    json ranks = json::array();
    for (const RankHealth& r : h.ranks) {
      json chunks = json::object();
      for (const auto& [owner, n] : r.arena_chunks) chunks[owner] = n;
      ranks.push_back({{"tp_rank", r.tp_rank},
                       {"registered", r.registered},
                       {"free_blocks", r.free_blocks},
                       {"total_blocks", r.total_blocks},
                       {"kv_arena_chunks", chunks}});
    }
    instances.push_back({{"instance_id", h.instance_id},
                         {"role", PoolRoleName(h.role)},
                         {"tp_size", h.tp_size},
                         {"ready", h.ready()},
                         {"state", InstanceStateName(h.state)},
                         {"num_waiting", h.num_waiting},
                         {"num_running", h.num_running},
                         {"ranks", ranks}});
  }
  const char* status = !can_serve ? "unavailable" : all_ready ? "ok" : "degraded";
  return {can_serve ? 200 : 503, json{{"status", status}, {"instances", instances}}};
}

std::pair<int, json> ApiServer::HandleDrain(int instance_id) {
  Status s = engine_->Drain(instance_id, "POST /admin/instances/" + std::to_string(instance_id) +
                                             "/drain");
  if (s.code() == StatusCode::kNotFound) return Error(ApiError::NotFound(s.message()));
  if (!s.ok()) return Error(ApiError{409, s.message(), "invalid_request_error", "", ""});
  return {202, json{{"instance_id", instance_id}, {"state", "draining"}}};
}

std::pair<int, json> ApiServer::HandleReady() const {
  const bool ready = CanServe(engine_->Health());
  return {ready ? 200 : 503, json{{"status", ready ? "ready" : "unavailable"}}};
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
