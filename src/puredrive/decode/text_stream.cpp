#include "puredrive/decode/text_stream.h"

namespace pd {

TextStream::Piece TextStream::push(std::span<const int32_t> ids) {
  Piece piece;
  if (stops_.stopped()) {
    piece.stopped = true;
    return piece;
  }
  scratch_.clear();
  for (int32_t id : ids) detok_.push(id, scratch_);
  StopStringMatcher::Result r = stops_.feed(scratch_);
  piece.text = std::move(r.text);
  piece.stopped = r.stopped;
  return piece;
}

std::string TextStream::finish() {
  if (stops_.stopped()) return {};
  StopStringMatcher::Result r = stops_.feed(detok_.finish());
  if (r.stopped) return std::move(r.text);
  return r.text + stops_.flush();
}

}  // namespace pd
