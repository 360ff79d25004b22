#include "puredrive/tokenizer/tokenizer_json.h"

namespace pd::tok {
namespace {

using json = nlohmann::json;

// Builds the DOM like nlohmann's own SAX-DOM parser, except for the two big containers of "model".
class TokenizerJsonSax {
 public:
  TokenizerJsonSax(TokenizerJson& out, const std::string& source) : out_(out), source_(source) {}

  bool null() { return value(json()); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == Mode::kVocab) return vocab_value(v);
    return value(json(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab) {
      return vocab_value(v > static_cast<json::number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    }
    return value(json(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(json(v)); }
  bool binary(json::binary_t&) { return fail("unexpected binary value"); }

  bool string(json::string_t& v) {
    switch (mode_) {
      case Mode::kMerges: {
        // Legacy "a b" form: tokens of byte-level vocabularies never contain a space.
        const size_t space = v.find(' ');
        if (space == std::string::npos) {
          return fail(fmt::format("model.merges[{}]: '{}' is not of the form 'a b'", out_.merges.size(), v));
        }
        out_.merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        pair_.push_back(std::move(v));
        return true;
      case Mode::kVocab:
        return fail(fmt::format("model.vocab['{}']: expected an integer id, found a string", key_));
      case Mode::kDom:
        return value(json(std::move(v)));
    }
    return true;
  }

  bool start_object(std::size_t) {
    if (mode_ != Mode::kDom) return fail(unexpected_container());
    if (in_model() && key_ == "vocab") {
      mode_ = Mode::kVocab;
      out_.has_vocab = true;
      return true;
    }
    return open(json::object());
  }

  bool key(json::string_t& k) {
    key_ = std::move(k);
    return true;
  }

  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }

  bool start_array(std::size_t) {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) return fail(unexpected_container());
    if (in_model() && key_ == "merges") {
      mode_ = Mode::kMerges;
      out_.has_merges = true;
      return true;
    }
    return open(json::array());
  }

  bool end_array() {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) {
        return fail(fmt::format("model.merges[{}]: expected [\"a\", \"b\"], found {} strings",
                                out_.merges.size(), pair_.size()));
      }
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    if (error_.empty()) error_ = fmt::format("{}: not valid JSON: {}", source_, ex.what());
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  // The container on top is root["model"].
  bool in_model() const { return stack_.size() == 2 && stack_keys_[1] == "model" && stack_[1]->is_object(); }

  std::string unexpected_container() const {
    if (mode_ == Mode::kVocab) return fmt::format("model.vocab['{}']: expected an integer id", key_);
    return fmt::format("model.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", out_.merges.size());
  }

  bool fail(std::string message) {
    if (error_.empty()) error_ = fmt::format("{}: {}", source_, message);
    return false;
  }

  bool vocab_value(int64_t id) {
    if (id < 0 || id > INT32_MAX) {
      return fail(fmt::format("model.vocab['{}']: expected a non-negative 32-bit id, found {}", key_, id));
    }
    out_.vocab.emplace_back(std::move(key_), id);
    return true;
  }

  bool value(json v) {
    switch (mode_) {
      case Mode::kVocab:
        return fail(fmt::format("model.vocab['{}']: expected an integer id, found {}", key_, v.dump()));
      case Mode::kMerges:
      case Mode::kMergePair:
        return fail(
            fmt::format("model.merges[{}]: expected strings, found {}", out_.merges.size(), v.dump()));
      case Mode::kDom:
        break;
    }
    if (stack_.empty()) {
      out_.root = std::move(v);
      return true;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
    } else {
      top[key_] = std::move(v);
    }
    return true;
  }

  bool open(json container) {
    json* slot = nullptr;
    std::string key;
    if (stack_.empty()) {
      out_.root = std::move(container);
      slot = &out_.root;
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(container));
      slot = &stack_.back()->back();
    } else {
      key = key_;
      slot = &((*stack_.back())[key_] = std::move(container));
    }
    stack_.push_back(slot);
    stack_keys_.push_back(std::move(key));
    return true;
  }

  bool close() {
    stack_.pop_back();
    stack_keys_.pop_back();
    return true;
  }

  TokenizerJson& out_;
  const std::string& source_;
  std::vector<json*> stack_;             // open containers, innermost last
  std::vector<std::string> stack_keys_;  // the key each container was opened under
  std::string key_;
  Mode mode_ = Mode::kDom;
  std::vector<std::string> pair_;
  std::string error_;
};

}  // namespace

Expected<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& source) {
  TokenizerJson out;
  TokenizerJsonSax sax(out, source);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, "{}: not valid JSON: {}", source, e.what());
  }
  if (!ok) {
    return make_error(ErrorCode::kCorrupt, "{}",
                      sax.error().empty() ? source + ": not valid JSON" : sax.error());
  }
  return out;
}

}  // namespace pd::tok
