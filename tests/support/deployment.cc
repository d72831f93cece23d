#include "tests/support/deployment.h"

#include <httplib.h>

#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "tests/support/test_env.h"

namespace headway::testing {

std::string SmolLm2ChatPrompt(const std::string& question) {
  return "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
         "Hugging Face<|im_end|>\n<|im_start|>user\n" +
         question + "<|im_end|>\n<|im_start|>assistant\n";
}

std::string DeploymentYaml(const DeploymentOptions& o, int http_port, int control_port) {
  std::ostringstream y;
  y << "model:\n"
    << "  path: " << o.model_path << "\n"
    << "  served_name: " << o.served_name << "\n";
  if (!o.head_pattern.empty()) y << "  head_pattern: " << o.head_pattern << "\n";
  y << "coordinator:\n"
    << "  http_host: " << o.host << "\n"
    << "  http_port: " << http_port << "\n"
    << "  control_address: tcp://" << o.host << ":" << control_port << "\n";
  if (o.heartbeat_timeout_ms > 0) y << "  heartbeat_timeout_ms: " << o.heartbeat_timeout_ms << "\n";
  y << "cache:\n"
    << "  block_size: " << o.block_size << "\n"
    << "  kv_memory_mb: " << o.kv_memory_mb << "\n"
    << "  gpu_memory_utilization: " << o.gpu_memory_utilization << "\n"
    << "  enable_recycling: " << (o.enable_recycling ? "true" : "false") << "\n"
    << "  enable_prefix_caching: " << (o.enable_prefix_caching ? "true" : "false") << "\n";
  if (!o.kv_cache_dtype.empty()) y << "  kv_cache_dtype: " << o.kv_cache_dtype << "\n";
  if (!o.kv_cache_dtype_sliding.empty()) {
    y << "  kv_cache_dtype_sliding: " << o.kv_cache_dtype_sliding << "\n";
  }
  y << "scheduler:\n"
    << "  max_num_seqs: " << o.max_num_seqs << "\n"
    << "  max_num_batched_tokens: " << o.max_num_batched_tokens << "\n"
    << "  max_model_len: " << o.max_model_len << "\n";
  if (!o.admission_policy.empty()) y << "  admission_policy: " << o.admission_policy << "\n";
  y << "routing:\n  max_local_prefill_tokens: " << o.max_local_prefill_tokens << "\n";
  if (!o.routing_policy.empty()) y << "  policy: " << o.routing_policy << "\n";
  y << "pools:\n";
  if (o.pd_decode_tp_size > 0) {
    y << "  - {name: prefill, role: prefill, instances: [{tp_size: 1, num_threads: 1, hosts: ["
      << o.host << "]}]}\n"
      << "  - {name: decode, role: decode, instances: [{tp_size: " << o.pd_decode_tp_size
      << ", num_threads: 1, hosts: [" << o.decode_host << "]}]}\n"
      << "kv_transfer: {transports: tcp, timeout_ms: " << o.kv_transfer_timeout_ms << "}\n";
  } else {
    y << "  - name: main\n"
      << "    role: mixed\n"
      << "    instances:\n";
    for (int i = 0; i < o.num_instances; ++i) {
      y << "      - tp_size: " << o.tp_size << "\n"
        << "        device: " << o.device << "\n";
      if (o.num_threads > 0) y << "        num_threads: " << o.num_threads << "\n";
      if (!o.collective.empty()) y << "        collective: " << o.collective << "\n";
    }
  }
  y << o.extra_yaml;
  return y.str();
}

bool EveryInstanceReady(const HttpReply& health) {
  return health.status == 200 && health.json.is_object() &&
         health.json.value("status", "") == "ok";
}

std::unique_ptr<Deployment> Deployment::Start(const DeploymentOptions& options,
                                              std::string* error, int timeout_s) {
  // FreePort's port is free when asked, not when bound: a test running
  // beside this one may take it first. Such a start is tried again on new
  // ports; any other failure is reported.
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    std::unique_ptr<Deployment> d(new Deployment());
    d->dir_ = MakeTempDir("headway-e2e");
    d->http_port_ = FreePort();
    int control_port = FreePort();
    d->config_path_ = d->dir_ + "/deploy.yaml";
    {
      std::ofstream out(d->config_path_);
      out << DeploymentYaml(options, d->http_port_, control_port);
    }
    d->launcher_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{BinaryPath("headway-launch"), d->config_path_},
        d->dir_ + "/launch.log");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!d->launcher_->Running()) break;
      if (EveryInstanceReady(d->Get("/health"))) return d;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    const std::string log = d->Log();
    if (attempt < kAttempts && !d->launcher_->Running() &&
        log.find("Address already in use") != std::string::npos) {
      continue;
    }
    if (error) *error = "deployment did not become healthy; launcher log:\n" + log;
    return nullptr;
  }
}

