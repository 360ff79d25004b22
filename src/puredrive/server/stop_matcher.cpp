#include "puredrive/server/stop_matcher.h"

#include <algorithm>

namespace pd::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::vector<GenerationOutput> StopMatcher::push(GenerationOutput output) {
  if (matched_) return {};
  if (stops_.empty()) return {std::move(output)};
  pending_.push_back(std::move(output));
  std::string text;
  for (const auto& p : pending_) text += p.text;

  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, text.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    auto out = release(first);
    pending_.clear();
    return out;
  }
  return release(text.size() - held_suffix(text));
}

std::vector<GenerationOutput> StopMatcher::flush() {
  std::vector<GenerationOutput> out(std::make_move_iterator(pending_.begin()),
                                    std::make_move_iterator(pending_.end()));
  pending_.clear();
  return out;
}

// Longest suffix of text that is a proper prefix of some stop string: it may still become a match.
size_t StopMatcher::held_suffix(const std::string& text) const {
  size_t best = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(text.size(), s.size() - 1); len > best; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

std::vector<GenerationOutput> StopMatcher::release(size_t n) {
  std::vector<GenerationOutput> out;
  size_t pos = 0;
  while (!pending_.empty()) {
    GenerationOutput& front = pending_.front();
    const size_t len = front.text.size();
    if (pos + len <= n && !(len == 0 && pos == n && matched_)) {
      pos += len;
      out.push_back(std::move(front));
      pending_.pop_front();
      continue;
    }
    if (pos < n) {
      // The boundary falls inside this output: its tokens go out with the released head of its text; the
      // tail stays pending without tokens (they were already accounted for).
      GenerationOutput head;
      head.token_ids = std::move(front.token_ids);
      head.logprobs = std::move(front.logprobs);
      head.text = front.text.substr(0, n - pos);
      front.text.erase(0, n - pos);
      front.token_ids.clear();
      front.logprobs.clear();
      out.push_back(std::move(head));
    }
    break;
  }
  return out;
}

}  // namespace pd::server
