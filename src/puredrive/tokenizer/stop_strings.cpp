#include "puredrive/tokenizer/stop_strings.h"

#include <algorithm>

namespace pd {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings) {
  for (size_t k = 0; k < stop_strings.size(); ++k) {
    if (stop_strings[k].empty()) continue;
    stops_.push_back(std::move(stop_strings[k]));
    indices_.push_back(k);
  }
}

StopStringMatcher::Result StopStringMatcher::feed(std::string_view text) {
  Result r;
  if (stopped_) return r;
  held_.append(text);

  // The stream stops where a stop string first completes; among stop strings completing at the same
  // byte, the longest (earliest starting) one is reported. Deciding by the end, not the start, makes
  // the result independent of how the text is chunked.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  size_t best = 0;
  for (size_t k = 0; k < stops_.size(); ++k) {
    const size_t pos = held_.find(stops_[k]);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stops_[k].size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
      best = k;
    }
  }
  if (best_pos != std::string::npos) {
    r.text = held_.substr(0, best_pos);
    r.stopped = true;
    r.stop_index = indices_[best];
    stopped_ = true;
    held_.clear();
    return r;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

void StopStringMatcher::reset() {
  held_.clear();
  stopped_ = false;
}

}  // namespace pd
