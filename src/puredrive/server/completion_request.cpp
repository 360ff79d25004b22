#include "puredrive/server/completion_request.h"

#include <fmt/format.h>

namespace pd::server {
namespace {

std::optional<ApiError> batched_prompt_error() {
  return invalid_request("Batched prompts are not supported: send one prompt per request.", "prompt",
                         "unsupported_value");
}

std::optional<ApiError> read_token_ids(const RequestJson& ids, int32_t vocab_size, CompletionRequest* out) {
  if (ids.empty())
    return invalid_request("Invalid value for 'prompt': the token list is empty.", "prompt", "invalid_value");
  for (size_t i = 0; i < ids.size(); ++i) {
    const RequestJson& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
      return invalid_request(
          fmt::format("Invalid value for 'prompt[{}]': expected a token id between 0 and {}, but "
                      "got {}.",
                      i, vocab_size - 1, id.dump()),
          "prompt", "invalid_value");
    }
    out->prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  out->prompt_is_ids = true;
  return std::nullopt;
}

// A string, a list holding one string, a list of token ids, or a list holding one list of token ids.
std::optional<ApiError> read_prompt(const RequestJson& j, int32_t vocab_size, CompletionRequest* out) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) {
    return invalid_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
  }
  const RequestJson& p = *it;
  if (p.is_string()) {
    out->prompt_text = p.get<std::string>();
    return std::nullopt;
  }
  if (!p.is_array()) {
    return invalid_request(
        "Invalid type for 'prompt': expected a string, an array of strings or an array of token ids.",
        "prompt", "invalid_type");
  }
  if (p.empty())
    return invalid_request("Invalid value for 'prompt': the array is empty.", "prompt", "invalid_value");
  if (p[0].is_string()) {
    if (p.size() > 1) return batched_prompt_error();
    out->prompt_text = p[0].get<std::string>();
    return std::nullopt;
  }
  if (p[0].is_array()) {
    if (p.size() > 1) return batched_prompt_error();
    return read_token_ids(p[0], vocab_size, out);
  }
  return read_token_ids(p, vocab_size, out);
}

}  // namespace

std::optional<ApiError> parse_completion_request(std::string_view body, const RequestLimits& limits,
                                                 CompletionRequest* out) {
  RequestJson j;
  if (auto err = parse_json_object(body, &j)) return err;
  FieldReader f(j, "");
  if (!read_common_fields(f, limits, &out->common)) return f.error();
  if (auto err = read_prompt(j, limits.vocab_size, out)) return err;
  if (!out->common.max_tokens) out->common.max_tokens = kCompletionDefaultMaxTokens;

  std::optional<bool> echo;
  std::optional<int64_t> logprobs, best_of;
  std::optional<std::string> suffix;
  if (!f.get_bool("echo", &echo) || !f.get_int("logprobs", 0, 20, &logprobs) ||
      !f.get_int("best_of", 1, 128, &best_of) || !f.get_string("suffix", &suffix)) {
    return f.error();
  }
  if (best_of && *best_of != 1) {
    return invalid_request("best_of > 1 is not supported: this server generates one completion per request.",
                           "best_of", "unsupported_value");
  }
  if (suffix && !suffix->empty()) {
    return invalid_request("'suffix' (insertion) is not supported; put the text to complete in 'prompt'.",
                           "suffix", "unsupported_parameter");
  }
  out->echo = echo.value_or(false);
  out->logprobs = logprobs ? static_cast<int32_t>(*logprobs) : -1;
  if (out->echo && out->logprobs >= 0) {
    return invalid_request("'echo' together with 'logprobs' (prompt logprobs) is not supported.", "echo",
                           "unsupported_value");
  }
  return std::nullopt;
}

}  // namespace pd::server
