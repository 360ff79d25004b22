// OpenAI's error shape: {"error": {"message", "type", "param", "code"}} with an HTTP status. Every failure
// the server answers goes through ApiError, so clients see one format whatever went wrong.
#pragma once

#include <string>

#include "puredrive/util/status.h"

namespace pd::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // JSON null when empty
  std::string code;   // JSON null when empty

  std::string to_json() const;
};

ApiError api_error(int status, std::string type, std::string message, std::string code = "",
                   std::string param = "");
// 400 invalid_request_error.
ApiError invalid_request(std::string message, std::string param = "", std::string code = "");
// Maps a Status from the frontend or the engine: kInvalidArgument / kUnsupported are the client's fault
// (400), everything else is ours (500).
ApiError error_from_status(const Status& status);

}  // namespace pd::server
