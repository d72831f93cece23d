#include "deploy/launcher/health_probe.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <exception>

namespace headway::launcher {

bool ProbeHealth(const std::string& host, int port, std::chrono::milliseconds timeout) {
  try {
    httplib::Client client(host, port);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    httplib::Result result = client.Get("/health");
    if (!result || result->status != 200) return false;
    nlohmann::json body = nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
    return body.is_object() && body.value("status", "") == "ok";
  } catch (const std::exception&) {
    return false;  // the probe only answers yes or no; the caller retries
  }
}

}  // namespace headway::launcher
