// puredrive serve: the OpenAI-compatible HTTP server (docs/API.md). One engine thread owns the model
// (GeneratorEngine over decode/'s Generator); HTTP threads parse, queue and stream. SIGINT/SIGTERM stop it.
//
// --fake-engine (hidden, TEST ONLY) serves the deterministic fake engine and frontend of
// src/puredrive/server/testing/ instead of a model, so the HTTP layer and its tests run without weights. It
// exists only in the test binary puredrive_fake_serve, which registers the fakes (cli/fake_serve.h).
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/fake_serve.h"
#include "cli/generator_engine.h"
#include "puredrive/decode/model_session.h"
#include "puredrive/server/api_service.h"
#include "puredrive/server/http_server.h"
#include "puredrive/server/metrics.h"
#include "puredrive/server/model_frontend.h"
#include "puredrive/server/scheduler.h"
#include "puredrive/util/log.h"

namespace pd::cli {
namespace {

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string model_alias;
  int ctx_size = 0;  // 0: from the model and the memory (ModelSession)
  int mtp_draft = 2;
  bool mtp_adaptive = true;
  int mtp_draft_vocab = 0, mtp_window = 0;
  int prefill_chunk = 0;  // chosen by the session
  std::string prefix_cache = "on";
  int prefix_cache_mib = -1;  // -1: from the memory free after loading
  int prefix_cache_host_mib = -1;
  int max_queue = 32;
  std::string backend = "auto";
  int threads = 0;
  int http_threads = 64;
  int read_timeout = 10;
  int idle_timeout = 30;
  int max_connections = 1024;
  int max_connections_per_client = 128;
  int max_body_mb = 32;
  int keepalive_ms = 3000;
  // Test only.
  bool fake_engine = false;
  int fake_token_delay_ms = 0;
  int fake_prefill_delay_ms = 0;
  int fake_load_delay_ms = 0;
};

[[noreturn]] void fail(const std::string& message) {
  fmt::print(stderr, "puredrive serve: {}\n", message);
  throw CLI::RuntimeError(1);
}

// What is served, and everything the engine borrows from. Members are destroyed in reverse order: the
// engine (generator) before the model session whose model, backend and weights it uses.
struct Served {
  std::unique_ptr<ModelSession> session;
  std::unique_ptr<server::Engine> engine;
  server::Frontend frontend;
};

// The fake engine has no model to size its context from.
constexpr int kFakeContext = 4096;

Served load_fake(const ServeArgs& a) {
  // Stands in for a long model load (signal handling during loading is tested with it).
  std::this_thread::sleep_for(std::chrono::milliseconds(a.fake_load_delay_ms));
  FakeServed fake =
      fake_serve_factory()({.model_id = a.model_alias,
                            .context_size = a.ctx_size > 0 ? a.ctx_size : kFakeContext,
                            .mtp_draft = a.mtp_draft,
                            .token_delay = std::chrono::milliseconds(a.fake_token_delay_ms),
                            .prefill_delay = std::chrono::milliseconds(a.fake_prefill_delay_ms)});
  Served s;
  s.engine = std::move(fake.engine);
  s.frontend = std::move(fake.frontend);
  return s;
}

template <typename T>
T take(Expected<T> e) {
  if (!e) fail(e.status().message());
  return std::move(e).value();
}

// The prefix cache's budgets: as given, or a quarter of the backend memory free after loading (at most 8 GiB)
// and, on a GPU, a quarter of the host's available memory (at most 16 GiB) for what the GPU tier evicts; the
// CPU backend's own tier is host memory already, so it gets no second one.
void enable_prefix_cache(const ServeArgs& a, ModelSession& m) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  int64_t device = int64_t{a.prefix_cache_mib} * kMiB;
  if (a.prefix_cache_mib < 0) device = std::min(int64_t{8} << 30, m.backend->available_memory() / 4);
  int64_t host = int64_t{a.prefix_cache_host_mib} * kMiB;
  if (a.prefix_cache_host_mib < 0) {
    const Expected<int64_t> available = available_memory_bytes();
    host =
        m.backend->device() == Device::kCpu || !available ? 0 : std::min(int64_t{16} << 30, *available / 4);
  }
  const Status s = m.generator->enable_prefix_cache({.device_budget = device, .host_budget = host});
  if (!s.is_ok()) fail(fmt::format("{} (see --prefill-chunk, or --prefix-cache off)", s.message()));
  const PrefixCache& c = *m.generator->prefix_cache();
  PD_LOG_INFO(
      "prefix cache: {} of {} memory, {} of host memory for what it evicts; a block of {} tokens "
      "takes {}, a state snapshot {}",
      format_bytes(static_cast<double>(device)), m.backend->device() == Device::kCpu ? "CPU" : "GPU",
      format_bytes(static_cast<double>(host)), kPrefixBlock,
      format_bytes(static_cast<double>(c.block_bytes())),
      format_bytes(static_cast<double>(c.snapshot_bytes())));
}

