// Typed access to the fields of an OpenAI request body, with OpenAI-style errors that name the parameter
// ("Invalid type for 'temperature': expected a number, but got a string instead."). A JSON null counts as
// an absent field, as in OpenAI's API. Each reader returns false after recording the first error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/server/api_error.h"
#include "puredrive/server/engine_port.h"

namespace pd::server {

// Ordered: tool schemas and template kwargs reach the chat template with their keys in the client's order,
// as transformers renders them (tojson keeps insertion order).
using RequestJson = nlohmann::ordered_json;

// Parses a request body: valid UTF-8 JSON object, nesting at most kMaxJsonDepth deep.
inline constexpr int kMaxJsonDepth = 128;
std::optional<ApiError> parse_json_object(std::string_view body, RequestJson* out);

// "messages[2].content" style names for nested parameters.
std::string param_name(std::string_view parent, std::string_view key);
std::string param_index(std::string_view parent, size_t index);

class FieldReader {
 public:
  FieldReader(const RequestJson& object, std::string path) : obj_(object), path_(std::move(path)) {}

  bool has(const char* key) const;  // present and not null
  const RequestJson* find(const char* key) const;
  std::string name(const char* key) const { return param_name(path_, key); }

  bool get_string(const char* key, std::optional<std::string>* out);
  bool get_bool(const char* key, std::optional<bool>* out);
  bool get_int(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out);
  bool get_number(const char* key, double lo, double hi, std::optional<double>* out);
  bool require_string(const char* key, std::string* out);

  // Records an error for a field with the wrong JSON type.
  bool type_error(const char* key, const char* expected);
  bool value_error(const char* key, const std::string& message);
  bool fail(ApiError error);

  std::optional<ApiError>& error() { return error_; }

 private:
  const RequestJson& obj_;
  std::string path_;
  std::optional<ApiError> error_;
};

// The request fields shared by /v1/chat/completions and /v1/completions.
struct CommonFields {
  std::string model;
  bool stream = false;
  bool include_usage = false;
  SamplingOptions sampling;
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;
  bool mtp = true;  // "puredrive": {"mtp": false} decodes without MTP drafts (same output, docs/API.md)
};

struct RequestLimits {
  std::vector<std::string> model_names;  // accepted values of "model"
  int32_t vocab_size = 0;
};

// model, stream, stream_options, n, temperature, top_p, top_k, min_p, penalties, seed, logit_bias, stop,
// max_tokens / max_completion_tokens, puredrive.
bool read_common_fields(FieldReader& f, const RequestLimits& limits, CommonFields* out);

// The pieces that the Anthropic Messages API shares with OpenAI's:
// "model", required and one of limits.model_names (404 model_not_found otherwise).
bool read_model(FieldReader& f, const RequestLimits& limits, std::string* out);
// temperature in [0, max_temperature], top_p in [0, 1] (0 = greedy), top_k (0 and -1 = off).
bool read_core_sampling(FieldReader& f, double max_temperature, SamplingOptions* s);
// Tool names as OpenAI and Anthropic accept them: ^[a-zA-Z0-9_-]{1,64}$.
bool is_valid_function_name(std::string_view name);
// "chat_template_kwargs": an object of extra chat template variables; its "enable_thinking", which the
// server itself interprets (thinking control), must be a boolean.
bool read_template_kwargs(FieldReader& f, RequestJson* out);

}  // namespace pd::server
