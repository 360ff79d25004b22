#include "puredrive/server/request_fields.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace pd::server {
namespace {

// Deepest nesting of arrays/objects, found without building anything, so that a hostile body cannot
// make the parser or the destructor of the parsed value work through millions of levels.
int json_depth(std::string_view s) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const char* json_type(const RequestJson& j) {
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return "null";
}

std::string format_number(double v) {
  return fmt::format("{}", v);
}

}  // namespace

std::optional<ApiError> parse_json_object(std::string_view body, RequestJson* out) {
  if (body.empty()) {
    return invalid_request("The request body is empty; expected a JSON object.");
  }
  if (json_depth(body) > kMaxJsonDepth) {
    return invalid_request(fmt::format("The JSON body is nested more than {} levels deep.", kMaxJsonDepth));
  }
  try {
    *out = RequestJson::parse(body);
  } catch (const RequestJson::parse_error& e) {
    std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos) {
      return invalid_request(fmt::format(
          "The request body contains invalid UTF-8 or an invalid \\u escape (at byte {}); strings "
          "must be valid UTF-8.",
          e.byte));
    }
    return invalid_request(fmt::format(
        "We could not parse the JSON body of your request: syntax error at byte {}. Send valid JSON.",
        e.byte));
  } catch (const RequestJson::exception& e) {
    // Numbers beyond the double range ("1e400") and the like: still the client's mistake.
    return invalid_request(fmt::format("We could not parse the JSON body of your request: {}.",
                                       e.id == 406 ? "a number is out of range" : "invalid JSON"));
  }
  if (!out->is_object()) {
    return invalid_request(
        fmt::format("The request body must be a JSON object, but got {}.", json_type(*out)));
  }
  return std::nullopt;
}

std::string param_name(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
}

std::string param_index(std::string_view parent, size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

const RequestJson* FieldReader::find(const char* key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool FieldReader::has(const char* key) const {
  return find(key) != nullptr;
}

bool FieldReader::fail(ApiError error) {
  if (!error_) error_ = std::move(error);
  return false;
}

bool FieldReader::type_error(const char* key, const char* expected) {
  const RequestJson* v = find(key);
  return fail(invalid_request(fmt::format("Invalid type for '{}': expected {}, but got {} instead.",
                                          name(key), expected, v ? json_type(*v) : "null"),
                              name(key), "invalid_type"));
}

bool FieldReader::value_error(const char* key, const std::string& message) {
  return fail(invalid_request(fmt::format("Invalid value for '{}': {}", name(key), message), name(key),
                              "invalid_value"));
}

bool FieldReader::get_string(const char* key, std::optional<std::string>* out) {
  const RequestJson* v = find(key);
  if (!v) return true;
  if (!v->is_string()) return type_error(key, "a string");
  *out = v->get<std::string>();
  return true;
}

bool FieldReader::require_string(const char* key, std::string* out) {
  if (!has(key)) {
    return fail(invalid_request(fmt::format("Missing required parameter: '{}'.", name(key)), name(key),
                                "missing_required_parameter"));
  }
  std::optional<std::string> s;
  if (!get_string(key, &s)) return false;
  *out = std::move(*s);
  return true;
}

bool FieldReader::get_bool(const char* key, std::optional<bool>* out) {
  const RequestJson* v = find(key);
  if (!v) return true;
  if (!v->is_boolean()) return type_error(key, "a boolean");
  *out = v->get<bool>();
  return true;
}

bool FieldReader::get_int(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  const RequestJson* v = find(key);
  if (!v) return true;
  int64_t value = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return value_error(
          key, fmt::format("expected an integer between {} and {}, but got {}.", lo, hi, v->get<uint64_t>()));
    }
    value = v->get<int64_t>();
  } else if (v->is_number_float()) {
    // 16.0 is accepted as 16 (some JavaScript clients send whole numbers as floats); 16.5 is not.
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.0e15)
      return type_error(key, "an integer");
    value = static_cast<int64_t>(d);
  } else {
    return type_error(key, "an integer");
  }
  if (value < lo || value > hi) {
    return value_error(key, fmt::format("expected an integer between {} and {}, but got {}.", lo, hi, value));
  }
  *out = value;
  return true;
}

