#include "puredrive/server/api_error.h"

#include <nlohmann/json.hpp>

namespace pd::server {

std::string ApiError::to_json() const {
  nlohmann::json j;
  j["error"] = {{"message", message},
                {"type", type},
                {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError api_error(int status, std::string type, std::string message, std::string code, std::string param) {
  return ApiError{.status = status,
                  .type = std::move(type),
                  .message = std::move(message),
                  .param = std::move(param),
                  .code = std::move(code)};
}

ApiError invalid_request(std::string message, std::string param, std::string code) {
  return ApiError{.status = 400,
                  .type = "invalid_request_error",
                  .message = std::move(message),
                  .param = std::move(param),
                  .code = std::move(code)};
}

ApiError error_from_status(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupported:
      return invalid_request(status.message());
    default:
      return api_error(500, "server_error", status.message());
  }
}

}  // namespace pd::server
