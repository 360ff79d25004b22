#include "puredrive/tokenizer/stop_strings.h"

#include <gtest/gtest.h>

#include <random>

#include "puredrive/tokenizer/utf8.h"

namespace pd {
namespace {

struct Outcome {
  std::string text;
  bool stopped = false;
  size_t stop_index = 0;
  bool operator==(const Outcome&) const = default;
};

// Naive reference: scan the stream byte by byte; the first byte at which some stop string ends stops
// it; at that byte the longest such stop string is the match.
Outcome naive(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < stops.size(); ++k) {
      const auto& s = stops[k];
      if (s.empty() || s.size() > end || text.compare(end - s.size(), s.size(), s) != 0) continue;
      if (best == SIZE_MAX || s.size() > stops[best].size()) best = k;
    }
    if (best != SIZE_MAX) return {text.substr(0, end - stops[best].size()), true, best};
  }
  return {text, false, 0};
}

// Feeds `chunks`, checking after each that what was released is a prefix of the final text and that
// only a possible stop-string prefix is held back.
Outcome run(const std::vector<std::string>& chunks, const std::vector<std::string>& stops) {
  StopStringMatcher m(stops);
  Outcome out;
  bool valid_chunks = true;
  for (const auto& c : chunks)
    valid_chunks = valid_chunks && tok::find_invalid_utf8(c) == std::string_view::npos;
  for (const auto& c : chunks) {
    auto r = m.feed(c);
    out.text += r.text;
    // Whole characters in, whole characters out: held-back text starts at a character boundary.
    if (valid_chunks) {
      EXPECT_EQ(tok::find_invalid_utf8(r.text), std::string_view::npos);
    }
    if (r.stopped) {
      out.stopped = true;
      out.stop_index = r.stop_index;
      EXPECT_TRUE(m.stopped());
      EXPECT_TRUE(m.feed("more").text.empty());
      return out;
    }
  }
  out.text += m.flush();
  return out;
}

const std::vector<std::vector<std::string>> kStopSets = {
    {"<|im_end|>"},  {"\n\n", "END"}, {"b", "abc"},
    {"abab", "bab"}, {"aaa"},         {"</tool_call>", "<tool_call>", "</"},
    {"🙂", "é!"},  {"", "x"},
};

const std::vector<std::string> kTexts = {
    "",
    "hello world",
    "hello<|im_end|>tail",
    "<|im_end|>",
    "partial <|im_en",
    "<|im_<|im_end|>",
    "para one\n\npara two",
    "the END is near END",
    "xxabc",
    "abc",
    "ababab",
    "aabababx",
    "aaaa",
    "aa",
    "call </tool_call> done",
    "<tool_call>{\"a\":1}</tool_call>",
    "smile 🙂 now",
    "caf\xC3\xA9! ok",
    "🙃🙂",
    "no stop here at all é",
};

TEST(StopStringMatcher, EverySplitPointMatchesNaiveScan) {
  for (const auto& stops : kStopSets) {
    for (const auto& text : kTexts) {
      const Outcome expected = naive(text, stops);
      ASSERT_EQ(run({text}, stops), expected) << "text '" << text << "'";
      for (size_t split = 0; split <= text.size(); ++split) {
        // Two chunks; split points inside a character are fine here since the bytes are only compared.
        const Outcome got = run({text.substr(0, split), text.substr(split)}, stops);
        ASSERT_EQ(got.text, expected.text) << "text '" << text << "' split " << split;
        ASSERT_EQ(got.stopped, expected.stopped) << "text '" << text << "' split " << split;
        ASSERT_EQ(got.stop_index, expected.stop_index) << "text '" << text << "' split " << split;
      }
      std::vector<std::string> bytes;
      for (const char c : text) bytes.emplace_back(1, c);
      ASSERT_EQ(run(bytes, stops), expected) << "byte by byte: '" << text << "'";
    }
  }
}

TEST(StopStringMatcher, RandomChunkingsMatchNaiveScan) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab<|im_end>\n";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    const auto& stops = kStopSets[rng() % kStopSets.size()];
    std::vector<std::string> chunks;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t len = 1 + rng() % 5;
      chunks.push_back(text.substr(pos, len));
      pos += len;
    }
    ASSERT_EQ(run(chunks, stops), naive(text, stops)) << "text '" << text << "'";
  }
}

TEST(StopStringMatcher, HoldsBackOnlyPossibleStopPrefixes) {
  StopStringMatcher m({"<|im_end|>"});
  auto r = m.feed("Hello <|im");
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_EQ(m.held_bytes(), 4u);
  r = m.feed("_start");  // not a stop after all: released
  EXPECT_EQ(r.text, "<|im_start");
  EXPECT_EQ(m.held_bytes(), 0u);
  r = m.feed("|><|im_end|>ignored");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "|>");
  EXPECT_EQ(m.flush(), "");
  m.reset();
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.feed("ok <").text, "ok ");
  EXPECT_EQ(m.flush(), "<");
}

}  // namespace
}  // namespace pd
