// headway-coordinator: the HTTP API, tokenizer, schedulers and block
// allocators of a deployment. Workers connect to its control address.
//
//   headway-coordinator --config deploy.yaml [--model-dir DIR]
//       [--http-host H] [--http-port P] [--control-address tcp://H:P]
//       [--api-key KEY]
//
// The API key may also come from $HEADWAY_API_KEY (the flag wins); when
// set, /v1/* requests need `Authorization: Bearer KEY`.
//
// Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 2 for a configuration
// or model error found at startup, 1 for other startup failures.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "comm/control_channel.h"
#include "common/config.h"
#include "common/gguf.h"
#include "common/head_pattern.h"
#include "common/model_spec.h"
#include "common/startup.h"
#include "coordinator/http/api_server.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/engine/engine.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace {

int Fail(int code, const std::string& what, const headway::Status& status) {
  spdlog::error("{}: {}", what, status.message());
  std::fprintf(stderr, "headway-coordinator: %s: %s\n", what.c_str(), status.message().c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace headway;

  CLI::App app{"Headway coordinator: OpenAI-compatible API, scheduling and KV allocation"};
  std::string config_path, model_dir, http_host, control_address, api_key, log_level = "info";
  int http_port = -1;
  app.add_option("--config", config_path, "deployment YAML file")->required();
  app.add_option("--model-dir", model_dir,
                 "directory for a relative model.path (default: $HEADWAY_MODEL_DIR, "
                 "else ~/.cache/headway/models)");
  app.add_option("--http-host", http_host, "HTTP bind host (overrides coordinator.http_host)");
  app.add_option("--http-port", http_port, "HTTP port, 0 = any free port (overrides config)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--control-address", control_address,
                 "ZeroMQ ROUTER bind address, e.g. tcp://127.0.0.1:5557 (overrides config)");
  app.add_option("--api-key", api_key,
                 "require `Authorization: Bearer KEY` on /v1/* (default: $HEADWAY_API_KEY)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));

  if (model_dir.empty()) {
    model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
  }

  if (api_key.empty()) {
    const char* env = std::getenv("HEADWAY_API_KEY");
    if (env) api_key = env;
  }

  Result<Config> loaded = LoadConfigFile(config_path);
  if (!loaded.ok()) return Fail(2, "config " + config_path, loaded.status());
  Config config = std::move(loaded).value();
  if (!http_host.empty()) config.http_host = http_host;
  if (http_port >= 0) config.http_port = http_port;
  if (!control_address.empty()) config.control_address = control_address;
  ResolveModelPath(config, model_dir);

  // Workers apply the same head pattern (worker/main.cc): block tables only
  // fit when both sides agree on every slot's spec.
  StartupCheck failed_check = StartupCheck::kSupported;
  Result<StartupModel> model = OpenAndCheckModel(config, StartupCheckOptions{}, &failed_check);
  if (!model.ok()) {
    switch (failed_check) {
      case StartupCheck::kModelFile:
        return Fail(2, "model", model.status());
      case StartupCheck::kModelSpec:
        return Fail(2, "model " + config.model_path, model.status());
      default:
        return Fail(2, "config " + config_path, model.status());
    }
  }
  const GgufFile& gguf = *model->file;
  const ModelSpec& spec = model->spec;
  spdlog::info("attention: {}", DescribeSlotSpecs(spec));
  auto tokenizer = Tokenizer::FromGguf(gguf);
  if (!tokenizer.ok()) return Fail(2, "tokenizer of " + config.model_path, tokenizer.status());
  // A model without a usable chat template still serves completions.
  std::unique_ptr<ChatTemplate> chat_template;
  if (auto t = ChatTemplate::FromGguf(gguf, **tokenizer); t.ok()) {
    chat_template = std::make_unique<ChatTemplate>(std::move(t).value());
  } else {
    spdlog::warn("/v1/chat/completions is unavailable: {}", t.status().message());
  }
  if (config.served_model_name.empty()) {
    config.served_model_name = std::filesystem::path(config.model_path).stem().string();
  }

  // Signals are taken synchronously by this thread (sigwait below), so
  // every thread started from here on must have them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = ControlServer::Bind(config.control_address);
  if (!server.ok()) return Fail(1, "control channel", server.status());
  Engine engine(config, spec, tokenizer->get(), std::move(server).value());

  ApiServerOptions api_options;
  api_options.http_host = config.http_host;
  api_options.http_port = config.http_port;
  api_options.served_model_name = config.served_model_name;
  api_options.max_model_len = config.max_model_len;
  api_options.api_key = api_key;
  ApiServer api(api_options, &engine, tokenizer->get(), chat_template.get());
  Result<int> port = api.Bind();
  if (!port.ok()) return Fail(1, "HTTP server", port.status());

  engine.Start();
  std::thread http([&api] { api.Serve(); });
  spdlog::info("serving {} ({}) on http://{}:{}; workers connect to {}", config.served_model_name,
               config.model_path, config.http_host, *port, config.control_address);
  std::printf("headway-coordinator: listening on http://%s:%d\n", config.http_host.c_str(), *port);
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
