// headway-coordinator: the HTTP API, tokenizer, schedulers and block
// allocators of a deployment. Workers connect to its control address.
//
//   headway-coordinator --config deploy.yaml [--model-dir DIR]
//       [--http-host H] [--http-port P] [--control-address tcp://H:P]
//       [--control-bind tcp://H:P] [--api-key KEY]
//       [--ssl-certfile CERT.pem --ssl-keyfile KEY.pem]
//
// The HTTP API binds http_host:http_port; the control ROUTER binds
// control_bind (default: control_address), and workers dial
// control_address. A host name in control_bind is resolved here (ZeroMQ
// binds only addresses, interface names and *); a listening host that does
// not resolve is a configuration error naming its key.
//
// API keys: --api-key (else $HEADWAY_API_KEY), coordinator.api_key and
// the lines of coordinator.api_key_file all admit requests; with any of
// them, every path but /health, /live and /ready (and /metrics, unless
// coordinator.metrics_require_api_key) needs `Authorization: Bearer KEY`.
// --ssl-certfile and --ssl-keyfile (or coordinator.ssl_*) serve HTTPS only.
//
// Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 2 for a bad command
// line, or a configuration or model error found at startup, 1 for other
// startup failures.
#include <arpa/inet.h>
#include <malloc.h>
#include <net/if.h>
#include <netinet/in.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "comm/control_channel.h"
#include "comm/control_keys.h"
#include "common/config.h"
#include "common/gguf.h"
#include "common/head_pattern.h"
#include "common/model_spec.h"
#include "common/net_address.h"
#include "common/startup.h"
#include "coordinator/http/api_server.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/engine/engine.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace {

using headway::Status;

int Fail(int code, const std::string& what, const Status& status) {
  spdlog::error("{}: {}", what, status.message());
  std::fprintf(stderr, "headway-coordinator: %s: %s\n", what.c_str(), status.message().c_str());
  return code;
}

// The command line; empty strings and -1 mean "not given".
struct Flags {
  std::string config_path, model_dir, http_host, control_address, control_bind, api_key,
      ssl_certfile, ssl_keyfile, log_level = "info";
  int http_port = -1;
};