Served load_model(const ServeArgs& a) {
  Served s;
  s.session = take(ModelSession::open({.model_dir = a.model,
                                       .backend = a.backend,
                                       .threads = a.threads,
                                       .ctx_size = a.ctx_size,
                                       .kv_dtype = DType::kBF16,
                                       .prefill_chunk = a.prefill_chunk,
                                       .max_draft = std::max(a.mtp_draft, 1),
                                       .mtp = a.mtp_draft > 0,
                                       .mtp_draft_vocab = a.mtp_draft_vocab,
                                       .mtp_window = a.mtp_window}));
  ModelSession& m = *s.session;
  if (a.mtp_draft > 0 && !m.generator->has_drafter()) {
    PD_LOG_WARN("{} has no MTP head: decoding without speculation", a.model);
  }
  if (a.prefix_cache == "on") enable_prefix_cache(a, m);
  const int32_t vocab = m.checkpoint.config.vocab_size;
  if (!m.tokenizer) fail(fmt::format("{}: tokenizer.json is missing", a.model));
  auto prompts =
      take(server::ModelPromptBuilder::load(a.model, *m.tokenizer, m.defaults.eos_token_ids, vocab));
  s.frontend = server::Frontend{prompts, std::make_shared<server::ModelOutputParser>()};
  server::EngineInfo info{.model_id = a.model_alias,
                          .context_size = static_cast<int>(m.plan.ctx_size),
                          .vocab_size = vocab,
                          .mtp_draft = m.generator->has_drafter() ? a.mtp_draft : 0,
                          .backend = m.backend->name()};
  // The prompt builder keeps a copy of the tokenizer; the engine takes the session's.
  GeneratorEngineOptions engine_options;
  engine_options.adaptive_draft = a.mtp_adaptive;
  s.engine = std::make_unique<GeneratorEngine>(std::move(m.generator), std::move(*m.tokenizer), info,
                                               a.mtp_draft, engine_options);
  return s;
}

Served load_served(const ServeArgs& a) {
  return a.fake_engine ? load_fake(a) : load_model(a);
}

