#include "puredrive/tokenizer/tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "puredrive/tokenizer/added_vocabulary.h"
#include "puredrive/tokenizer/bpe.h"
#include "puredrive/tokenizer/byte_level.h"
#include "puredrive/tokenizer/flat_map.h"
#include "puredrive/tokenizer/json_util.h"
#include "puredrive/tokenizer/normalizer.h"
#include "puredrive/tokenizer/post_processor.h"
#include "puredrive/tokenizer/pre_tokenizer.h"
#include "puredrive/tokenizer/tokenizer_json.h"
#include "puredrive/tokenizer/utf8.h"
#include "puredrive/util/mapped_file.h"

namespace pd {
namespace tok {

struct ConfigToken {
  std::string content;
  std::optional<int32_t> id;
};

struct TokenizerState {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;
  SpecialTokenWrap wrap;

  std::unordered_map<int32_t, std::string> added_by_id;  // id -> content
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_by_content;
  int32_t id_limit = 0;
  size_t vocab_size = 0;
  std::vector<std::string> id_bytes;  // [id_limit] decoded bytes of each token
  std::vector<uint8_t> id_flags;      // [id_limit] kKnown | kSpecial
  static constexpr uint8_t kKnown = 1, kSpecial = 2;

  ConfigToken eos, bos, pad, unk;
  bool add_bos_token = false;
  bool add_eos_token = false;
  std::map<std::string, std::string> chat_templates;

  std::optional<int32_t> token_to_id(std::string_view token) const {
    const auto it = added_by_content.find(token);
    if (it != added_by_content.end()) return it->second;
    return model->token_to_id(token);
  }
  std::optional<std::string_view> id_to_token(int32_t id) const {
    const auto it = added_by_id.find(id);
    if (it != added_by_id.end()) return std::string_view(it->second);
    return model->id_to_token(id);
  }
};

namespace {

Expected<nlohmann::json> parse_json(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kCorrupt, "{}: not valid JSON: {}", source, e.what());
  }
}

Expected<std::vector<AddedToken>> parse_added_tokens(const nlohmann::json& root, const std::string& source) {
  std::vector<AddedToken> tokens;
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) return make_error(ErrorCode::kCorrupt, "{}: added_tokens: expected an array", source);
  for (size_t k = 0; k < it->size(); ++k) {
    const auto& j = (*it)[k];
    const std::string where = fmt::format("{}: added_tokens[{}]", source, k);
    AddedToken t;
    PD_ASSIGN_OR_RETURN(t.content, json_string(j, "content", where));
    const auto id = j.find("id");
    if (id == j.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > INT32_MAX) {
      return make_error(ErrorCode::kCorrupt, "{}.id: expected a non-negative 32-bit integer", where);
    }
    t.id = id->get<int32_t>();
    PD_ASSIGN_OR_RETURN(t.special, json_bool(j, "special", where, false));
    PD_ASSIGN_OR_RETURN(t.single_word, json_bool(j, "single_word", where, false));
    PD_ASSIGN_OR_RETURN(t.lstrip, json_bool(j, "lstrip", where, false));
    PD_ASSIGN_OR_RETURN(t.rstrip, json_bool(j, "rstrip", where, false));
    PD_ASSIGN_OR_RETURN(t.normalized, json_bool(j, "normalized", where, !t.special));
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    tokens.push_back(std::move(t));
  }
  return tokens;
}

Status check_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) {
    return make_error(ErrorCode::kUnsupported, "{}: a null decoder is not supported (supported: ByteLevel)",
                      where);
  }
  PD_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type != "ByteLevel") {
    return make_error(ErrorCode::kUnsupported,
                      "{}: decoder type '{}' is not supported (supported: ByteLevel)", where, type);
  }
  return Status::ok();
}

// eos_token & co: a string, null, or an AddedToken object {"content": ...}.
Expected<ConfigToken> parse_config_token(const nlohmann::json& config, const char* key,
                                         const TokenizerState& st, const std::string& source) {
  ConfigToken t;
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return t;
  if (it->is_string()) {
    t.content = it->get<std::string>();
  } else if (it->is_object()) {
    PD_ASSIGN_OR_RETURN(t.content, json_string(*it, "content", fmt::format("{}: {}", source, key)));
  } else {
    return make_error(ErrorCode::kCorrupt,
                      "{}: {}: expected a string, null or an AddedToken object, found {}", source, key,
                      it->type_name());
  }
  t.id = st.token_to_id(t.content);
  if (!t.id) {
    return make_error(ErrorCode::kCorrupt, "{}: {} '{}' is not in the tokenizer's vocabulary", source, key,
                      t.content);
  }
  return t;
}

