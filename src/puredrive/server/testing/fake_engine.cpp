#include "puredrive/server/testing/fake_engine.h"

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/server/testing/fake_frontend.h"

namespace pd::server::fake {
namespace {

using Json = nlohmann::json;

constexpr const char* kWords[] = {"alpha", "bravo",  "charlie", "delta", "echo", "foxtrot",  "golf",  "hotel",
                                  "india", "juliet", "kilo",    "lima",  "mike", "november", "oscar", "papa"};

struct Turn {
  std::string role;
  std::string content;
};

// The messages of a fake ChatML prompt and the text after the final "<|im_start|>assistant\n".
struct PromptView {
  std::vector<Turn> turns;
  std::string assistant_tail;
  bool chat = false;
  std::vector<Json> tools;
};

PromptView read_prompt(const std::string& text) {
  PromptView v;
  const std::string start = "<|im_start|>", end = "<|im_end|>";
  size_t pos = text.find(start);
  v.chat = pos != std::string::npos;
  while (pos != std::string::npos) {
    const size_t role_end = text.find('\n', pos);
    if (role_end == std::string::npos) break;
    Turn t{text.substr(pos + start.size(), role_end - pos - start.size()), ""};
    const size_t close = text.find(end, role_end);
    if (close == std::string::npos) {
      v.assistant_tail = text.substr(role_end + 1);
      break;
    }
    t.content = text.substr(role_end + 1, close - role_end - 1);
    v.turns.push_back(t);
    pos = text.find(start, close);
  }
  for (const auto& t : v.turns) {
    const size_t open = t.content.find("<tools>\n"), close = t.content.find("</tools>");
    if (t.role != "system" || open == std::string::npos || close == std::string::npos) continue;
    size_t line = open + 8;
    while (line < close) {
      const size_t nl = t.content.find('\n', line);
      Json tool = Json::parse(t.content.substr(line, nl - line), nullptr, false);
      if (!tool.is_discarded()) v.tools.push_back(tool);
      line = nl + 1;
    }
  }
  return v;
}

std::string fake_arguments(const Json& tool) {
  const Json params = tool["function"].value("parameters", Json::object());
  const Json props = params.value("properties", Json::object());
  std::string out = "{";
  for (const auto& [name, schema] : props.items()) {
    const std::string type = schema.value("type", "string");
    std::string value = "null";
    if (type == "string") value = name.find("city") != std::string::npos ? "\"Paris\"" : "\"value\"";
    if (type == "integer" || type == "number") value = "42";
    if (type == "boolean") value = "true";
    if (out.size() > 1) out += ", ";
    out += Json(name).dump() + ": " + value;
  }
  return out + "}";
}

std::string filler(const SamplingOptions& s, int words) {
  uint64_t seed = 0;
  if (s.temperature > 0.0f) seed = s.seed ? *s.seed : std::random_device{}();
  std::mt19937_64 rng(seed);
  std::string out;
  for (int i = 0; i < words; ++i) {
    out += ' ';
    out += kWords[rng() % std::size(kWords)];
  }
  return out + ".";
}

std::string strip_tool_response(std::string s) {
  const std::string open = "<tool_response>\n", close = "\n</tool_response>";
  if (s.rfind(open, 0) == 0) s.erase(0, open.size());
  if (s.size() >= close.size() && s.compare(s.size() - close.size(), close.size(), close) == 0) {
    s.erase(s.size() - close.size());
  }
  return s;
}

// Number of leading bytes of s that form complete UTF-8 characters (the rest waits for more bytes).
size_t complete_utf8_prefix(const std::string& s) {
  size_t i = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) i = s.size() - back;
    break;
  }
  return i;
}

TokenLogprob fake_logprob(int32_t id, size_t step, int32_t top) {
  TokenLogprob lp;
  lp.token_id = id;
  lp.token = decode(std::vector<int32_t>{id});
  lp.logprob = -0.05f * static_cast<float>((step * 7 + static_cast<size_t>(id)) % 10);
  for (int32_t k = 0; k < top; ++k) {
    const int32_t alt = k == 0 ? id : (id + 31 * k) % 256;
    lp.top.push_back(
        TopLogprob{alt, decode(std::vector<int32_t>{alt}), lp.logprob - 0.75f * static_cast<float>(k)});
  }
  return lp;
}

}  // namespace

EngineInfo FakeEngine::info() const {
  return EngineInfo{.model_id = options_.model_id,
                    .context_size = options_.context_size,
                    .vocab_size = kVocabSize,
                    .mtp_draft = options_.mtp_draft,
                    .backend = "fake"};
}

