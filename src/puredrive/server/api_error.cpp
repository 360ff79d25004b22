#include "puredrive/server/api_error.h"

#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace pd::server {
namespace {

// Length of the valid UTF-8 character starting at s[i], or 0 when the bytes there are not one.
size_t utf8_char_length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  char32_t cp = 0;
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) {
    n = 2;
    cp = b & 0x1F;
  } else if ((b & 0xF0) == 0xE0) {
    n = 3;
    cp = b & 0x0F;
  } else if ((b & 0xF8) == 0xF0) {
    n = 4;
    cp = b & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  const char32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string echo(std::string_view client_text, size_t max_bytes) {
  if (client_text.size() <= max_bytes) return std::string(client_text);
  size_t cut = max_bytes;
  // Back up over continuation bytes so that the cut never splits a character.
  while (cut > 0 && (static_cast<unsigned char>(client_text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", client_text.substr(0, cut), client_text.size());
}

std::string log_safe(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  size_t i = 0;
  while (i < text.size() && out.size() < max_bytes) {
    const auto b = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_char_length(text, i);
    if (n == 0 || b < 0x20 || b == 0x7F) {
      switch (b) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          out += fmt::format("\\x{:02x}", b);
      }
      ++i;
      continue;
    }
    // C1 controls (U+0080..U+009F) act as terminal escapes too.
    if (n == 2 && b == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[i + 1]));
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  if (i < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

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