void run_serve(const ServeArgs& args) {
  ServeArgs a = args;
  if (a.model.empty() && !a.fake_engine) fail("--model DIR is required");
  if (a.model_alias.empty()) {
    a.model_alias =
        a.model.empty() ? "fake" : std::filesystem::path(a.model).lexically_normal().filename().string();
    if (a.model_alias.empty())
      a.model_alias = std::filesystem::path(a.model).parent_path().filename().string();
  }
  if (a.ctx_size != 0 && a.ctx_size < 2) {
    fail(fmt::format("--ctx-size must be at least 2 (0: from the model), got {}", a.ctx_size));
  }
  if (a.max_queue < 1) fail(fmt::format("--max-queue must be at least 1, got {}", a.max_queue));
  if (a.mtp_draft < 0) fail(fmt::format("--mtp-draft must be >= 0, got {}", a.mtp_draft));
  if (a.http_threads < 2) fail(fmt::format("--http-threads must be at least 2, got {}", a.http_threads));
  if (a.read_timeout < 1) fail(fmt::format("--read-timeout must be at least 1 s, got {}", a.read_timeout));
  if (a.idle_timeout < 1) fail(fmt::format("--idle-timeout must be at least 1 s, got {}", a.idle_timeout));
  if (a.max_connections < 1 || a.max_connections_per_client < 1) {
    fail(fmt::format("--max-connections and --max-connections-per-client must be at least 1, got {} and {}",
                     a.max_connections, a.max_connections_per_client));
  }
  if (a.http_threads <= a.max_queue + 1) {
    PD_LOG_WARN(
        "--http-threads {} <= --max-queue {} + 1: requests waiting for the engine can take every handler "
        "thread, and further generation requests get 503 server_busy",
        a.http_threads, a.max_queue);
  }
  if (a.max_body_mb < 1 || a.max_body_mb > 4096) {
    fail(fmt::format("--max-body-mb must be in [1, 4096], got {}", a.max_body_mb));
  }
  if (a.keepalive_ms < 10) fail(fmt::format("--keepalive-ms must be at least 10, got {}", a.keepalive_ms));

  // Request buffers (bodies, parsed JSON, prompt text) of 4 MiB and more are mapped and unmapped, and arena
  // tops over 8 MiB are given back: with glibc's dynamic thresholds a 29 MB prompt left about that much
  // resident in each arena it passed through, for good. The engine's decode-step buffers are far smaller; a
  // wide CPU prefill step may map a few of its buffers anew, page faults that are small next to the step.
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 8 << 20);

  // Signals go to one waiting thread (blocked everywhere else). While the model loads there is nothing to
  // shut down cleanly, so a signal ends the process at once; once serving, it stops the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that vanishes mid-write must not kill the server

  struct StopTargets {
    std::mutex mu;
    server::Scheduler* scheduler = nullptr;
    server::HttpServer* http = nullptr;
    bool stopping = false;
    bool done = false;  // run_serve is leaving: the signal thread only returns
  } targets;
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::lock_guard lock(targets.mu);
    if (targets.done) return;
    targets.stopping = true;
    if (!targets.http) {
      PD_LOG_INFO("signal {} while loading: exiting", sig);
      std::fflush(stderr);
      std::_Exit(128 + sig);
    }
    PD_LOG_INFO("signal {}: shutting down", sig);
    // Cancel generations first: their streams end with an error event, which frees the handler threads
    // that the HTTP server joins when it stops.
    targets.scheduler->shutdown();
    targets.http->stop();
  });
  // Whatever way run_serve ends (a load error included), the signal thread is woken and joined.
  struct JoinSignalThread {
    StopTargets& t;
    std::thread& thread;
    ~JoinSignalThread() {
      bool wake = false;
      {
        std::lock_guard lock(t.mu);
        t.done = true;
        t.http = nullptr;
        t.scheduler = nullptr;
        wake = !t.stopping;
      }
      if (wake) pthread_kill(thread.native_handle(), SIGTERM);
      thread.join();
    }
  } join_signal_thread{targets, signal_thread};

  Served served = load_served(a);
  server::Metrics metrics;
  server::Scheduler scheduler(*served.engine, static_cast<size_t>(a.max_queue), &metrics);
  server::ServiceOptions so;
  so.model_names = {a.model_alias};
  if (!a.model.empty()) {
    const std::string dir_name = std::filesystem::path(a.model).lexically_normal().filename().string();
    if (!dir_name.empty() && dir_name != a.model_alias) so.model_names.push_back(dir_name);
  }
  so.keepalive_interval = std::chrono::milliseconds(a.keepalive_ms);
  server::ApiService service(so, scheduler, served.engine->info(), served.frontend, metrics);

  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  ho.max_body_bytes = static_cast<size_t>(a.max_body_mb) << 20;
  ho.read_timeout_seconds = a.read_timeout;
  ho.idle_timeout_seconds = a.idle_timeout;
  ho.threads = a.http_threads;
  ho.max_connections = a.max_connections;
  ho.max_connections_per_client = a.max_connections_per_client;
  server::HttpServer http(ho, service, metrics);
  auto port = http.bind();
  if (!port) fail(port.status().message());
  {
    std::lock_guard lock(targets.mu);
    if (targets.stopping) return;
    targets.scheduler = &scheduler;
    targets.http = &http;
  }

  const server::EngineInfo info = served.engine->info();
  PD_LOG_INFO("serving '{}' ({} backend, context {} tokens, MTP draft {}, queue {}) on http://{}:{}{}",
              a.model_alias, info.backend, info.context_size, info.mtp_draft, a.max_queue, a.host, *port,
              a.api_key.empty() ? "" : " (API key required)");
  // The test harness and scripts read the port from this line.
  fmt::print("listening on http://{}:{}\n", a.host, *port);
  std::fflush(stdout);

  http.run();
  {
    std::lock_guard lock(targets.mu);
    targets.http = nullptr;
    targets.scheduler = nullptr;
  }
  scheduler.shutdown();
}