bool FieldReader::get_number(const char* key, double lo, double hi, std::optional<double>* out) {
  const RequestJson* v = find(key);
  if (!v) return true;
  if (!v->is_number()) return type_error(key, "a number");
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) {
    return value_error(key, fmt::format("expected a value between {} and {}, but got {}.", format_number(lo),
                                        format_number(hi), format_number(d)));
  }
  *out = d;
  return true;
}

namespace {

bool read_stop(FieldReader& f, std::vector<std::string>* out) {
  const RequestJson* v = f.find("stop");
  if (!v) return true;
  if (v->is_string()) {
    out->push_back(v->get<std::string>());
    return true;
  }
  if (!v->is_array()) return f.type_error("stop", "a string or an array of strings");
  if (v->size() > 4) {
    return f.value_error("stop", fmt::format("at most 4 stop sequences are allowed, but got {}.", v->size()));
  }
  for (const auto& s : *v) {
    if (!s.is_string()) return f.type_error("stop", "a string or an array of strings");
    out->push_back(s.get<std::string>());
  }
  return true;
}

bool read_logit_bias(FieldReader& f, int32_t vocab_size, SamplingOptions* s) {
  const RequestJson* v = f.find("logit_bias");
  if (!v) return true;
  if (!v->is_object()) return f.type_error("logit_bias", "an object mapping token ids to biases");
  for (const auto& [key, bias] : v->items()) {
    int64_t id = -1;
    size_t used = 0;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || key.empty() || id < 0 || id >= vocab_size) {
      return f.value_error("logit_bias", fmt::format("key '{}' is not a token id between 0 and {}.",
                                                     echo(key), vocab_size - 1));
    }
    if (!bias.is_number() || !(bias.get<double>() >= -100.0 && bias.get<double>() <= 100.0)) {
      return f.value_error(
          "logit_bias",
          fmt::format("the bias of token {} must be a number between -100 and 100.", echo(key)));
    }
    s->logit_bias.emplace_back(static_cast<int32_t>(id), bias.get<float>());
  }
  return true;
}

bool read_sampling(FieldReader& f, const RequestLimits& limits, SamplingOptions* s) {
  std::optional<double> min_p, presence, frequency;
  std::optional<int64_t> seed;
  if (!read_core_sampling(f, 2.0, s) || !f.get_number("min_p", 0.0, 1.0, &min_p) ||
      !f.get_number("presence_penalty", -2.0, 2.0, &presence) ||
      !f.get_number("frequency_penalty", -2.0, 2.0, &frequency) ||
      !f.get_int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed)) {
    return false;
  }
  if (min_p) s->min_p = static_cast<float>(*min_p);
  if (presence) s->presence_penalty = static_cast<float>(*presence);
  if (frequency) s->frequency_penalty = static_cast<float>(*frequency);
  if (seed) s->seed = static_cast<uint64_t>(*seed);
  return read_logit_bias(f, limits.vocab_size, s);
}

// "puredrive": the server's own request options, {"mtp": false} for now. Unknown keys are refused: in our
// own namespace a misspelt option would otherwise be ignored without a word.
bool read_extensions(FieldReader& f, CommonFields* out) {
  const RequestJson* ext = f.find("puredrive");
  if (!ext) return true;
  if (!ext->is_object()) return f.type_error("puredrive", "an object");
  FieldReader ef(*ext, f.name("puredrive"));
  for (const auto& [key, value] : ext->items()) {
    if (key != "mtp") {
      return f.fail(invalid_request(
          fmt::format("Unknown parameter: '{}'; the known one is 'mtp'.", ef.name(echo(key).c_str())),
          ef.name(echo(key).c_str()), "unknown_parameter"));
    }
  }
  std::optional<bool> mtp;
  if (!ef.get_bool("mtp", &mtp)) return f.fail(*ef.error());
  out->mtp = mtp.value_or(true);
  return true;
}

}  // namespace

