#include "coordinator/http/api_error.h"

namespace headway {

nlohmann::json ApiError::ToJson() const {
  nlohmann::json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(http_status) : nlohmann::json(code);
  return nlohmann::json{{"error", e}};
}

ApiError ApiError::BadRequest(std::string message, std::string param) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

ApiError ApiError::NotFound(std::string message) {
  return ApiError{404, std::move(message), "NotFoundError", "", ""};
}

ApiError ApiError::Unavailable(std::string message) {
  return ApiError{503, std::move(message), "server_error", "", ""};
}

ApiError ApiError::Internal(std::string message) {
  return ApiError{500, std::move(message), "server_error", "", ""};
}

ApiError ApiErrorFromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return ApiError::BadRequest(status.message());
    case StatusCode::kNotFound:
      return ApiError::NotFound(status.message());
    case StatusCode::kCancelled:
      // nginx's "client closed request", which vLLM's server uses too.
      return ApiError{499, status.message(), "server_error", "", ""};
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kResourceExhausted:
    case StatusCode::kAborted:
      return ApiError::Unavailable(status.message());
    default:
      return ApiError::Internal(status.message());
  }
}

}  // namespace headway
