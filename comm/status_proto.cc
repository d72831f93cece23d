#include "comm/status_proto.h"

namespace headway {

uint32_t StatusCodeToProto(StatusCode code) { return static_cast<uint32_t>(code); }

Status StatusFromProto(uint32_t code, const std::string& message) {
  if (code == 0) return message.empty() ? Status::Ok() : Status::Internal(message);
  if (code > static_cast<uint32_t>(kMaxStatusCode)) {
    return Status::Internal("unknown status code " + std::to_string(code) + ": " + message);
  }
  return Status::FromCode(static_cast<StatusCode>(code), message);
}

}  // namespace headway