void AddFlags(CLI::App& app, Flags* flags) {
  app.add_option("--config", flags->config_path, "deployment YAML file")->required();
  app.add_option("--model-dir", flags->model_dir,
                 "directory for a relative model.path (default: $HEADWAY_MODEL_DIR, "
                 "else ~/.cache/headway/models)");
  app.add_option("--http-host", flags->http_host,
                 "HTTP bind host (overrides coordinator.http_host)");
  app.add_option("--http-port", flags->http_port,
                 "HTTP port, 0 = any free port (overrides config)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--control-address", flags->control_address,
                 "ZeroMQ address workers dial, e.g. tcp://10.0.0.1:5557; also what the "
                 "ROUTER binds without a control bind (overrides coordinator.control_address)");
  app.add_option("--control-bind", flags->control_bind,
                 "ZeroMQ address the ROUTER binds, e.g. tcp://0.0.0.0:5557 (overrides "
                 "coordinator.control_bind)");
  app.add_option("--api-key", flags->api_key,
                 "require `Authorization: Bearer KEY` (default: $HEADWAY_API_KEY); adds to "
                 "coordinator.api_key and coordinator.api_key_file");
  app.add_option("--ssl-certfile", flags->ssl_certfile,
                 "PEM certificate chain: serve HTTPS only (overrides coordinator.ssl_certfile)");
  app.add_option("--ssl-keyfile", flags->ssl_keyfile,
                 "PEM private key of --ssl-certfile (overrides coordinator.ssl_keyfile)");
  // spdlog reads an unknown name as "off": a typo would silence the log.
  app.add_option("--log-level", flags->log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

// The command line's overrides of the config, then the model path resolved
// against `flags.model_dir`.
void ApplyFlags(const Flags& flags, headway::Config* config) {
  if (!flags.http_host.empty()) config->http_host = flags.http_host;
  if (flags.http_port >= 0) config->http_port = flags.http_port;
  if (!flags.control_address.empty()) config->control_address = flags.control_address;
  if (!flags.control_bind.empty()) config->control_bind = flags.control_bind;
  if (!flags.ssl_certfile.empty()) config->http.ssl_certfile = flags.ssl_certfile;
  if (!flags.ssl_keyfile.empty()) config->http.ssl_keyfile = flags.ssl_keyfile;
  headway::ResolveModelPath(*config, flags.model_dir);
}

// Checks that the HTTP host resolves, and returns the endpoint the control
// ROUTER binds: ControlBindAddress() with a host name replaced by its
// address, since ZeroMQ binds IPs, interface names (tcp://eth0:5557) and *
// but not names. Errors: InvalidArgument naming the key (or flag) when a
// host does not resolve, before anything binds.
headway::Result<std::string> ResolveListenAddresses(const Flags& flags,
                                                    const headway::Config& config) {
  const std::string http_key = flags.http_host.empty() ? "coordinator.http_host" : "--http-host";
  HW_RETURN_IF_ERROR(headway::CheckHostSyntax(http_key, config.http_host, true));
  if (auto r = headway::ResolveHost(http_key, config.http_host); !r.ok()) return r.status();
  std::string control_key = "coordinator.control_bind";
  if (!flags.control_bind.empty()) {
    control_key = "--control-bind";
  } else if (config.control_bind.empty()) {
    control_key = flags.control_address.empty() ? "coordinator.control_address"
                                                : "--control-address";
  }
  const std::string& endpoint = config.ControlBindAddress();
  const std::string host = headway::ZmqTcpHost(endpoint);
  in6_addr ip{};
  const bool literal = inet_pton(AF_INET, host.c_str(), &ip) == 1 ||
                       inet_pton(AF_INET6, host.c_str(), &ip) == 1;
  if (host.empty() || host == "*" || literal || if_nametoindex(host.c_str()) != 0) {
    return endpoint;
  }
  headway::Result<std::string> resolved = headway::ResolveHost(control_key, host);
  if (!resolved.ok()) {
    return Status::InvalidArgument(resolved.status().message() + " (in " + endpoint +
                                   "; an interface name such as eth0, or *, binds too)");
  }
  const std::string port = endpoint.substr(endpoint.rfind(':'));
  const bool ipv6 = resolved->find(':') != std::string::npos;
  return "tcp://" + (ipv6 ? "[" + *resolved + "]" : *resolved) + port;
}

// OpenAndCheckModel's failure as an exit: what failed is named after the
// check that found it.
int FailModel(headway::StartupCheck failed_check, const headway::Config& config,
              const std::string& config_path, const Status& status) {
  switch (failed_check) {
    case headway::StartupCheck::kModelFile:
      return Fail(2, "model", status);
    case headway::StartupCheck::kModelSpec:
      return Fail(2, "model " + config.model_path, status);
    default:
      return Fail(2, "config " + config_path, status);
  }
}

// The model's chat template; null (with a warning) when it has none usable:
// the model still serves completions.
std::unique_ptr<headway::ChatTemplate> LoadChatTemplate(const headway::GgufFile& gguf,
                                                        const headway::Tokenizer& tokenizer) {
  auto t = headway::ChatTemplate::FromGguf(gguf, tokenizer);
  if (!t.ok()) {
    spdlog::warn("/v1/chat/completions is unavailable: {}", t.status().message());
    return nullptr;
  }
  return std::make_unique<headway::ChatTemplate>(std::move(t).value());
}

// Blocks SIGINT and SIGTERM in this thread and every thread started from
// it, so that Serve takes them synchronously (sigwait). Returns the set.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The API server's options: the config's, with every API key (config,
// key file, flag) in one list. Errors: those of ReadApiKeyFile.
headway::Result<headway::ApiServerOptions> ApiOptionsOf(const headway::Config& config,
                                                        const std::string& api_key) {
  headway::ApiServerOptions options;
  options.http_host = config.http_host;
  options.http_port = config.http_port;
  options.served_model_name = config.served_model_name;
  options.max_model_len = config.max_model_len;
  options.http = config.http;
  if (!config.http.api_key_file.empty()) {
    auto keys = headway::ReadApiKeyFile(config.http.api_key_file);
    if (!keys.ok()) return keys.status();
    options.http.api_keys.insert(options.http.api_keys.end(), keys->begin(), keys->end());
  }
  if (!api_key.empty()) options.http.api_keys.push_back(api_key);
  options.parse_special_in_content = config.chat_parse_special_in_content;
  return options;
}

// Starts the engine and the HTTP server (bound to `port`), serves until one
// of `signals` arrives, then stops both. Returns the exit code.
int Serve(headway::Engine& engine, headway::ApiServer& api, const headway::Config& config,
          int port, const sigset_t& signals) {
  engine.Start();
  std::thread http([&api] { api.Serve(); });
  const char* scheme = config.http.ssl_certfile.empty() ? "http" : "https";
  spdlog::info("serving {} ({}) on {}://{}:{}; control bound to {} ({}), workers dial {}",
               config.served_model_name, config.model_path, scheme, config.http_host, port,
               config.ControlBindAddress(),
               config.security.HasKeys() ? "CurveZMQ, clients on security.authorized_keys"
                                         : "unauthenticated",
               config.control_address);
  std::printf("headway-coordinator: listening on %s://%s:%d\n", scheme, config.http_host.c_str(),
              port);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received signal {}; shutting down", signal_number);
  engine.Stop(std::string("coordinator shutting down (signal ") + std::to_string(signal_number) + ")");
  api.Stop();
  http.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace headway;
  // Every HTTP connection has a thread, and glibc gives threads arenas of
  // their own (up to 8 per core): the memory of a large answer (n choices
  // with prompt logprobs build hundreds of MB of JSON) stayed in its
  // thread's arena, and RSS grew by that much with each such request
  // served by another thread. Two arenas bound that at twice the largest
  // answer; the HTTP threads allocate too little for the lock to matter.
  mallopt(M_ARENA_MAX, 2);

  CLI::App app{"Headway coordinator: OpenAI-compatible API, scheduling and KV allocation"};
  Flags flags;
  AddFlags(app, &flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (105, 106, ...) would read as a crash to a supervisor.
    return app.exit(e) == 0 ? 0 : 2;
  }
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  if (flags.model_dir.empty()) {
    flags.model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
  }
  if (flags.api_key.empty()) {
    const char* env = std::getenv("HEADWAY_API_KEY");
    if (env) flags.api_key = env;
  }

  Result<Config> loaded = LoadConfigFile(flags.config_path);
  if (!loaded.ok()) return Fail(2, "config " + flags.config_path, loaded.status());
  Config config = std::move(loaded).value();
  ApplyFlags(flags, &config);
  if (Status s = ValidateConfig(config); !s.ok()) return Fail(2, "command line", s);
  headway::Result<std::string> control_bind = ResolveListenAddresses(flags, config);
  if (!control_bind.ok()) return Fail(2, "config", control_bind.status());
  if (Status s = CheckControlPlaneSecurity(config); !s.ok()) return Fail(2, "config", s);
  Result<std::optional<ControlServerKeys>> control_keys = LoadControlServerKeys(config.security);
  if (!control_keys.ok()) return Fail(2, "config " + flags.config_path, control_keys.status());

  // Workers apply the same head pattern (worker/main.cc): block tables only
  // fit when both sides agree on every slot's spec.
  StartupCheck failed_check = StartupCheck::kSupported;
  Result<StartupModel> model = OpenAndCheckModel(config, StartupCheckOptions{}, &failed_check);
  if (!model.ok()) return FailModel(failed_check, config, flags.config_path, model.status());
  const GgufFile& gguf = *model->file;
  const ModelSpec& spec = model->spec;
  spdlog::info("attention: {}", DescribeSlotSpecs(spec));
  auto tokenizer = Tokenizer::FromGguf(gguf);
  if (!tokenizer.ok()) return Fail(2, "tokenizer of " + config.model_path, tokenizer.status());
  std::unique_ptr<ChatTemplate> chat_template = LoadChatTemplate(gguf, **tokenizer);
  if (config.served_model_name.empty()) {
    config.served_model_name = std::filesystem::path(config.model_path).stem().string();
  }

  Result<ApiServerOptions> api_options = ApiOptionsOf(config, flags.api_key);
  if (!api_options.ok()) return Fail(2, "coordinator.api_key_file", api_options.status());

  const sigset_t signals = BlockStopSignals();
  ControlChannelOptions control_options;
  control_options.max_message_bytes = int64_t(config.control_max_message_mb) << 20;
  auto server = ControlServer::Bind(*control_bind, *control_keys, control_options);
  if (!server.ok()) return Fail(1, "control channel", server.status());
  Engine engine(config, spec, tokenizer->get(), std::move(server).value());
  ApiServer api(std::move(api_options).value(), &engine, tokenizer->get(), chat_template.get());
  if (Status s = api.LoadTls(); !s.ok()) return Fail(2, "TLS", s);
  Result<int> port = api.Bind();
  if (!port.ok()) return Fail(1, "HTTP server", port.status());
  return Serve(engine, api, config, *port, signals);
}
