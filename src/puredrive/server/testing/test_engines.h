// Engines for the server's unit tests: GatedEngine emits a fixed token script one output at a time and can
// be held at any point, so tests can catch a request queued, mid-prefill or mid-stream deterministically.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "puredrive/server/engine_port.h"

namespace pd::server::testing {

class GatedEngine final : public Engine {
 public:
  // Each string is one engine output (one token).
  explicit GatedEngine(std::vector<std::string> script) : script_(std::move(script)) {}

  EngineInfo info() const override {
    return EngineInfo{
        .model_id = "m", .context_size = 64, .vocab_size = 1000, .mtp_draft = 0, .backend = "test"};
  }

  // While closed, generate() waits before its first output (like a long prefill).
  void close_gate() {
    std::lock_guard l(mu_);
    open_ = false;
  }
  void open_gate() {
    {
      std::lock_guard l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int started() const { return started_.load(); }
  int cancelled() const { return cancelled_.load(); }
  int finished() const { return finished_.load(); }
  void set_token_delay(std::chrono::milliseconds d) { delay_ = d; }

  GenerationResult generate(const GenerationRequest& request, GenerationSink& sink) override {
    ++started_;
    GenerationResult r;
    r.stats.prompt_tokens = static_cast<int32_t>(request.prompt_ids.size());
    {
      std::unique_lock l(mu_);
      while (!open_ && !sink.cancelled()) cv_.wait_for(l, std::chrono::milliseconds(5));
    }
    for (size_t i = 0; i < script_.size(); ++i) {
      if (sink.cancelled()) return cancel(r);
      if (r.stats.completion_tokens >= request.max_tokens) {
        r.reason = FinishReason::kLength;
        ++finished_;
        return r;
      }
      std::this_thread::sleep_for(delay_);
      GenerationOutput out;
      out.token_ids = {static_cast<int32_t>(i)};
      out.text = script_[i];
      ++r.stats.completion_tokens;
      if (!sink.on_output(std::move(out))) return cancel(r);
    }
    r.reason = FinishReason::kStop;
    ++finished_;
    return r;
  }

 private:
  GenerationResult cancel(GenerationResult r) {
    ++cancelled_;
    r.reason = FinishReason::kCancelled;
    return r;
  }

  std::vector<std::string> script_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::chrono::milliseconds delay_{0};
  std::atomic<int> started_{0}, cancelled_{0}, finished_{0};
};

}  // namespace pd::server::testing
