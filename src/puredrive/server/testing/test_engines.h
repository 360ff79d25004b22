// Engines for the server's unit tests: GatedEngine emits a fixed token script one output at a time and can
// be held at any point, so tests can catch a request queued, mid-prefill or mid-stream deterministically.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
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

  // While closed, generate() waits before output number `position` of its script: before the first one by
  // default (like a long prefill), or mid-stream, so that a test acts while the engine is known to be there.
  void close_gate(size_t position = 0) {
    std::lock_guard l(mu_);
    open_ = false;
    gate_at_ = position;
  }
  void open_gate() {
    {
      std::lock_guard l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // While held at the gate, emit an empty output every millisecond: a generation whose events never pause,
  // as a fast engine's do.
  void set_chatter(bool on) { chatter_ = on; }
  // The engine is held at the gate, and whether it saw its request cancelled while held there.
  bool at_gate() const { return at_gate_.load(); }
  bool cancel_seen_at_gate() const { return cancel_seen_at_gate_.load(); }
  int started() const { return started_.load(); }
  int cancelled() const { return cancelled_.load(); }
  int finished() const { return finished_.load(); }

  GenerationResult generate(const GenerationRequest& request, GenerationSink& sink) override {
    ++started_;
    GenerationResult r;
    r.stats.prompt_tokens = static_cast<int32_t>(request.prompt_ids.size());
    for (size_t i = 0; i < script_.size(); ++i) {
      wait_at_gate(i, sink);
      if (sink.cancelled()) return cancel(r);
      if (r.stats.completion_tokens >= request.max_tokens) {
        r.reason = FinishReason::kLength;
        ++finished_;
        return r;
      }
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
  void wait_at_gate(size_t position, GenerationSink& sink) {
    std::unique_lock l(mu_);
    if (position != gate_at_) return;
    at_gate_ = !open_;
    // Cancellation does not notify the gate: poll it. A chattering engine stays until the gate opens.
    while (!open_ && (chatter_ || !sink.cancelled())) {
      if (sink.cancelled()) cancel_seen_at_gate_ = true;
      cv_.wait_for(l, std::chrono::milliseconds(chatter_ ? 1 : 5));
      if (chatter_) {
        l.unlock();
        sink.on_output(GenerationOutput{});
        l.lock();
      }
    }
    if (sink.cancelled()) cancel_seen_at_gate_ = true;
    at_gate_ = false;
  }

  GenerationResult cancel(GenerationResult r) {
    ++cancelled_;
    r.reason = FinishReason::kCancelled;
    return r;
  }

  std::vector<std::string> script_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  size_t gate_at_ = 0;
  std::atomic<bool> chatter_{false}, at_gate_{false}, cancel_seen_at_gate_{false};
  std::atomic<int> started_{0}, cancelled_{0}, finished_{0};
};

}  // namespace pd::server::testing