std::string FakeEngine::reply_for(const GenerationRequest& request) const {
  const PromptView p = read_prompt(decode(request.prompt_ids));
  if (!p.chat) return filler(request.sampling, options_.filler_words);

  std::string reply;
  const std::string& tail = p.assistant_tail;
  const auto ends_with = [&](std::string_view s) {
    return tail.size() >= s.size() && tail.compare(tail.size() - s.size(), s.size(), s) == 0;
  };
  const Turn* last = p.turns.empty() ? nullptr : &p.turns.back();
  const std::string said = last ? last->content : "";
  if (tail.find("<think>") != std::string::npos && tail.find("</think>") == std::string::npos) {
    reply += "The user wrote " + std::to_string(said.size()) + " bytes.\n</think>\n\n";
  }
  if (ends_with("\"arguments\": ")) {  // tool_choice named a function: its name is already in the prompt
    const size_t name_at = tail.rfind("\"name\": \"") + 9;
    const std::string name = tail.substr(name_at, tail.find('"', name_at) - name_at);
    for (const auto& t : p.tools) {
      if (t["function"]["name"] == name) reply += fake_arguments(t);
    }
    return reply + "}\n</tool_call>";
  }
  std::vector<const Json*> calls;
  for (const auto& t : p.tools) {
    if (said.find(t["function"]["name"].get<std::string>()) != std::string::npos) calls.push_back(&t);
  }
  if (ends_with("<tool_call>\n")) {  // tool_choice required: call the mentioned tool or the first one
    const Json& t = calls.empty() ? p.tools.front() : *calls.front();
    return reply + "{\"name\": " + t["function"]["name"].dump() + ", \"arguments\": " + fake_arguments(t) +
           "}\n</tool_call>";
  }
  if (last && last->role == "user" && !calls.empty()) {
    for (const Json* t : calls) {
      if (t != calls.front()) reply += "\n";
      reply += "<tool_call>\n{\"name\": " + (*t)["function"]["name"].dump() +
               ", \"arguments\": " + fake_arguments(*t) + "}\n</tool_call>";
    }
    return reply;
  }
  if (last && last->role == "tool") return reply + "The tool said: " + strip_tool_response(said);
  return reply + "You said: " + said + filler(request.sampling, options_.filler_words);
}

GenerationResult FakeEngine::generate(const GenerationRequest& request, GenerationSink& sink) {
  GenerationResult result;
  result.stats.prompt_tokens = static_cast<int32_t>(request.prompt_ids.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (auto waited = std::chrono::milliseconds(0); waited < options_.prefill_delay;
       waited += std::chrono::milliseconds(5)) {
    if (sink.cancelled()) {
      result.reason = FinishReason::kCancelled;
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto t1 = std::chrono::steady_clock::now();
  result.stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  std::vector<int32_t> tokens = encode(reply_for(request));
  tokens.push_back(kImEnd);
  const int32_t room = options_.context_size - result.stats.prompt_tokens;
  std::string pending;  // bytes of an incomplete UTF-8 character
  size_t next = 0;
  int32_t& produced = result.stats.completion_tokens;
  bool first = true;
  result.reason = FinishReason::kStop;
  while (next < tokens.size()) {
    if (sink.cancelled()) {
      result.reason = FinishReason::kCancelled;
      break;
    }
    // One "MTP cycle": the first token comes from prefill, later cycles emit up to mtp_draft + 1 tokens.
    const int32_t k = request.mtp ? options_.mtp_draft : 0;
    const size_t cycle = first ? 1 : static_cast<size_t>(k) + 1;
    GenerationOutput out;
    bool done = false;
    for (size_t i = 0; i < cycle && next < tokens.size() && !done; ++i) {
      const int32_t id = tokens[next++];
      ++produced;
      if (id == kImEnd) {
        done = true;
        break;
      }
      out.token_ids.push_back(id);
      if (request.logprobs >= 0)
        out.logprobs.push_back(fake_logprob(id, static_cast<size_t>(produced), request.logprobs));
      pending += decode(std::vector<int32_t>{id});
      if (produced >= request.max_tokens) {
        result.reason = FinishReason::kLength;
        done = true;
      } else if (produced >= room) {
        result.reason = FinishReason::kContextFull;
        done = true;
      }
    }
    if (!first) {
      GenerationStats& st = result.stats;
      const auto accepted = static_cast<int64_t>(std::max<size_t>(out.token_ids.size(), 1) - 1);
      ++st.decode_steps;
      st.draft_tokens += k;
      st.accepted_draft_tokens += accepted;
      if (k > 0) {
        st.proposed_at.resize(static_cast<size_t>(k));
        st.accepted_at.resize(static_cast<size_t>(k));
        for (int32_t j = 0; j < k; ++j) {
          ++st.proposed_at[static_cast<size_t>(j)];
          if (j < accepted) ++st.accepted_at[static_cast<size_t>(j)];
        }
      }
    }
    first = false;
    // Bytes of a character cut off by the end of generation are dropped, never sent as invalid UTF-8.
    const size_t ready = complete_utf8_prefix(pending);
    out.text = pending.substr(0, ready);
    pending.erase(0, ready);
    std::this_thread::sleep_for(options_.token_delay * static_cast<int>(out.token_ids.size()));
    if (!out.token_ids.empty() && !sink.on_output(std::move(out))) {
      result.reason = FinishReason::kCancelled;
      break;
    }
    if (done) break;
  }
  result.stats.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return result;
}

}  // namespace pd::server::fake
