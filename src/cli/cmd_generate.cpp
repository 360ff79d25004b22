// puredrive generate: one prompt through the generator (decode/generator.h): plain decoding or MTP cycles,
// any sampling rule, text in and out through the model's tokenizer and chat template, streaming, stop
// strings and acceptance statistics.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "puredrive/chat/chat_template.h"
#include "puredrive/decode/model_session.h"
#include "puredrive/decode/text_stream.h"
#ifdef PD_HAVE_CUDA
#include "puredrive/backend/cuda/cuda_backend.h"
#endif

namespace pd::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt, chat, prompt_ids;
  int max_tokens = 64;
  float temperature = 0, top_p = 1, min_p = 0, repetition_penalty = 1, presence_penalty = 0,
        frequency_penalty = 0;
  int top_k = 0;
  uint64_t seed = 0;
  float draft_temperature = 1;
  int mtp_draft = 2;
  bool mtp_adaptive = true;
  int mtp_draft_vocab = 0, mtp_window = 0;
  bool no_mtp = false;
  std::string accept;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool stats = false, stream = false, json = false;
  std::string backend = "auto";
  int threads = 0;
  int ctx_size = 0;       // 0: from the model and the memory (ModelSession)
  int prefill_chunk = 0;  // chosen by the session
  std::string kv_dtype = "bf16";
  std::string logits_out;
  // Set when the flag was given (the rest come from generation_config.json).
  CLI::Option *temp_opt = nullptr, *top_p_opt = nullptr, *top_k_opt = nullptr, *min_p_opt = nullptr,
              *rep_opt = nullptr, *seed_opt = nullptr, *draft_temp_opt = nullptr;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "puredrive generate: {}\n", s.message());
  throw CLI::RuntimeError(1);
}

template <typename T>
T value_or_fail(Expected<T> e) {
  if (!e) fail(e.status());
  return std::move(e).value();
}

Expected<std::vector<int32_t>> parse_ids(const std::string& text, int vocab) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string item = text.substr(i, j - i);
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v >= vocab) throw std::out_of_range("id");
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return make_error(ErrorCode::kInvalidArgument, "--prompt-ids: '{}' is not a token id in [0, {})", item,
                        vocab);
    }
    i = j + 1;
  }
  if (ids.empty()) return make_error(ErrorCode::kInvalidArgument, "--prompt-ids is empty");
  return ids;
}

Expected<std::vector<int32_t>> prompt_tokens(const GenerateArgs& a, const ModelSession& s) {
  if (!a.prompt_ids.empty()) return parse_ids(a.prompt_ids, s.checkpoint.config.vocab_size);
  if (!s.tokenizer) {
    return make_error(ErrorCode::kNotFound, "{} has no tokenizer.json: give the prompt as --prompt-ids",
                      a.model);
  }
  if (!a.prompt.empty()) return s.tokenizer->encode(a.prompt);
  // --chat: one user message, the model's chat template, ready for the assistant's answer.
  PD_ASSIGN_OR_RETURN(chat::ChatTemplate tmpl, chat::ChatTemplate::load(a.model));
  chat::ChatInputs in;
  in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", a.chat}}});
  in.add_generation_prompt = true;
  PD_ASSIGN_OR_RETURN(std::string text, tmpl.render(in));
  // The template wrote the special tokens itself (transformers: apply_chat_template tokenizes that way).
  return s.tokenizer->encode(text, /*add_special_tokens=*/false);
}

