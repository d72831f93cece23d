// Readiness check of a deployment: the coordinator's GET /health.
#pragma once

#include <chrono>
#include <string>

namespace headway::launcher {

// True if GET http://host:port/health answers 200 within `timeout` (connect
// and read each). Any failure (refused, timeout, other status) is false.
bool ProbeHealth(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace headway::launcher
