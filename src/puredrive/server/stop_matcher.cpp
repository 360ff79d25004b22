#include "puredrive/server/stop_matcher.h"

namespace pd::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : text_(stops), stops_(std::move(stops)) {}

std::vector<GenerationOutput> StopMatcher::push(GenerationOutput output) {
  if (matched()) return {};
  const StopStringMatcher::Result r = text_.feed(output.text);
  pending_.push_back(std::move(output));
  auto out = release(r.text.size());
  if (r.stopped) {
    pending_.clear();
    matched_ = stops_[r.stop_index];
  }
  return out;
}

std::vector<GenerationOutput> StopMatcher::flush() {
  text_.flush();
  std::vector<GenerationOutput> out(std::make_move_iterator(pending_.begin()),
                                    std::make_move_iterator(pending_.end()));
  pending_.clear();
  return out;
}

std::vector<GenerationOutput> StopMatcher::release(size_t n) {
  std::vector<GenerationOutput> out;
  size_t pos = 0;
  while (!pending_.empty()) {
    GenerationOutput& front = pending_.front();
    const size_t len = front.text.size();
    if (pos + len <= n && !(len == 0 && pos == n && matched())) {
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