Expected<DecodeRequest> make_request(const GenerateArgs& a, const ModelSession& s,
                                     std::vector<int32_t> prompt) {
  DecodeRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = a.max_tokens;
  r.sampling = s.defaults.sampling();
  if (a.temp_opt->count() > 0) r.sampling.temperature = a.temperature;
  if (a.top_p_opt->count() > 0) r.sampling.top_p = a.top_p;
  if (a.top_k_opt->count() > 0) r.sampling.top_k = a.top_k;
  if (a.min_p_opt->count() > 0) r.sampling.min_p = a.min_p;
  if (a.rep_opt->count() > 0) r.sampling.repetition_penalty = a.repetition_penalty;
  r.sampling.presence_penalty = a.presence_penalty;
  r.sampling.frequency_penalty = a.frequency_penalty;
  if (a.seed_opt->count() > 0) r.sampling.seed = a.seed;
  if (a.draft_temp_opt->count() > 0) r.draft_temperature = a.draft_temperature;
  if (!a.ignore_eos) r.stop_token_ids = s.defaults.eos_token_ids;
  r.keep_last_logits = !a.logits_out.empty();
  r.timing = a.stats;
  r.num_draft = a.no_mtp || !s.generator->has_drafter() ? 0 : a.mtp_draft;
  r.adaptive_draft = a.mtp_adaptive;
  if (a.accept == "greedy") r.rule = AcceptRule::kGreedy;
  if (a.accept == "token") r.rule = AcceptRule::kTokenwise;
  if (a.accept == "block") r.rule = AcceptRule::kBlock;
  if (a.accept == "seeded") {
    if (!r.sampling.seed) return make_error(ErrorCode::kInvalidArgument, "--accept seeded needs --seed");
    r.rule = AcceptRule::kSeeded;
  }
  if (r.rule == AcceptRule::kGreedy && !r.sampling.is_greedy()) {
    return make_error(ErrorCode::kInvalidArgument, "--accept greedy needs --temp 0 (got {})",
                      r.sampling.temperature);
  }
  // Unseeded sampling draws from a fresh stream each run (--seed makes it reproducible).
  r.rng_seed = std::random_device{}();
  return r;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The CUDA backend's step graphs over the whole run (prefill included): a decode loop that keeps capturing
// graphs, or runs steps eagerly, pays for it in every step.
nlohmann::json graph_stats_json([[maybe_unused]] const Backend& backend) {
#ifdef PD_HAVE_CUDA
  if (std::optional<CudaStepStats> g = cuda_step_stats(backend)) {
    return {{"graphs_captured", g->graphs_captured},
            {"graph_replays", g->graph_replays},
            {"nodes_in_last_graph", g->last_graph_nodes},
            {"eager_steps", g->eager_steps},
            {"host_waits", g->host_waits},
            {"recorded_steps", g->recorded_steps},
            {"host_record_seconds", g->record_seconds},
            {"graph_gpu_seconds", g->graph_seconds},
            {"host_launch_seconds", g->launch_seconds},
            {"host_wait_seconds", g->wait_seconds}};
  }
#endif
  return nullptr;
}

nlohmann::json stats_json(const DecodeResult& r, const Backend& backend) {
  const AcceptStats& s = r.accept;
  nlohmann::json per_position = nlohmann::json::array();
  for (size_t j = 0; j < s.proposed_at.size(); ++j) per_position.push_back(s.acceptance_rate_at(j));
  return {{"steps", r.steps},
          {"plain_steps", r.plain_steps},
          {"cycles", s.cycles},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"tokens_per_cycle", s.tokens_per_cycle()},
          {"acceptance_rate", s.acceptance_rate()},
          {"acceptance_per_position", per_position},
          {"accepted_length_histogram", s.length_hist},
          {"draft_seconds", s.draft_seconds},
          {"verify_seconds", s.verify_seconds},
          {"target_seconds", r.target_seconds},
          {"sample_seconds", r.sample_seconds},
          {"graphs", graph_stats_json(backend)}};
}

