// StopStringMatcher: watches streamed text for stop strings. Text that could be the beginning of a
// stop string is held back until it is known not to be, so a client never sees part of a stop
// string; when one occurs, the text before it is released and the match is reported. The stream stops
// where a stop string first completes (among several completing at the same byte, the longest), so the
// outcome does not depend on how the text was chunked. Stop strings must be valid UTF-8; held-back
// text then always starts at a character boundary.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pd {

class StopStringMatcher {
 public:
  // Empty stop strings are ignored.
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  struct Result {
    std::string text;       // safe to emit now
    bool stopped = false;   // a stop string was found; `text` is everything before it
    size_t stop_index = 0;  // index into the constructor's list when stopped
  };

  // Appends newly decoded text. Once stopped, further calls return empty results.
  Result feed(std::string_view text);
  // End of generation without a stop: releases the held-back text.
  std::string flush();

  bool stopped() const { return stopped_; }
  size_t held_bytes() const { return held_.size(); }
  void reset();

 private:
  std::vector<std::string> stops_;
  std::vector<size_t> indices_;  // position of each kept stop string in the constructor's list
  std::string held_;
  bool stopped_ = false;
};

}  // namespace pd