Deployment::~Deployment() { Stop(); }

void Deployment::Stop() {
  if (launcher_) launcher_->Stop(std::chrono::seconds(15));
}

namespace {
HttpReply ToReply(const httplib::Result& r) {
  HttpReply reply;
  if (!r) return reply;
  reply.status = r->status;
  reply.body = r->body;
  reply.json = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (reply.json.is_discarded()) reply.json = nullptr;
  return reply;
}
}  // namespace

HttpReply HttpGet(const std::string& host, int port, const std::string& path, int timeout_s) {
  httplib::Client client(host, port);
  client.set_read_timeout(timeout_s, 0);
  return ToReply(client.Get(path));
}

HttpReply HttpPost(const std::string& host, int port, const std::string& path,
                   const std::string& body, int timeout_s) {
  httplib::Client client(host, port);
  client.set_read_timeout(timeout_s, 0);
  return ToReply(client.Post(path, body, "application/json"));
}

HttpReply HttpGet(int port, const std::string& path, int timeout_s) {
  return HttpGet("127.0.0.1", port, path, timeout_s);
}

HttpReply HttpPost(int port, const std::string& path, const std::string& body, int timeout_s) {
  return HttpPost("127.0.0.1", port, path, body, timeout_s);
}

HttpReply Deployment::Get(const std::string& path) const { return HttpGet(http_port_, path); }

HttpReply Deployment::Post(const std::string& path, const std::string& body) const {
  return HttpPost(http_port_, path, body);
}

namespace {
// Sums every "free_blocks" number anywhere in the health document, so the
// test does not depend on how ranks are nested.
long SumFreeBlocks(const nlohmann::json& j) {
  long total = 0;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "free_blocks" && it->is_number_integer()) {
        total += it->get<long>();
      } else {
        total += SumFreeBlocks(*it);
      }
    }
  } else if (j.is_array()) {
    for (const auto& e : j) total += SumFreeBlocks(e);
  }
  return total;
}
}  // namespace

long Deployment::FreeBlocks() const {
  HttpReply r = Get("/health");
  if (r.json.is_null()) return -1;
  return SumFreeBlocks(r.json);
}

nlohmann::json GreedyCompletionBody(const nlohmann::json& prompt, int max_tokens) {
  return {{"model", "smollm2"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

std::string CompletionText(const HttpReply& reply) {
  if (reply.status == 200 && reply.json.is_object() && reply.json.contains("choices")) {
    return reply.json["choices"][0].value("text", "");
  }
  return "<status " + std::to_string(reply.status) + ": " + reply.body + ">";
}

bool IsErrorText(const std::string& text) { return text.rfind("<status ", 0) == 0; }

std::vector<std::string> GreedyTexts(const std::function<HttpReply(const std::string&)>& post,
                                     const std::vector<nlohmann::json>& prompts, int max_tokens,
                                     int rounds) {
  auto text_of = [&post, max_tokens](const nlohmann::json& prompt) {
    return CompletionText(post(GreedyCompletionBody(prompt, max_tokens).dump()));
  };
  std::vector<std::string> out;
  for (const nlohmann::json& p : prompts) out.push_back(text_of(p));
  std::vector<std::future<std::string>> futures;
  for (int round = 0; round < rounds; ++round) {
    for (const nlohmann::json& p : prompts) {
      futures.push_back(std::async(std::launch::async, text_of, p));
    }
  }
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

std::vector<nlohmann::json> SmolLm2TransferPrompts() {
  std::vector<nlohmann::json> prompts;
  for (const std::string& p : SmolLm2TestPrompts()) prompts.push_back(p);
  prompts.push_back(nlohmann::json::array({504, 2365, 6354}));
  nlohmann::json exact = nlohmann::json::array();
  for (int i = 0; i < 32; ++i) exact.push_back(100 + (i * 37) % 4000);
  prompts.push_back(exact);
  return prompts;
}

const std::vector<std::string>& SmolLm2TestPrompts() {
  static const std::vector<std::string> prompts = {
      SmolLm2ChatPrompt("What is the capital of France?"),
      "The quick brown fox",
      SmolLm2ChatPrompt("Write one sentence about the sea."),
      "Once upon a time, in a small village at the edge of a great forest, there lived an "
      "old woodcutter and his three daughters. Every morning",
      "1, 2, 3, 4, 5,",
      SmolLm2ChatPrompt("List three colours."),
  };
  return prompts;
}

}  // namespace headway::testing