void run_generate(const GenerateArgs& a) {
  if (static_cast<int>(!a.prompt.empty()) + static_cast<int>(!a.chat.empty()) +
          static_cast<int>(!a.prompt_ids.empty()) !=
      1) {
    fail(make_error(ErrorCode::kInvalidArgument, "give exactly one of --prompt, --chat, --prompt-ids"));
  }
  const bool no_mtp = a.no_mtp || a.mtp_draft == 0;
  std::unique_ptr<ModelSession> s =
      value_or_fail(ModelSession::open({.model_dir = a.model,
                                        .backend = a.backend,
                                        .threads = a.threads,
                                        .ctx_size = a.ctx_size,
                                        .kv_dtype = a.kv_dtype == "f32" ? DType::kF32 : DType::kBF16,
                                        .prefill_chunk = a.prefill_chunk,
                                        .max_draft = no_mtp ? 0 : a.mtp_draft,
                                        .mtp = !no_mtp,
                                        .mtp_draft_vocab = a.mtp_draft_vocab,
                                        .mtp_window = a.mtp_window}));
  if (!no_mtp && !s->generator->has_drafter()) {
    fmt::print(stderr, "puredrive generate: {} has no MTP head; decoding without speculation\n", a.model);
  }
  std::vector<int32_t> prompt = value_or_fail(prompt_tokens(a, *s));
  if (static_cast<int64_t>(prompt.size()) + a.max_tokens > s->plan.ctx_size) {
    fail(make_error(ErrorCode::kInvalidArgument,
                    "prompt ({} tokens) + -n {} exceeds the context of {} tokens", prompt.size(),
                    a.max_tokens, s->plan.ctx_size));
  }
  DecodeRequest req = value_or_fail(make_request(a, *s, std::move(prompt)));
  if (no_mtp) req.num_draft = 0;

  // Text goes through the streaming detokenizer and the stop strings; a final EOS token has no text.
  std::optional<TextStream> text;
  if (s->tokenizer) text.emplace(*s->tokenizer, a.stop);
  std::string out_text;
  bool stop_string = false;
  const ChunkSink sink = [&](const DecodeChunk& c) {
    if (!text) return true;
    std::span<const int32_t> ids = c.tokens;
    if (!ids.empty() && std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), ids.back()) !=
                            req.stop_token_ids.end()) {
      ids = ids.first(ids.size() - 1);
    }
    TextStream::Piece p = text->push(ids);
    out_text += p.text;
    if (a.stream && !a.json) {
      std::fwrite(p.text.data(), 1, p.text.size(), stdout);
      std::fflush(stdout);
    }
    stop_string = p.stopped;
    return !p.stopped;
  };
  DecodeResult r = value_or_fail(s->generator->generate(req, sink));
  if (text && !stop_string) {
    const std::string tail = text->finish();
    out_text += tail;
    if (a.stream && !a.json) std::fwrite(tail.data(), 1, tail.size(), stdout);
  }
  const std::string finish = stop_string ? "stop" : finish_reason_name(r.reason);

  if (!a.logits_out.empty()) {
    std::ofstream f(a.logits_out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(r.last_logits.data()),
            static_cast<std::streamsize>(r.last_logits.size() * sizeof(float)));
    if (!f) fail(make_error(ErrorCode::kIo, "cannot write --logits-out {}", a.logits_out));
  }
  // The first token comes from the first step after the prefill, so every token is a decode token.
  const double decode_tps =
      r.decode_seconds > 0 ? static_cast<double>(r.tokens.size()) / r.decode_seconds : 0.0;
  const double prefill_tps =
      r.prefill_seconds > 0 ? static_cast<double>(req.prompt.size() - 1) / r.prefill_seconds : 0.0;
  if (a.json) {
    nlohmann::json j = {
        {"tokens", r.tokens},
        {"finish_reason", finish},
        {"prompt_tokens", req.prompt.size()},
        {"mtp_draft", req.num_draft},
        {"mtp_adaptive", req.adaptive_draft},
        {"accept_rule",
         accept_rule_name(req.rule.value_or(choose_accept_rule(req.sampling, req.block_verification)))},
        {"prefill_seconds", r.prefill_seconds},
        {"prefill_tokens_per_second", prefill_tps},
        {"decode_seconds", r.decode_seconds},
        {"decode_tokens_per_second", decode_tps},
        {"stats", stats_json(r, *s->backend)},
        {"peak_rss_mib", peak_rss_mib()},
        {"backend", s->backend->name()}};
    if (text) j["text"] = out_text;
    fmt::print("{}\n", j.dump());
  } else if (text) {
    if (!a.stream) std::fwrite(out_text.data(), 1, out_text.size(), stdout);
    fmt::print("\n");
  } else {
    fmt::print("{}\n", fmt::join(r.tokens, " "));
  }
  if (a.stats || !a.json) {
    fmt::print(stderr,
               "prefill {} tokens in {:.3f} s, decode {} tokens at {:.2f} tok/s ({}), finish: {}, peak RSS "
               "{:.1f} MiB, {}\n",
               req.prompt.size(), r.prefill_seconds, r.tokens.size(), decode_tps,
               req.num_draft > 0 ? fmt::format("MTP k={}", req.num_draft) : std::string("no MTP"), finish,
               peak_rss_mib(), s->backend->name());
  }
  if (a.stats) fmt::print(stderr, "stats: {}\n", r.summary());
}

