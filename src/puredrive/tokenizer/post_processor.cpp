#include "puredrive/tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

#include "puredrive/tokenizer/json_util.h"

namespace pd::tok {
namespace {

// ["<s>", 0] of RobertaProcessing / BertProcessing.
Expected<int32_t> token_pair_id(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
    return make_error(ErrorCode::kCorrupt, "{}.{}: expected [token, id]", where, key);
  }
  return (*it)[1].get<int32_t>();
}

Expected<SpecialTokenWrap> parse_template(const nlohmann::json& j, const std::string& where) {
  const auto single = j.find("single");
  if (single == j.end() || !single->is_array()) {
    return make_error(ErrorCode::kCorrupt, "{}.single: expected an array of template pieces", where);
  }
  const auto specials = j.find("special_tokens");
  SpecialTokenWrap wrap;
  bool seen_sequence = false;
  for (size_t k = 0; k < single->size(); ++k) {
    const auto& item = (*single)[k];
    const std::string item_where = fmt::format("{}.single[{}]", where, k);
    if (item.contains("Sequence")) {
      if (seen_sequence) {
        return make_error(ErrorCode::kUnsupported,
                          "{}: a template that repeats the sequence is not supported", item_where);
      }
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      return make_error(ErrorCode::kCorrupt, "{}: expected a Sequence or SpecialToken piece, found {}",
                        item_where, item.dump());
    }
    PD_ASSIGN_OR_RETURN(std::string name,
                        json_string(item.at("SpecialToken"), "id", item_where + ".SpecialToken"));
    if (specials == j.end() || !specials->is_object() || !specials->contains(name)) {
      return make_error(ErrorCode::kCorrupt, "{}: special token '{}' is not in {}.special_tokens", item_where,
                        name, where);
    }
    const auto& entry = specials->at(name);
    const auto ids_it = entry.is_object() ? entry.find("ids") : entry.end();
    if (ids_it == entry.end() || !ids_it->is_array()) {
      return make_error(ErrorCode::kCorrupt, "{}.special_tokens['{}'].ids: expected an array", where, name);
    }
    auto& dst = seen_sequence ? wrap.suffix : wrap.prefix;
    for (const auto& id : *ids_it) {
      if (!id.is_number_integer()) {
        return make_error(ErrorCode::kCorrupt, "{}.special_tokens['{}'].ids: expected integers", where, name);
      }
      dst.push_back(id.get<int32_t>());
    }
  }
  if (!seen_sequence) {
    return make_error(ErrorCode::kCorrupt, "{}.single: the template has no Sequence piece", where);
  }
  return wrap;
}

}  // namespace

Expected<SpecialTokenWrap> parse_post_processor(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return SpecialTokenWrap{};
  PD_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type == "ByteLevel") return SpecialTokenWrap{};
  if (type == "TemplateProcessing") return parse_template(j, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    PD_ASSIGN_OR_RETURN(int32_t cls, token_pair_id(j, "cls", where));
    PD_ASSIGN_OR_RETURN(int32_t sep, token_pair_id(j, "sep", where));
    return SpecialTokenWrap{{cls}, {sep}};
  }
  if (type == "Sequence") {
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return make_error(ErrorCode::kCorrupt, "{}: Sequence without a 'processors' array", where);
    }
    SpecialTokenWrap wrap;
    for (size_t k = 0; k < it->size(); ++k) {
      PD_ASSIGN_OR_RETURN(SpecialTokenWrap inner,
                          parse_post_processor((*it)[k], fmt::format("{}.processors[{}]", where, k)));
      // Each processor wraps the output of the previous one.
      inner.prefix.insert(inner.prefix.end(), wrap.prefix.begin(), wrap.prefix.end());
      wrap.suffix.insert(wrap.suffix.end(), inner.suffix.begin(), inner.suffix.end());
      wrap.prefix = std::move(inner.prefix);
    }
    return wrap;
  }
  return make_error(
      ErrorCode::kUnsupported,
      "{}: post-processor type '{}' is not supported (supported: ByteLevel, TemplateProcessing, "
      "RobertaProcessing, BertProcessing, Sequence)",
      where, type);
}

}  // namespace pd::tok
