#include "puredrive/server/chat_delta.h"

#include "puredrive/server/openai_format.h"

namespace pd::server {

std::vector<nlohmann::json> ChatDeltaBuilder::update(const ParsedOutput& parsed) {
  std::vector<nlohmann::json> deltas;
  if (parsed.reasoning_content.size() > reasoning_sent_) {
    deltas.push_back({{"reasoning_content", parsed.reasoning_content.substr(reasoning_sent_)}});
    reasoning_sent_ = parsed.reasoning_content.size();
  }
  if (parsed.content.size() > content_sent_) {
    deltas.push_back({{"content", parsed.content.substr(content_sent_)}});
    content_sent_ = parsed.content.size();
  }
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
    const ParsedToolCall& call = parsed.tool_calls[i];
    if (i == calls_.size()) {
      CallState fresh;
      fresh.id = new_id(id_prefix_);
      calls_.push_back(std::move(fresh));
    }
    CallState& state = calls_[i];
    if (!state.announced) {
      if (call.name.empty()) break;  // later calls wait until this one is named, keeping indices in order
      deltas.push_back(
          {{"tool_calls",
            nlohmann::json::array({{{"index", i},
                                    {"id", state.id},
                                    {"type", "function"},
                                    {"function", {{"name", call.name}, {"arguments", call.arguments}}}}})}});
      state.announced = true;
      state.arguments_sent = call.arguments.size();
    } else if (call.arguments.size() > state.arguments_sent) {
      deltas.push_back(
          {{"tool_calls",
            nlohmann::json::array(
                {{{"index", i},
                  {"function", {{"arguments", call.arguments.substr(state.arguments_sent)}}}}})}});
      state.arguments_sent = call.arguments.size();
    }
  }
  return deltas;
}

std::vector<std::string> ChatDeltaBuilder::tool_call_ids() const {
  std::vector<std::string> ids;
  for (const auto& c : calls_) ids.push_back(c.id);
  return ids;
}

}  // namespace pd::server
