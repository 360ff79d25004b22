// puredrive tokenize: encode text to ids or decode ids to text with a model's tokenizer.json, for
// checking the tokenizer against other implementations from the shell.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "puredrive/tokenizer/tokenizer.h"
#include "puredrive/util/mapped_file.h"

namespace pd::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  std::string file;
  std::string decode;
  bool json = false;
  bool no_special = false;
  bool skip_special = false;
  bool decoding = false;  // --decode given
};

[[noreturn]] void fail(const std::string& message) {
  fmt::print(stderr, "puredrive tokenize: {}\n", message);
  throw CLI::RuntimeError(1);
}

Expected<Tokenizer> load_tokenizer(const std::string& path) {
  // --model may name tokenizer.json itself or any directory holding it.
  if (std::filesystem::is_regular_file(path)) return Tokenizer::load_files(path);
  return Tokenizer::load(path);
}

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find_first_of(", ", pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      fail(fmt::format("--decode: '{}' is not a token id", item));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void run_tokenize(const TokenizeArgs& a) {
  auto tok = load_tokenizer(a.model);
  if (!tok) fail(tok.status().message());

  if (a.decoding) {
    const std::string text = tok->decode(parse_ids(a.decode), a.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);  // exactly the text: no newline added
    return;
  }

  std::string text = a.text;
  if (!a.file.empty()) {
    auto contents = read_text_file(a.file);
    if (!contents) fail(contents.status().message());
    text = std::move(*contents);
  }
  auto ids = tok->encode(text, !a.no_special);
  if (!ids) fail(ids.status().message());
  if (a.json) {
    nlohmann::json out;
    out["ids"] = *ids;
    nlohmann::json tokens = nlohmann::json::array();
    for (const int32_t id : *ids) tokens.push_back(tok->id_to_token(id).value_or(""));
    out["tokens"] = std::move(tokens);
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("{}\n", fmt::join(*ids, " "));
  }
}

void setup_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  cmd->add_option("--model", args->model,
                  "Model directory (tokenizer.json, tokenizer_config.json) or tokenizer.json")
      ->required();
  auto* text = cmd->add_option("--text", args->text, "Text to encode");
  auto* file = cmd->add_option("--file", args->file, "File whose contents to encode");
  auto* decode =
      cmd->add_option("--decode", args->decode, "Comma-separated ids to decode; prints the text as is");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  cmd->add_flag("--json", args->json,
                "Print {\"ids\": [...], \"tokens\": [...]} instead of space-separated ids");
  cmd->add_flag("--no-special", args->no_special, "Encode without the post-processor's special tokens");
  cmd->add_flag("--skip-special", args->skip_special, "Decode without special tokens");
  cmd->callback([args, text, file, decode] {
    if (text->count() == 0 && file->count() == 0 && decode->count() == 0) {
      fail("one of --text, --file or --decode is required");
    }
    args->decoding = decode->count() > 0;
    run_tokenize(*args);
  });
}

const bool registered = register_command(setup_tokenize);

}  // namespace
}  // namespace pd::cli