Status parse_config(const nlohmann::json& config, TokenizerState& st, const std::string& source) {
  if (!config.is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: expected a JSON object, found {}", source,
                      config.type_name());
  }
  PD_ASSIGN_OR_RETURN(st.eos, parse_config_token(config, "eos_token", st, source));
  PD_ASSIGN_OR_RETURN(st.bos, parse_config_token(config, "bos_token", st, source));
  PD_ASSIGN_OR_RETURN(st.pad, parse_config_token(config, "pad_token", st, source));
  PD_ASSIGN_OR_RETURN(st.unk, parse_config_token(config, "unk_token", st, source));
  PD_ASSIGN_OR_RETURN(st.add_bos_token, json_bool(config, "add_bos_token", source, false));
  PD_ASSIGN_OR_RETURN(st.add_eos_token, json_bool(config, "add_eos_token", source, false));
  const auto ct = config.find("chat_template");
  if (ct == config.end() || ct->is_null()) return Status::ok();
  if (ct->is_string()) {
    st.chat_templates["default"] = ct->get<std::string>();
  } else if (ct->is_array()) {
    for (size_t k = 0; k < ct->size(); ++k) {
      const std::string where = fmt::format("{}: chat_template[{}]", source, k);
      PD_ASSIGN_OR_RETURN(std::string name, json_string((*ct)[k], "name", where));
      PD_ASSIGN_OR_RETURN(std::string text, json_string((*ct)[k], "template", where));
      st.chat_templates[name] = std::move(text);
    }
  } else {
    return make_error(ErrorCode::kCorrupt,
                      "{}: chat_template: expected a string or a list of {{name, template}}, found {}",
                      source, ct->type_name());
  }
  return Status::ok();
}

Expected<std::shared_ptr<TokenizerState>> build_state(const TokenizerJson& file, const std::string& source) {
  const nlohmann::json& root = file.root;
  if (!root.is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: expected a JSON object, found {}", source, root.type_name());
  }
  auto st = std::make_shared<TokenizerState>();
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: missing the 'model' object", source);
  }
  PD_ASSIGN_OR_RETURN(std::string model_type, json_string(*model, "type", source + ": model"));
  if (model_type != "BPE") {
    return make_error(ErrorCode::kUnsupported, "{}: model type '{}' is not supported (supported: BPE)",
                      source, model_type);
  }
  PD_ASSIGN_OR_RETURN(st->model, BpeModel::from_json(file, source + ": model"));
  const nlohmann::json null_json;
  auto field = [&](const char* key) -> const nlohmann::json& {
    const auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  PD_ASSIGN_OR_RETURN(st->normalizer, parse_normalizer(field("normalizer"), source + ": normalizer"));
  PD_ASSIGN_OR_RETURN(st->pre_tokenizer,
                      parse_pre_tokenizer(field("pre_tokenizer"), source + ": pre_tokenizer"));
  PD_ASSIGN_OR_RETURN(st->wrap, parse_post_processor(field("post_processor"), source + ": post_processor"));
  PD_TRY(check_decoder(field("decoder"), source + ": decoder"));
  // truncation / padding only matter for batched training inputs; an inference engine never applies them.

  PD_ASSIGN_OR_RETURN(auto added, parse_added_tokens(root, source));
  for (auto& t : added) {
    // As in HF, a token already in the model vocabulary keeps the model's id.
    if (auto id = st->model->token_to_id(t.content)) t.id = *id;
    if (st->added_by_content.count(t.content) == 0) st->added_by_content.emplace(t.content, t.id);
    st->added_by_id[t.id] = t.content;
  }
  st->added.build(std::move(added), st->normalizer.get());

  std::unordered_set<std::string> special_contents;
  for (const auto& t : st->added.tokens()) {
    if (t.special) special_contents.insert(t.content);
  }
  int32_t max_id = st->model->max_id();
  size_t extra = 0;
  for (const auto& [content, id] : st->added_by_content) {
    max_id = std::max(max_id, id);
    if (!st->model->token_to_id(content)) ++extra;
  }
  st->vocab_size = st->model->vocab_size() + extra;
  st->id_limit = max_id + 1;
  st->id_bytes.resize(static_cast<size_t>(st->id_limit));
  st->id_flags.assign(static_cast<size_t>(st->id_limit), 0);
  for (int32_t id = 0; id < st->id_limit; ++id) {
    const auto token = st->id_to_token(id);
    if (!token) continue;
    st->id_flags[id] = TokenizerState::kKnown;
    if (special_contents.count(std::string(*token)) != 0) st->id_flags[id] |= TokenizerState::kSpecial;
    tok::byte_level_decode_token(*token, st->id_bytes[id]);
  }
  return st;
}

}  // namespace
}  // namespace tok

Expected<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                         std::string_view tokenizer_config_json, const std::string& source) {
  PD_ASSIGN_OR_RETURN(tok::TokenizerJson file, tok::parse_tokenizer_json(tokenizer_json, source));
  PD_ASSIGN_OR_RETURN(auto st, tok::build_state(file, source));
  if (!tokenizer_config_json.empty()) {
    const std::string config_source = "tokenizer_config.json";
    PD_ASSIGN_OR_RETURN(nlohmann::json config, tok::parse_json(tokenizer_config_json, config_source));
    PD_TRY(tok::parse_config(config, *st, config_source));
  }
  return Tokenizer(std::move(st));
}

