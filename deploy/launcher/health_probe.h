// Readiness check of a deployment at startup: the coordinator's GET /health.
#pragma once

#include <chrono>
#include <string>

namespace headway::launcher {

// True if GET http://host:port/health answers 200 with body status "ok"
// (every instance of the config ready) within `timeout` (connect and read
// each). A deployment that serves while some instance is still missing
// ("degraded") is not up yet: the launcher reports ready once all of it is.
// Any failure (refused, timeout, other status or body) is false.
bool ProbeHealth(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace headway::launcher
