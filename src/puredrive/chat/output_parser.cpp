#include "puredrive/chat/output_parser.h"

#include <algorithm>

namespace pd::chat {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

// Length of the longest suffix of `s` that is a proper prefix of `marker` (text that may still become it).
size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
  const size_t max = std::min(s.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kThinkClose);
  return close == std::string_view::npos || close < open;
}

OutputParser::OutputParser(OutputParserOptions options)
    : options_(std::move(options)),
      schemas_(options_.tools),
      state_(!options_.parse_reasoning      ? State::kContent
             : options_.starts_in_reasoning ? State::kReasoning
                                            : State::kStart) {
  if (!options_.make_id) options_.make_id = [](size_t i) { return "call_" + std::to_string(i); };
}

std::vector<ParseEvent> OutputParser::feed(std::string_view delta) {
  std::vector<ParseEvent> out;
  if (finished_) return out;
  buf_.append(delta);
  process(false, out);
  return out;
}

ParsedMessage OutputParser::finish(std::vector<ParseEvent>* events) {
  std::vector<ParseEvent> out;
  if (!finished_) {
    process(true, out);
    // Trailing whitespace of the content: part of the answer, unless it only separated tool calls.
    if (!held_space_.empty() && msg_.tool_calls.empty())
      add_text_event(ParseEventType::kContent, held_space_, out);
    held_space_.clear();
    held_newlines_.clear();
    finished_ = true;
  }
  if (events != nullptr) events->insert(events->end(), out.begin(), out.end());
  return msg_;
}

void OutputParser::add_text_event(ParseEventType type, std::string_view text, std::vector<ParseEvent>& out) {
  if (text.empty()) return;
  (type == ParseEventType::kContent ? msg_.content : msg_.reasoning_content).append(text);
  if (!out.empty() && out.back().type == type) {
    out.back().text.append(text);
    return;
  }
  out.push_back(ParseEvent{type, std::string(text), 0, "", ""});
}

void OutputParser::emit_reasoning(std::string_view text, std::vector<ParseEvent>& out) {
  if (reasoning_at_start_) {
    while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
    if (text.empty()) return;
    reasoning_at_start_ = false;
  }
  size_t keep = text.size();
  while (keep > 0 && text[keep - 1] == '\n') --keep;
  if (keep == 0) {
    held_newlines_.append(text);
    return;
  }
  std::string chunk = std::move(held_newlines_);
  chunk.append(text.substr(0, keep));
  held_newlines_ = std::string(text.substr(keep));
  add_text_event(ParseEventType::kReasoning, chunk, out);
}

void OutputParser::emit_content(std::string_view text, std::vector<ParseEvent>& out) {
  if (content_at_start_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    content_at_start_ = false;
  }
  size_t keep = text.size();
  while (keep > 0 && is_space(text[keep - 1])) --keep;
  if (keep == 0) {
    held_space_.append(text);
    return;
  }
  std::string chunk = std::move(held_space_);
  chunk.append(text.substr(0, keep));
  held_space_ = std::string(text.substr(keep));
  add_text_event(ParseEventType::kContent, chunk, out);
}

bool OutputParser::finish_tool_call(std::string_view body, std::vector<ParseEvent>& out) {
  size_t first = 0;
  while (first < body.size() && is_space(body[first])) ++first;
  std::optional<ToolCall> call;
  if (first < body.size() && body[first] == '<') {
    call = parse_xml_tool_call(body, schemas_);
  } else if (first < body.size() && body[first] == '{') {
    call = parse_json_tool_call(body);
  }
  if (!call || (!schemas_.empty() && !schemas_.has_tool(call->name))) return false;
  const size_t index = msg_.tool_calls.size();
  call->id = options_.make_id(index);
  ParseEvent start{ParseEventType::kToolCallStart, "", index, call->id, call->name};
  out.push_back(std::move(start));
  out.push_back(ParseEvent{ParseEventType::kToolCallArguments, call->arguments, index, "", ""});
  out.push_back(ParseEvent{ParseEventType::kToolCallEnd, "", index, "", ""});
  msg_.tool_calls.push_back(std::move(*call));
  return true;
}

