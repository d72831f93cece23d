#include "deploy/launcher/health_probe.h"

#include <httplib.h>

#include <exception>

namespace headway::launcher {

bool ProbeHealth(const std::string& host, int port, std::chrono::milliseconds timeout) {
  try {
    httplib::Client client(host, port);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    httplib::Result result = client.Get("/health");
    return result && result->status == 200;
  } catch (const std::exception&) {
    return false;  // the probe only answers yes or no; the caller retries
  }
}

}  // namespace headway::launcher
