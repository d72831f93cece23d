// Errors as the OpenAI API (and vLLM's server) returns them:
//   HTTP <status>  {"error": {"message", "type", "param", "code"}}
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace headway {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "NotFoundError", "server_error"
  std::string param;                           // offending field; "" = null
  std::string code;                            // "" = null

  // The response body.
  nlohmann::json ToJson() const;

  static ApiError BadRequest(std::string message, std::string param = "");
  static ApiError NotFound(std::string message);
  // 503: the server cannot serve the request now (instance down, not ready).
  static ApiError Unavailable(std::string message);
  // 500: a failure inside Headway (a worker's step error).
  static ApiError Internal(std::string message);
};

// The HTTP answer to a request that failed with `status` (REQUIRES: not
// OK), as vLLM's server answers: InvalidArgument and OutOfRange 400,
// NotFound 404, Cancelled 499 (the client went away), Unavailable,
// DeadlineExceeded, ResourceExhausted and Aborted 503 (the server cannot
// serve it now), anything else 500 (a failure inside Headway).
ApiError ApiErrorFromStatus(const Status& status);

}  // namespace headway
