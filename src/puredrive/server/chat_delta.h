// Streaming chat: turns successive parses of the growing assistant turn (TurnParser::feed results) into
// OpenAI "delta" objects: reasoning_content and content text, and tool-call deltas (the first with index, id,
// type and function name, later ones with argument text only). It relies on the TurnParser's promise that its
// results only grow.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/server/frontend.h"

namespace pd::server {

class ChatDeltaBuilder {
 public:
  // Tool call ids are id_prefix followed by random characters ("call_" for OpenAI, "toolu_" for Anthropic).
  explicit ChatDeltaBuilder(std::string id_prefix = "call_") : id_prefix_(std::move(id_prefix)) {}

  // The deltas that take the client from the previous parse to this one, in order; empty if nothing new.
  std::vector<nlohmann::json> update(const ParsedOutput& parsed);
  // Ids ("call_...") of the tool calls announced so far, by index.
  std::vector<std::string> tool_call_ids() const;

 private:
  struct CallState {
    std::string id;
    bool announced = false;
    size_t arguments_sent = 0;
  };
  std::string id_prefix_;
  size_t reasoning_sent_ = 0;
  size_t content_sent_ = 0;
  std::vector<CallState> calls_;
};

}  // namespace pd::server
