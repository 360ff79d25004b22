#include "puredrive/tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "puredrive/tokenizer/byte_level.h"
#include "puredrive/tokenizer/json_util.h"
#include "puredrive/tokenizer/regex.h"

namespace pd::tok {
namespace {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  Span span;
  bool flag;  // before the behaviour: "is a match"; after: "remove"
};

// HF's NormalizedString::split: matches and the gaps between them cover the piece; the behaviour
// decides what is kept and what is glued together.
std::vector<Segment> apply_behavior(std::vector<Segment> segs, SplitBehavior behavior) {
  std::vector<Segment> out;
  out.reserve(segs.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& s : segs) out.push_back({s.span, false});
      return out;
    case SplitBehavior::kRemoved:
      return segs;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& s : segs) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().span.second = s.span.second;
        } else {
          out.push_back({s.span, false});
        }
        previous_match = s.flag;
      }
      return out;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : segs) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().span.second = s.span.second;
        } else {
          out.push_back({s.span, false});
        }
        previous_match = s.flag;
      }
      return out;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().span.first = it->span.first;
        } else {
          out.push_back({it->span, false});
        }
        previous_match = it->flag;
      }
      std::reverse(out.begin(), out.end());
      return out;
    }
  }
  return out;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::shared_ptr<const Regex> regex, std::string literal, SplitBehavior behavior,
                    bool invert)
      : regex_(std::move(regex)), literal_(std::move(literal)), behavior_(behavior), invert_(invert) {}

  Status pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::string> result;
    result.reserve(pieces.size() * 4);
    std::vector<Span> matches;
    std::vector<Segment> segs;
    for (const auto& piece : pieces) {
      if (piece.empty()) continue;
      matches.clear();
      if (regex_) {
        PD_TRY(regex_->find_all(piece, matches));
      } else if (!literal_.empty()) {
        for (size_t p = piece.find(literal_); p != std::string::npos;
             p = piece.find(literal_, p + literal_.size())) {
          matches.emplace_back(p, p + literal_.size());
        }
      }
      segs.clear();
      size_t prev = 0;
      for (const auto& m : matches) {
        if (prev != m.first) segs.push_back({{prev, m.first}, invert_});
        segs.push_back({m, !invert_});
        prev = m.second;
      }
      if (prev != piece.size()) segs.push_back({{prev, piece.size()}, invert_});
      for (const auto& s : apply_behavior(std::move(segs), behavior_)) {
        if (!s.flag && s.span.second > s.span.first) {
          result.emplace_back(piece, s.span.first, s.span.second - s.span.first);
        }
      }
      segs = {};
    }
    pieces = std::move(result);
    return Status::ok();
  }

 private:
  std::shared_ptr<const Regex> regex_;
  std::string literal_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<SplitPreTokenizer> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}

  Status pre_tokenize(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (!p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
      }
    }
    if (split_) PD_TRY(split_->pre_tokenize(pieces));
    std::string mapped;
    size_t kept = 0;
    for (auto& p : pieces) {
      if (p.empty()) continue;
      mapped.clear();
      byte_level_encode(p, mapped);
      pieces[kept++].swap(mapped);
    }
    pieces.resize(kept);
    return Status::ok();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> split_;  // the GPT-2 regex when use_regex
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  Status pre_tokenize(std::vector<std::string>& pieces) const override {
    for (const auto& p : parts_) PD_TRY(p->pre_tokenize(pieces));
    return Status::ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Expected<SplitBehavior> parse_behavior(const nlohmann::json& j, const std::string& where) {
  PD_ASSIGN_OR_RETURN(std::string name, json_string(j, "behavior", where));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return make_error(ErrorCode::kCorrupt,
                    "{}.behavior: '{}' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                    "Contiguous",
                    where, name);
}

}  // namespace

Expected<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& j,
                                                            const std::string& where) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  PD_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type == "Split") {
    PD_ASSIGN_OR_RETURN(PatternSpec pattern, parse_pattern(j, where));
    PD_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(j, where));
    PD_ASSIGN_OR_RETURN(bool invert, json_bool(j, "invert", where, false));
    std::shared_ptr<const Regex> regex;
    if (pattern.is_regex) {
      auto compiled = Regex::compile(pattern.text);
      if (!compiled)
        return make_error(compiled.status().code(), "{}: {}", where, compiled.status().message());
      regex = *compiled;
    }
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(
        std::move(regex), pattern.is_regex ? std::string() : pattern.text, behavior, invert));
  }
  if (type == "ByteLevel") {
    PD_ASSIGN_OR_RETURN(bool add_prefix_space, json_bool(j, "add_prefix_space", where, true));
    PD_ASSIGN_OR_RETURN(bool use_regex, json_bool(j, "use_regex", where, true));
    std::unique_ptr<SplitPreTokenizer> split;
    if (use_regex) {
      PD_ASSIGN_OR_RETURN(auto regex, Regex::compile(kGpt2Pattern));
      split = std::make_unique<SplitPreTokenizer>(std::move(regex), std::string(), SplitBehavior::kIsolated,
                                                  false);
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, std::move(split)));
  }
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return make_error(ErrorCode::kCorrupt, "{}: Sequence without a 'pretokenizers' array", where);
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t k = 0; k < it->size(); ++k) {
      PD_ASSIGN_OR_RETURN(auto part,
                          parse_pre_tokenizer((*it)[k], fmt::format("{}.pretokenizers[{}]", where, k)));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  return make_error(ErrorCode::kUnsupported,
                    "{}: pre-tokenizer type '{}' is not supported (supported: Split, ByteLevel, Sequence)",
                    where, type);
}

}  // namespace pd::tok