void setup_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (see docs/API.md)");
  cmd->add_option("--model", args->model, "Model directory (config.json, *.safetensors, tokenizer files)");
  cmd->add_option("--host", args->host, "Address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", args->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--model-alias", args->model_alias,
                  "Model name for clients (default: the directory's name)");
  cmd->add_option("--ctx-size", args->ctx_size,
                  "Context size in tokens (prompt + completion); 0: the model's max_position_embeddings, or "
                  "the largest that fits in memory")
      ->capture_default_str();
  cmd->add_option("--mtp-draft", args->mtp_draft, "MTP draft length k (0: no speculation)")
      ->capture_default_str();
  add_adaptive_option(cmd, &args->mtp_adaptive);
  add_draft_options(cmd, &args->mtp_draft_vocab, &args->mtp_window);
  cmd->add_option(
         "--prefill-chunk", args->prefill_chunk,
         "Prompt rows per prefill step (bounds the step workspaces; a cancelled request stops between "
         "chunks; 0: 8192 on a GPU where the memory plan allows, else 4096 or 2048; 2048 on the CPU)")
      ->check(CLI::Range(0, kMaxPrefillChunk))
      ->capture_default_str();
  cmd->add_option("--prefix-cache", args->prefix_cache,
                  "Reuse the cached state of earlier prompts' prefixes (exact: outputs do not change)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--prefix-cache-mib", args->prefix_cache_mib,
                  "Prefix-cache budget in backend memory (GPU memory, or RAM on the CPU backend), MiB; -1: a "
                  "quarter of what is free after loading, at most 8 GiB")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  cmd->add_option(
         "--prefix-cache-host-mib", args->prefix_cache_host_mib,
         "Prefix-cache budget in host memory for what the GPU tier evicts, MiB; -1: a quarter of the "
         "available RAM, at most 16 GiB, with a GPU backend (0 on the CPU backend)")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--max-queue", args->max_queue, "Requests that may wait for the engine; more get 503")
      ->capture_default_str();
  cmd->add_option("--backend", args->backend, "auto (CUDA when a GPU is usable, else CPU), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "CPU threads for the engine (0: all cores)")
      ->capture_default_str();
  cmd->add_option("--http-threads", args->http_threads,
                  "Handler threads for generation requests (more than --max-queue + 1)")
      ->capture_default_str();
  cmd->add_option("--read-timeout", args->read_timeout,
                  "Seconds a request's headers may take in all (its body: this plus one per MiB)")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", args->idle_timeout, "Seconds a kept-alive connection may wait idle")
      ->capture_default_str();
  cmd->add_option("--max-connections", args->max_connections, "Open connections in all; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-client", args->max_connections_per_client,
                  "Open connections from one client address; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-body-mb", args->max_body_mb, "Largest request body in MiB (413 beyond)")
      ->capture_default_str();
  cmd->add_option("--keepalive-ms", args->keepalive_ms, "SSE keep-alive comment interval in ms")
      ->capture_default_str();
  // Hidden (empty group): test-only options, in the test binary only.
  if (fake_serve_factory()) {
    cmd->add_flag("--fake-engine", args->fake_engine, "TEST ONLY: deterministic fake engine, no model")
        ->group("");
    cmd->add_option("--fake-token-delay-ms", args->fake_token_delay_ms, "TEST ONLY")->group("");
    cmd->add_option("--fake-prefill-delay-ms", args->fake_prefill_delay_ms, "TEST ONLY")->group("");
    cmd->add_option("--fake-load-delay-ms", args->fake_load_delay_ms, "TEST ONLY")->group("");
  }
  cmd->callback([args] { run_serve(*args); });
}

const bool registered = register_command(setup_serve);

FakeServeFactory& fake_factory() {
  static FakeServeFactory f;
  return f;
}

}  // namespace

bool register_fake_serve(FakeServeFactory factory) {
  fake_factory() = std::move(factory);
  return true;
}

const FakeServeFactory& fake_serve_factory() {
  return fake_factory();
}

}  // namespace pd::cli
