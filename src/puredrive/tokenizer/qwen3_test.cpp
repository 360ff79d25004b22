// The Qwen3 tokenizer (151K byte-level BPE) against Python tokenizers on the committed corpus
// (tests/tokenizer/qwen3_*.json*, written by tools/reference/tokenizer/make_reference.py).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "puredrive/tokenizer/detokenizer.h"
#include "puredrive/tokenizer/test_data.h"
#include "puredrive/tokenizer/tokenizer.h"
#include "puredrive/tokenizer/utf8.h"

namespace pd {
namespace {

using tok::testing::ids_of;

const std::vector<nlohmann::json>& corpus() {
  static const auto c = tok::testing::read_jsonl(tok::testing::reference_dir() + "/qwen3_reference.jsonl");
  return c;
}

std::string show(const std::vector<int32_t>& ids) {
  return fmt::format("[{}]", fmt::join(ids, ", "));
}

TEST(Qwen3, LoadsFast) {
  const auto t0 = std::chrono::steady_clock::now();
  auto t = Tokenizer::load(tok::testing::qwen3_dir());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
  // Informational (not gated: sanitizer builds are much slower).
  std::printf("[ info ] Qwen3 tokenizer.json loaded in %.3f s\n", s);
}

TEST(Qwen3, EncodeMatchesPythonOnCorpus) {
  PD_REQUIRE_QWEN3(t);
  ASSERT_GE(corpus().size(), 3000u);
  int failures = 0;
  for (const auto& c : corpus()) {
    const std::string text = c["text"].get<std::string>();
    auto ids = t->encode(text, true);
    ASSERT_TRUE(ids.has_value()) << ids.status().to_string();
    const auto expected = ids_of(c["ids"]);
    if (*ids != expected && ++failures <= 10) {
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << "\n  got      " << show(*ids)
                    << "\n  expected " << show(expected);
    }
    // Qwen's post-processor adds nothing.
    auto plain = t->encode(text, false);
    ASSERT_TRUE(plain.has_value());
    if (*plain != expected && ++failures <= 10) ADD_FAILURE() << "add_special_tokens=false differs";
  }
  EXPECT_EQ(failures, 0);
}

TEST(Qwen3, DecodeMatchesPythonOnCorpus) {
  PD_REQUIRE_QWEN3(t);
  for (const auto& c : corpus()) {
    const auto ids = ids_of(c["ids"]);
    // decode(encode(s)) == s, except where NFC changed s: then Python's decode.
    const std::string decoded = c.value("decoded", c["text"].get<std::string>());
    ASSERT_EQ(t->decode(ids, false), decoded) << nlohmann::json(c["text"]).dump();
    ASSERT_EQ(t->decode(ids, true), c.value("decoded_skip", decoded)) << nlohmann::json(c["text"]).dump();
  }
}

// Fed one token at a time, the detokenizer emits exactly decode()'s text, and never an incomplete or
// invalid UTF-8 sequence.
void expect_streaming_matches(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special,
                              const std::string& expected) {
  StreamingDetokenizer detok(t, skip_special);
  std::string streamed;
  std::string piece;
  for (const int32_t id : ids) {
    piece.clear();
    detok.push(id, piece);
    ASSERT_EQ(tok::find_invalid_utf8(piece), std::string_view::npos);
    streamed += piece;
  }
  const std::string tail = detok.finish();
  ASSERT_EQ(tok::find_invalid_utf8(tail), std::string_view::npos);
  streamed += tail;
  ASSERT_EQ(streamed, expected) << "ids " << show(ids);
  EXPECT_EQ(detok.pending_bytes(), 0u);
}

TEST(Qwen3, StreamingDetokenizerMatchesDecodeOnCorpus) {
  PD_REQUIRE_QWEN3(t);
  for (const auto& c : corpus()) {
    const auto ids = ids_of(c["ids"]);
    const std::string decoded = c.value("decoded", c["text"].get<std::string>());
    expect_streaming_matches(*t, ids, false, decoded);
    expect_streaming_matches(*t, ids, true, c.value("decoded_skip", decoded));
  }
}

// Random ids, byte tokens out of order, encodings cut mid-character: Python decode text (with U+FFFD).
TEST(Qwen3, DecodeAndStreamingMatchPythonOnBrokenSequences) {
  PD_REQUIRE_QWEN3(t);
  const auto cases =
      tok::testing::read_jsonl(tok::testing::reference_dir() + "/qwen3_decode_reference.jsonl");
  ASSERT_GE(cases.size(), 400u);
  for (const auto& c : cases) {
    const auto ids = ids_of(c["ids"]);
    ASSERT_EQ(t->decode(ids, false), c["text"].get<std::string>()) << "ids " << show(ids);
    ASSERT_EQ(t->decode(ids, true), c["text_skip"].get<std::string>()) << "ids " << show(ids);
    expect_streaming_matches(*t, ids, false, c["text"].get<std::string>());
    expect_streaming_matches(*t, ids, true, c["text_skip"].get<std::string>());
  }
}

TEST(Qwen3, VocabularyAndSpecialTokensMatchPython) {
  PD_REQUIRE_QWEN3(t);
  const auto meta = tok::testing::read_json(tok::testing::reference_dir() + "/qwen3_meta.json");
  EXPECT_EQ(t->vocab_size(), meta["vocab_size"].get<size_t>());
  EXPECT_EQ(t->eos_token_id(), meta["eos_token_id"].get<int32_t>());
  EXPECT_EQ(t->pad_token_id(), meta["pad_token_id"].get<int32_t>());
  EXPECT_EQ(t->bos_token_id().has_value(), !meta["bos_token_id"].is_null());
  EXPECT_EQ(t->eos_token(), "<|im_end|>");
  for (const auto& id : meta["special_ids"]) EXPECT_TRUE(t->is_special(id.get<int32_t>())) << id;
  EXPECT_FALSE(t->is_special(*t->token_to_id("<think>")));  // added but not special
  for (const auto& [id, token] : meta["id_to_token"].items()) {
    const auto got = t->id_to_token(std::stoi(id));
    if (token.is_null()) {
      EXPECT_FALSE(got.has_value()) << id;
    } else {
      EXPECT_EQ(got, token.get<std::string>()) << id;
    }
  }
  for (const auto& [token, id] : meta["token_to_id"].items())
    EXPECT_EQ(t->token_to_id(token), id.get<int32_t>());
  EXPECT_FALSE(t->token_to_id("not a token at all").has_value());
}

TEST(Qwen3, ExposesTheChatTemplateFromTokenizerConfig) {
  PD_REQUIRE_QWEN3(t);
  const auto config = tok::testing::read_json(tok::testing::qwen3_dir() + "/tokenizer_config.json");
  const std::string* tmpl = t->chat_template();
  ASSERT_NE(tmpl, nullptr);
  EXPECT_EQ(*tmpl, config["chat_template"].get<std::string>());
  EXPECT_EQ(t->chat_template("tool_use"), nullptr);
}

TEST(Qwen3, EncodesConcurrentlyFromSeveralThreads) {
  PD_REQUIRE_QWEN3(t);
  const auto& c = corpus();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = static_cast<size_t>(k); i < c.size(); i += 3) {
        auto ids = t->encode(c[i]["text"].get<std::string>(), true);
        if (!ids || *ids != ids_of(c[i]["ids"])) ++failures[k];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(failures[k], 0) << "thread " << k;
}

TEST(Qwen3, RejectsInvalidUtf8) {
  PD_REQUIRE_QWEN3(t);
  for (const std::string& bad : {std::string("\xff"), std::string("ok \xc3"), std::string("a\xed\xa0\x80z"),
                                 std::string("\xc0\xaf"), std::string("x\xf4\x90\x80\x80")}) {
    auto ids = t->encode(bad, true);
    ASSERT_FALSE(ids.has_value());
    EXPECT_EQ(ids.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos) << ids.status().message();
  }
}

}  // namespace
}  // namespace pd
