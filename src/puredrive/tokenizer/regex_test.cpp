#include "puredrive/tokenizer/regex.h"

#include <gtest/gtest.h>

#include "puredrive/tokenizer/test_data.h"

namespace pd::tok {
namespace {

// Expected matches: Oniguruma inside HF tokenizers (a Split pre-tokenizer that keeps only the
// matches), on the places where PCRE2 would differ without translation: \s and U+0085, \w, \d, \h,
// categories of code points newer than PCRE2's Unicode tables, (?i), ^/$ at line ends, '.' and '\r'.
TEST(Regex, MatchesOniguruma) {
  const auto cases = testing::read_json(testing::reference_dir() + "/regex_reference.json");
  ASSERT_GT(cases.size(), 10u);
  for (const auto& c : cases) {
    const std::string pattern = c["pattern"].get<std::string>();
    const std::string text = c["text"].get<std::string>();
    if (pattern == "(?i)straße") continue;  // multi-character case folding: see KnownLimitations
    auto re = Regex::compile(pattern);
    ASSERT_TRUE(re.has_value()) << pattern << ": " << re.status().to_string();
    std::vector<Span> spans;
    ASSERT_TRUE((*re)->find_all(text, spans).is_ok());
    std::vector<std::string> got;
    for (const auto& [b, e] : spans) {
      if (e > b) got.push_back(text.substr(b, e - b));
    }
    EXPECT_EQ(got, c["matches"].get<std::vector<std::string>>()) << "pattern " << pattern;
  }
}

TEST(Regex, KnownLimitations) {
  // Oniguruma folds 'ß' to "ss" under (?i); PCRE2 folds one character to one character. No pattern
  // of the supported checkpoints has a character with a multi-character folding.
  auto re = Regex::compile("(?i)straße");
  ASSERT_TRUE(re.has_value());
  std::vector<Span> spans;
  ASSERT_TRUE((*re)->find_all("STRASSE Straße", spans).is_ok());
  EXPECT_EQ(spans.size(), 1u);
}

TEST(Regex, EmptyMatchesFollowOnigurumaIteration) {
  auto re = Regex::compile("x*");
  ASSERT_TRUE(re.has_value());
  std::vector<Span> spans;
  ASSERT_TRUE((*re)->find_all("axxbx", spans).is_ok());
  // An empty match right where the previous match ended is skipped (onig crate's find_iter).
  EXPECT_EQ(spans, (std::vector<Span>{{0, 0}, {1, 3}, {4, 5}}));
}

TEST(Regex, RejectsConstructsItCannotTranslate) {
  for (const char* p : {"\\bword\\b", "[a-z&&[^aeiou]]", "[[abc]]", "[^\\W]", "[^\\D]"}) {
    auto re = Regex::compile(p);
    ASSERT_FALSE(re.has_value()) << p;
    EXPECT_EQ(re.status().code(), ErrorCode::kUnsupported) << p;
    EXPECT_NE(re.status().message().find(p), std::string::npos) << re.status().message();
  }
  auto bad = Regex::compile("(unclosed");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

TEST(Regex, WordAndSpaceClassesForAddedTokens) {
  // Rust regex's \w (single_word): letters, marks, decimal digits, '_', joiners; not '²' or '-'.
  EXPECT_TRUE(is_word_char('a'));
  EXPECT_TRUE(is_word_char('_'));
  EXPECT_TRUE(is_word_char(0x0301));
  EXPECT_TRUE(is_word_char(0x200D));
  EXPECT_TRUE(is_word_char(0x0663));
  EXPECT_TRUE(is_word_char(0x1E4D0));  // Unicode 16 letter
  EXPECT_FALSE(is_word_char(0x00B2));
  EXPECT_FALSE(is_word_char('-'));
  EXPECT_FALSE(is_word_char(' '));
  EXPECT_TRUE(is_white_space(0x85));
  EXPECT_TRUE(is_white_space(0x3000));
  EXPECT_FALSE(is_white_space(0x200B));
  EXPECT_FALSE(is_white_space(0xFEFF));
}

}  // namespace
}  // namespace pd::tok