void OutputParser::process(bool final, std::vector<ParseEvent>& out) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // <think> counts only at the very start of the output (after optional whitespace).
        size_t ws = 0;
        while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
        const std::string_view rest = std::string_view(buf_).substr(ws);
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          buf_.erase(0, ws + kThinkOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThinkOpen.substr(0, rest.size()) == rest) return;  // undecided yet
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = buf_.find(kThinkClose);
        // Models sometimes call a tool before closing their reasoning (and never close it): the call is
        // still a call, and the reasoning resumes after it.
        const size_t call = options_.parse_tool_calls ? buf_.find(kToolOpen) : std::string::npos;
        if (call != std::string::npos && (close == std::string::npos || call < close)) {
          emit_reasoning(std::string_view(buf_).substr(0, call), out);
          buf_.erase(0, call + kToolOpen.size());
          scanned_ = 0;
          call_in_reasoning_ = true;
          state_ = State::kToolCall;
          continue;
        }
        if (close != std::string::npos) {
          emit_reasoning(std::string_view(buf_).substr(0, close), out);
          held_newlines_.clear();
          buf_.erase(0, close + kThinkClose.size());
          state_ = State::kContent;
          content_at_start_ = true;
          continue;
        }
        size_t hold = 0;
        if (!final) {
          hold = partial_marker_suffix(buf_, kThinkClose);
          if (options_.parse_tool_calls) hold = std::max(hold, partial_marker_suffix(buf_, kToolOpen));
        }
        emit_reasoning(std::string_view(buf_).substr(0, buf_.size() - hold), out);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::kContent: {
        const size_t open = options_.parse_tool_calls ? buf_.find(kToolOpen) : std::string::npos;
        if (open != std::string::npos) {
          emit_content(std::string_view(buf_).substr(0, open), out);
          buf_.erase(0, open + kToolOpen.size());
          scanned_ = 0;
          state_ = State::kToolCall;
          continue;
        }
        const size_t hold =
            (final || !options_.parse_tool_calls) ? 0 : partial_marker_suffix(buf_, kToolOpen);
        emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::kToolCall: {
        // Resume the search where the last delta left off (long tool calls arrive token by token).
        const size_t close = buf_.find(kToolClose, scanned_);
        const bool in_reasoning = call_in_reasoning_;
        if (close == std::string::npos) {
          scanned_ = buf_.size() >= kToolClose.size() ? buf_.size() - kToolClose.size() + 1 : 0;
          if (!final) return;
          // Unterminated: the model's text, verbatim, where it was written.
          std::string raw = std::string(kToolOpen) + buf_;
          buf_.clear();
          call_in_reasoning_ = false;
          if (in_reasoning) {
            state_ = State::kReasoning;
            emit_reasoning(raw, out);
          } else {
            state_ = State::kContent;
            content_at_start_ = false;
            emit_content(raw, out);
          }
          return;
        }
        const std::string body = buf_.substr(0, close);
        buf_.erase(0, close + kToolClose.size());
        scanned_ = 0;
        call_in_reasoning_ = false;
        const bool parsed = finish_tool_call(body, out);
        if (in_reasoning) {
          // The newlines around the call stay held: they separate the reasoning before it from the
          // reasoning after it, and are dropped if none follows.
          state_ = State::kReasoning;
          if (!parsed) emit_reasoning(std::string(kToolOpen) + body + std::string(kToolClose), out);
          continue;
        }
        state_ = State::kContent;
        if (parsed) {
          held_space_.clear();  // whitespace before the call only separated it from the content
          content_at_start_ = true;
        } else {
          content_at_start_ = false;
          emit_content(std::string(kToolOpen) + body + std::string(kToolClose), out);
        }
        continue;
      }
    }
  }
}

}  // namespace pd::chat