void setup_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate from a prompt (MTP speculative decoding by default)");
  cmd->add_option("--model", a->model, "Model directory (config.json, *.safetensors, tokenizer.json)")
      ->required();
  auto* p1 = cmd->add_option("--prompt", a->prompt, "Prompt text (encoded as is)");
  auto* p2 = cmd->add_option("--chat", a->chat, "A user message, rendered with the model's chat template");
  auto* p3 = cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt token ids, comma separated");
  p1->excludes(p2)->excludes(p3);
  p2->excludes(p3);
  cmd->add_option("-n,--max-tokens", a->max_tokens, "Tokens to generate")->check(CLI::Range(0, 1 << 24));
  a->temp_opt =
      cmd->add_option("--temp", a->temperature, "Temperature (0: greedy); default generation_config.json")
          ->check(CLI::Range(0.0f, 100.0f));
  a->top_p_opt = cmd->add_option("--top-p", a->top_p, "Top-p in (0, 1]");
  a->top_k_opt = cmd->add_option("--top-k", a->top_k, "Top-k (0: off)");
  a->min_p_opt = cmd->add_option("--min-p", a->min_p, "Min-p in [0, 1]");
  a->rep_opt = cmd->add_option("--repetition-penalty", a->repetition_penalty, "Repetition penalty (1: off)");
  cmd->add_option("--presence-penalty", a->presence_penalty, "Presence penalty");
  cmd->add_option("--frequency-penalty", a->frequency_penalty, "Frequency penalty");
  a->seed_opt = cmd->add_option("--seed", a->seed, "Seeded exact mode: the same tokens with MTP on and off");
  a->draft_temp_opt = cmd->add_option("--draft-temp", a->draft_temperature,
                                      "Temperature of the MTP drafts (draft side only; output unchanged)");
  cmd->add_option("--mtp-draft", a->mtp_draft, "MTP draft tokens per cycle, 0..4")->check(CLI::Range(0, 4));
  cmd->add_flag("--no-mtp", a->no_mtp, "Plain decoding, one token per step");
  add_adaptive_option(cmd, &a->mtp_adaptive);
  add_draft_options(cmd, &a->mtp_draft_vocab, &a->mtp_window);
  cmd->add_option("--accept", a->accept,
                  "Acceptance rule (default: greedy at T=0, seeded with --seed, else block)")
      ->check(CLI::IsMember({"greedy", "token", "block", "seeded"}));
  cmd->add_option("--stop", a->stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the model's end-of-sequence tokens");
  cmd->add_flag("--stats", a->stats, "Print acceptance and timing statistics to stderr");
  cmd->add_flag("--stream", a->stream, "Print text as it is generated");
  cmd->add_flag("--json", a->json, "Print ids, text and statistics as JSON");
  cmd->add_option("--backend", a->backend, "auto (CUDA when a GPU is usable, else CPU), cpu or cuda")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--ctx-size", a->ctx_size,
                  "KV cache capacity in tokens; 0: the model's max_position_embeddings, or the largest that "
                  "fits in memory")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option(
         "--prefill-chunk", a->prefill_chunk,
         "Prompt rows per prefill step (bounds the step workspaces; cancellation is checked between "
         "chunks; 0: 8192 on a GPU where the memory plan allows, else 4096 or 2048; 2048 on the CPU)")
      ->check(CLI::Range(0, kMaxPrefillChunk))
      ->capture_default_str();
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache dtype")->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_option("--logits-out", a->logits_out, "Write the raw logits of the last token as float32");
  cmd->callback([a] { run_generate(*a); });
}

const bool registered = register_command(setup_generate);

}  // namespace
}  // namespace pd::cli
