#include "coordinator/http/request_fields.h"

#include <cmath>
#include <limits>

namespace headway::request_fields {

using nlohmann::json;

const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError WrongType(const std::string& name, const char* expected) {
  return ApiError::BadRequest("'" + name + "' must be " + expected, name);
}

ApiError Unsupported(const std::string& name, const std::string& what) {
  return ApiError::BadRequest(what + " is not supported yet", name);
}

std::optional<ApiError> ReadNumber(const json& body, const char* name, std::optional<double>* out) {
  const json* v = Field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return WrongType(name, "a number");
  double d = v->get<double>();
  if (!std::isfinite(d)) return WrongType(name, "a finite number");
  *out = d;
  return std::nullopt;
}

std::optional<ApiError> ReadInteger(const json& body, const char* name, std::optional<int64_t>* out) {
  const json* v = Field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return WrongType(name, "an integer in range");
    *out = int64_t(u);
    return std::nullopt;
  }
  if (!v->is_number_integer()) return WrongType(name, "an integer");
  *out = v->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> ReadIntInRange(const json& body, const char* name, int64_t lo,
                                       int64_t hi, const std::string& requirement,
                                       std::optional<int>* out) {
  std::optional<int64_t> v;
  if (auto e = ReadInteger(body, name, &v)) return e;
  if (!v) return std::nullopt;
  if (*v < lo || *v > hi) {
    return ApiError::BadRequest(
        std::string(name) + " " + requirement + ", got " + std::to_string(*v) + ".", name);
  }
  *out = int(std::min<int64_t>(*v, std::numeric_limits<int>::max()));
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const json& body, const char* name, bool* out) {
  const json* v = Field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return WrongType(name, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ReadTokenIds(const json& array, const std::string& name, int vocab_size,
                                     std::vector<int32_t>* ids) {
  if (!array.is_array()) return WrongType(name, "an array of token ids");
  for (const json& t : array) {
    if (!t.is_number_integer()) return WrongType(name, "an array of token ids");
    int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return ApiError::BadRequest("token id " + std::to_string(id) + " in '" + name +
                                      "' is outside the vocabulary [0, " + std::to_string(vocab_size) + ")",
                                  name);
    }
    ids->push_back(int32_t(id));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseObject(std::string_view text, json* body) {
  *body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body->is_discarded()) return ApiError::BadRequest("the request body is not valid JSON");
  if (!body->is_object()) return ApiError::BadRequest("the request body must be a JSON object");
  return std::nullopt;
}

}  // namespace headway::request_fields
