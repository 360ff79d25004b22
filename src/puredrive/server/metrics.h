// Server metrics in Prometheus text format (GET /metrics). Counters only grow; gauges are sampled when
// rendered. Thread-safe: HTTP threads and the engine thread update it concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "puredrive/server/engine_port.h"

namespace pd::server {

struct QueueGauges {
  size_t waiting = 0;   // requests queued for the engine
  size_t running = 0;   // 0 or 1: single stream
  size_t capacity = 0;  // --max-queue
};

class Metrics {
 public:
  // Every HTTP response, by route ("/v1/chat/completions", ..., "other") and status code.
  void on_http_response(std::string_view endpoint, int status);
  // Every error response or failed stream, by OpenAI error type ("invalid_request_error", ...).
  void on_error(std::string_view type);
  // Every request the scheduler accepted; each one ends in exactly one on_generation().
  void on_admitted();
  // Every generation the engine finished (including cancelled ones), with its time in the queue.
  void on_generation(const GenerationResult& result, double queue_seconds);

  std::string render(const QueueGauges& queue) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_;
  std::map<std::string, uint64_t> errors_;
  std::map<std::string, uint64_t> finished_;
  uint64_t admitted_ = 0;
  uint64_t prompt_tokens_ = 0;
  uint64_t cached_prompt_tokens_ = 0;
  uint64_t completion_tokens_ = 0;
  uint64_t decode_steps_ = 0;
  uint64_t draft_tokens_ = 0;
  uint64_t accepted_draft_tokens_ = 0;
  double prefill_seconds_ = 0.0;
  double decode_seconds_ = 0.0;
  double queue_seconds_ = 0.0;
  double last_decode_tps_ = 0.0;
  PrefixCacheInfo prefix_cache_;  // the latest an engine reported
};

}  // namespace pd::server