bool read_model(FieldReader& f, const RequestLimits& limits, std::string* out) {
  if (!f.require_string("model", out)) return false;
  bool known = false;
  for (const auto& name : limits.model_names) known = known || name == *out;
  if (!known) {
    return f.fail(
        ApiError{.status = 404,
                 .type = "invalid_request_error",
                 .message = fmt::format("The model '{}' does not exist. This server serves '{}'.", echo(*out),
                                        limits.model_names.empty() ? "" : limits.model_names[0]),
                 .param = "model",
                 .code = "model_not_found"});
  }
  return true;
}

bool read_core_sampling(FieldReader& f, double max_temperature, SamplingOptions* s) {
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  if (!f.get_number("temperature", 0.0, max_temperature, &temperature) ||
      !f.get_number("top_p", 0.0, 1.0, &top_p) ||
      !f.get_int("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) {
    return false;
  }
  if (temperature) s->temperature = static_cast<float>(*temperature);
  if (top_p) s->top_p = static_cast<float>(*top_p);
  // top_p = 0 keeps only the most likely token: that is greedy decoding.
  if (top_p && *top_p == 0.0) {
    s->temperature = 0.0f;
    s->top_p = 1.0f;
  }
  if (top_k && *top_k > 0) s->top_k = static_cast<int32_t>(*top_k);  // 0 and -1 (vLLM's "off") mean off
  return true;
}

bool is_valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool read_template_kwargs(FieldReader& f, RequestJson* out) {
  const RequestJson* kwargs = f.find("chat_template_kwargs");
  if (!kwargs) return true;
  if (!kwargs->is_object()) return f.type_error("chat_template_kwargs", "an object");
  FieldReader kf(*kwargs, "chat_template_kwargs");
  std::optional<bool> thinking;
  if (!kf.get_bool("enable_thinking", &thinking)) return f.fail(*kf.error());
  *out = *kwargs;
  return true;
}

bool read_common_fields(FieldReader& f, const RequestLimits& limits, CommonFields* out) {
  if (!read_model(f, limits, &out->model)) return false;
  std::optional<bool> stream;
  if (!f.get_bool("stream", &stream)) return false;
  out->stream = stream.value_or(false);
  if (const RequestJson* so = f.find("stream_options")) {
    if (!out->stream) {
      return f.fail(
          invalid_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          "stream_options", "invalid_value"));
    }
    if (!so->is_object()) return f.type_error("stream_options", "an object");
    FieldReader sf(*so, "stream_options");
    std::optional<bool> include_usage;
    if (!sf.get_bool("include_usage", &include_usage)) return f.fail(*sf.error());
    out->include_usage = include_usage.value_or(false);
  }
  std::optional<int64_t> n;
  if (!f.get_int("n", 1, 128, &n)) return false;
  if (n && *n != 1) {
    return f.fail(invalid_request(
        fmt::format(
            "n={} is not supported: this server generates one choice per request (single stream). Send "
            "n=1 or several requests.",
            *n),
        "n", "unsupported_value"));
  }
  std::optional<int64_t> max_tokens, max_completion_tokens;
  if (!f.get_int("max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens) ||
      !f.get_int("max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &max_completion_tokens)) {
    return false;
  }
  // max_completion_tokens is the newer name; when both come, it wins.
  if (max_completion_tokens) {
    out->max_tokens = static_cast<int32_t>(*max_completion_tokens);
  } else if (max_tokens) {
    out->max_tokens = static_cast<int32_t>(*max_tokens);
  }
  return read_stop(f, &out->stop) && read_sampling(f, limits, &out->sampling) && read_extensions(f, out);
}

}  // namespace pd::server