Expected<Tokenizer> Tokenizer::load_files(const std::string& tokenizer_json_path,
                                          const std::string& tokenizer_config_path,
                                          const std::string& chat_template_path) {
  PD_ASSIGN_OR_RETURN(auto file, MappedFile::open(tokenizer_json_path));
  const std::string_view text(reinterpret_cast<const char*>(file->data()), file->size());
  PD_ASSIGN_OR_RETURN(tok::TokenizerJson parsed, tok::parse_tokenizer_json(text, tokenizer_json_path));
  PD_ASSIGN_OR_RETURN(auto st, tok::build_state(parsed, tokenizer_json_path));
  if (!tokenizer_config_path.empty()) {
    PD_ASSIGN_OR_RETURN(std::string config_text, read_text_file(tokenizer_config_path));
    PD_ASSIGN_OR_RETURN(nlohmann::json config, tok::parse_json(config_text, tokenizer_config_path));
    PD_TRY(tok::parse_config(config, *st, tokenizer_config_path));
  }
  if (!chat_template_path.empty()) {
    PD_ASSIGN_OR_RETURN(std::string tmpl, read_text_file(chat_template_path));
    st->chat_templates["default"] = std::move(tmpl);
  }
  return Tokenizer(std::move(st));
}

Expected<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path json = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(json, ec)) {
    return make_error(ErrorCode::kNotFound, "{}: no tokenizer.json in this directory", model_dir);
  }
  const fs::path config = dir / "tokenizer_config.json";
  const fs::path tmpl = dir / "chat_template.jinja";
  return load_files(json.string(), fs::is_regular_file(config, ec) ? config.string() : std::string(),
                    fs::is_regular_file(tmpl, ec) ? tmpl.string() : std::string());
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const tok::TokenizerState& st = *state_;
  if (const size_t bad = tok::find_invalid_utf8(text); bad != std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument,
                      "encode: the text is not valid UTF-8 (byte 0x{:02X} at offset {} of {})",
                      static_cast<unsigned>(static_cast<unsigned char>(text[bad])), bad, text.size());
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids.insert(ids.end(), st.wrap.prefix.begin(), st.wrap.prefix.end());

  std::vector<tok::TextPiece> raw_pieces;
  std::vector<tok::TextPiece> norm_pieces;
  std::vector<std::string> words;
  std::string normalized;
  st.added.split(text, /*normalized_stage=*/false, raw_pieces);
  for (const auto& raw : raw_pieces) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    if (raw.end <= raw.begin) continue;
    normalized.assign(text.substr(raw.begin, raw.end - raw.begin));
    if (st.normalizer) PD_TRY(st.normalizer->normalize(normalized));
    norm_pieces.clear();
    st.added.split(normalized, /*normalized_stage=*/true, norm_pieces);
    for (const auto& piece : norm_pieces) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      if (piece.end <= piece.begin) continue;
      words.clear();
      words.emplace_back(normalized, piece.begin, piece.end - piece.begin);
      if (st.pre_tokenizer) PD_TRY(st.pre_tokenizer->pre_tokenize(words));
      for (const auto& w : words) st.model->tokenize(w, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), st.wrap.suffix.begin(), st.wrap.suffix.end());
  return ids;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const auto& st = *state_;
  if (id < 0 || id >= st.id_limit) return {};
  return st.id_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const auto& st = *state_;
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= st.id_limit) continue;
    const uint8_t flags = st.id_flags[id];
    if ((flags & tok::TokenizerState::kKnown) == 0) continue;
    if (skip_special_tokens && (flags & tok::TokenizerState::kSpecial) != 0) continue;
    bytes += st.id_bytes[id];
  }
  return tok::lossy_utf8(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return state_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const auto t = state_->id_to_token(id);
  if (!t) return std::nullopt;
  return std::string(*t);
}

size_t Tokenizer::vocab_size() const {
  return state_->vocab_size;
}
int32_t Tokenizer::id_limit() const {
  return state_->id_limit;
}

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= state_->id_limit) return false;
  return (state_->id_flags[id] & tok::TokenizerState::kSpecial) != 0;
}

std::optional<int32_t> Tokenizer::eos_token_id() const {
  return state_->eos.id;
}
std::optional<int32_t> Tokenizer::bos_token_id() const {
  return state_->bos.id;
}
std::optional<int32_t> Tokenizer::pad_token_id() const {
  return state_->pad.id;
}
std::optional<int32_t> Tokenizer::unk_token_id() const {
  return state_->unk.id;
}
const std::string& Tokenizer::eos_token() const {
  return state_->eos.content;
}
const std::string& Tokenizer::bos_token() const {
  return state_->bos.content;
}
const std::string& Tokenizer::pad_token() const {
  return state_->pad.content;
}
bool Tokenizer::add_bos_token() const {
  return state_->add_bos_token;
}
bool Tokenizer::add_eos_token() const {
  return state_->add_eos_token;
}

const std::map<std::string, std::string>& Tokenizer::chat_templates() const {
  return state_->chat_templates;
}

const std::string* Tokenizer::chat_template(const std::string& name) const {
  const auto it = state_->chat_templates.find(name);
  return it == state_->chat_templates.end() ? nullptr : &it->second;
}

}  // namespace pd
