#include "puredrive/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "puredrive/tokenizer/json_util.h"
#include "puredrive/tokenizer/regex.h"
#include "puredrive/tokenizer/utf8.h"

namespace pd::tok {
namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(std::string name, int options) : name_(std::move(name)), options_(options) {}
  Status normalize(std::string& s) const override {
    bool ascii = true;
    for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    if (ascii) return Status::ok();  // every normalization form maps ASCII to itself
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                     static_cast<utf8proc_ssize_t>(s.size()), &dst, static_cast<utf8proc_option_t>(options_));
    if (n < 0) {
      return make_error(ErrorCode::kInvalidArgument, "{} normalization failed: {}", name_,
                        utf8proc_errmsg(n));
    }
    s.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
    return Status::ok();
  }

 private:
  std::string name_;
  int options_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status normalize(std::string& s) const override {
    size_t begin = 0;
    size_t end = s.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!is_white_space(next_code_point(s, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_white_space(next_code_point(s, i))) break;
        end = start;
      }
    }
    s = s.substr(begin, end - begin);
    return Status::ok();
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
    return Status::ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::shared_ptr<const Regex> regex, std::string literal, std::string content)
      : regex_(std::move(regex)), literal_(std::move(literal)), content_(std::move(content)) {}
  Status normalize(std::string& s) const override {
    std::vector<Span> spans;
    if (regex_) {
      PD_TRY(regex_->find_all(s, spans));
    } else if (!literal_.empty()) {
      for (size_t pos = s.find(literal_); pos != std::string::npos;
           pos = s.find(literal_, pos + literal_.size())) {
        spans.emplace_back(pos, pos + literal_.size());
      }
    }
    if (spans.empty()) return Status::ok();
    std::string out;
    size_t prev = 0;
    for (const auto& [b, e] : spans) {
      out.append(s, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
    return Status::ok();
  }

 private:
  std::shared_ptr<const Regex> regex_;
  std::string literal_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  Status normalize(std::string& s) const override {
    for (const auto& p : parts_) PD_TRY(p->normalize(s));
    return Status::ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

Expected<std::unique_ptr<Normalizer>> parse_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  PD_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type == "NFC")
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (type == "NFD") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  }
  if (type == "NFKC") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "Strip") {
    PD_ASSIGN_OR_RETURN(bool left, json_bool(j, "strip_left", where, true));
    PD_ASSIGN_OR_RETURN(bool right, json_bool(j, "strip_right", where, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Prepend") {
    PD_ASSIGN_OR_RETURN(std::string prefix, json_string(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    PD_ASSIGN_OR_RETURN(std::string content, json_string(j, "content", where));
    PD_ASSIGN_OR_RETURN(PatternSpec pattern, parse_pattern(j, where));
    std::shared_ptr<const Regex> regex;
    if (pattern.is_regex) {
      PD_ASSIGN_OR_RETURN(regex, Regex::compile(pattern.text));
    }
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(
        std::move(regex), pattern.is_regex ? std::string() : pattern.text, std::move(content)));
  }
  if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return make_error(ErrorCode::kCorrupt, "{}: Sequence without a 'normalizers' array", where);
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t k = 0; k < it->size(); ++k) {
      PD_ASSIGN_OR_RETURN(auto part, parse_normalizer((*it)[k], fmt::format("{}.normalizers[{}]", where, k)));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return make_error(
      ErrorCode::kUnsupported,
      "{}: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Strip, Prepend, "
      "Replace, Sequence)",
      where, type);
}

}  // namespace pd::tok
