// OpenAI's error shape: {"error": {"message", "type", "param", "code"}} with an HTTP status. Every failure
// the server answers goes through ApiError, so clients see one format whatever went wrong.
#pragma once

#include <string>
#include <string_view>

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

// Client text quoted in an error message: at most kMaxEchoBytes, cut at a character boundary, with the full
// size noted, so that a 20 MB model name is not sent back (and logged) whole.
inline constexpr size_t kMaxEchoBytes = 200;
std::string echo(std::string_view client_text, size_t max_bytes = kMaxEchoBytes);
// Text for a log line: control characters and invalid UTF-8 escaped (\n, \x1b, ...) so that client text
// cannot forge log lines or send terminal sequences; longer text is cut to `max_bytes`.
std::string log_safe(std::string_view text, size_t max_bytes = 4096);

}  // namespace pd::server
