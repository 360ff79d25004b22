// Fuzz target: request bodies of POST /v1/chat/completions, /v1/completions and Anthropic's /v1/messages
// (JSON, field validation), and for a valid chat or messages request the prompt it becomes: the bundled tiny
// coder's chat template rendered with the client's messages, tools and template kwargs, then tokenized.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "puredrive/server/anthropic_request.h"
#include "puredrive/server/chat_request.h"
#include "puredrive/server/completion_request.h"
#include "puredrive/server/model_frontend.h"

namespace {

const pd::server::RequestLimits& limits() {
  static const pd::server::RequestLimits l{.model_names = {"m"}, .vocab_size = 1000};
  return l;
}

const pd::server::ModelPromptBuilder& prompts() {
  static const auto builder = [] {
    const std::string dir = PD_SOURCE_DIR "/models/tiny-coder";
    auto tok = pd::Tokenizer::load(dir);
    if (!tok) std::abort();
    auto b = pd::server::ModelPromptBuilder::load(dir, std::move(tok).value(), {0}, 0);
    if (!b) std::abort();
    return std::move(b).value();
  }();
  return *builder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  pd::server::CompletionRequest completion;
  (void)pd::server::parse_completion_request(body, limits(), &completion);
  pd::server::MessagesRequest messages;
  if (!pd::server::parse_messages_request(body, limits(), pd::server::MessagesCall::kCreate, &messages)) {
    (void)prompts().render_chat(messages.prompt);
  }
  pd::server::ChatRequest chat;
  if (pd::server::parse_chat_request(body, limits(), &chat)) return 0;  // refused: an error, not a crash
  (void)prompts().render_chat(chat.prompt);
  return 0;
}
