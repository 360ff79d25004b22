#include "puredrive/server/metrics.h"

#include <fmt/format.h>

namespace pd::server {
namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <typename T>
void sample(std::string& out, const char* name, T value) {
  out += fmt::format("{} {}\n", name, value);
}

}  // namespace

void Metrics::on_http_response(std::string_view endpoint, int status) {
  std::lock_guard lock(mu_);
  ++http_[{std::string(endpoint), status}];
}

void Metrics::on_error(std::string_view type) {
  std::lock_guard lock(mu_);
  ++errors_[std::string(type)];
}

void Metrics::on_admitted() {
  std::lock_guard lock(mu_);
  ++admitted_;
}

void Metrics::on_generation(const GenerationResult& result, double queue_seconds) {
  std::lock_guard lock(mu_);
  const GenerationStats& s = result.stats;
  ++finished_[finish_reason_name(result.reason)];
  prompt_tokens_ += static_cast<uint64_t>(s.prompt_tokens);
  cached_prompt_tokens_ += static_cast<uint64_t>(s.cached_prompt_tokens);
  completion_tokens_ += static_cast<uint64_t>(s.completion_tokens);
  decode_steps_ += static_cast<uint64_t>(s.decode_steps);
  draft_tokens_ += static_cast<uint64_t>(s.draft_tokens);
  accepted_draft_tokens_ += static_cast<uint64_t>(s.accepted_draft_tokens);
  prefill_seconds_ += s.prefill_seconds;
  decode_seconds_ += s.decode_seconds;
  queue_seconds_ += queue_seconds;
  if (const double tps = s.decode_tokens_per_second(); tps > 0) last_decode_tps_ = tps;
  if (result.prefix_cache) prefix_cache_ = *result.prefix_cache;
}

std::string Metrics::render(const QueueGauges& queue) const {
  std::lock_guard lock(mu_);
  std::string out;
  header(out, "puredrive_http_requests_total", "counter", "HTTP responses by endpoint and status code.");
  for (const auto& [key, n] : http_) {
    out += fmt::format("puredrive_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  header(out, "puredrive_errors_total", "counter", "Error responses and failed streams by error type.");
  for (const auto& [type, n] : errors_) {
    out += fmt::format("puredrive_errors_total{{type=\"{}\"}} {}\n", type, n);
  }
  header(
      out, "puredrive_generations_admitted_total", "counter",
      "Requests accepted into the queue; each ends in puredrive_generations_total, so admitted = the sum of "
      "generations_total + queue_length + requests_running.");
  sample(out, "puredrive_generations_admitted_total", admitted_);
  header(out, "puredrive_generations_total", "counter", "Finished generations by finish reason.");
  for (const auto& [reason, n] : finished_) {
    out += fmt::format("puredrive_generations_total{{reason=\"{}\"}} {}\n", reason, n);
  }
  header(out, "puredrive_prompt_tokens_total", "counter", "Prompt tokens of finished generations.");
  sample(out, "puredrive_prompt_tokens_total", prompt_tokens_);
  header(out, "puredrive_cached_prompt_tokens_total", "counter",
         "Prompt tokens served from the prefix cache (its hit tokens).");
  sample(out, "puredrive_cached_prompt_tokens_total", cached_prompt_tokens_);
  header(out, "puredrive_generation_tokens_total", "counter", "Generated (sampled) tokens.");
  sample(out, "puredrive_generation_tokens_total", completion_tokens_);
  header(out, "puredrive_prefill_seconds_total", "counter", "Time spent in prefill.");
  sample(out, "puredrive_prefill_seconds_total", prefill_seconds_);
  header(out, "puredrive_decode_seconds_total", "counter", "Time spent decoding after prefill.");
  sample(out, "puredrive_decode_seconds_total", decode_seconds_);
  header(out, "puredrive_queue_wait_seconds_total", "counter", "Time requests waited for the engine.");
  sample(out, "puredrive_queue_wait_seconds_total", queue_seconds_);
  header(out, "puredrive_decode_tokens_per_second", "gauge", "Decode speed of the last finished generation.");
  sample(out, "puredrive_decode_tokens_per_second", last_decode_tps_);
  header(out, "puredrive_decode_steps_total", "counter", "Target forward passes after prefill (MTP cycles).");
  sample(out, "puredrive_decode_steps_total", decode_steps_);
  header(out, "puredrive_mtp_draft_tokens_total", "counter", "Tokens proposed by the MTP head.");
  sample(out, "puredrive_mtp_draft_tokens_total", draft_tokens_);
  header(out, "puredrive_mtp_accepted_tokens_total", "counter", "MTP tokens accepted by verification.");
  sample(out, "puredrive_mtp_accepted_tokens_total", accepted_draft_tokens_);
  header(out, "puredrive_mtp_tokens_per_step", "gauge",
         "Tokens emitted per decode step: 1 + accepted draft tokens / decode steps, over all generations.");
  sample(out, "puredrive_mtp_tokens_per_step",
         decode_steps_ == 0 ? 0.0 : 1.0 + static_cast<double>(accepted_draft_tokens_) / decode_steps_);
  const PrefixCacheInfo& pc = prefix_cache_;
  header(out, "puredrive_prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.");
  sample(out, "puredrive_prefix_cache_lookups_total", pc.lookups);
  header(out, "puredrive_prefix_cache_hits_total", "counter", "Lookups that resumed from a cached prefix.");
  sample(out, "puredrive_prefix_cache_hits_total", pc.hits);
  header(out, "puredrive_prefix_cache_misses_total", "counter", "Lookups that found no cached prefix.");
  sample(out, "puredrive_prefix_cache_misses_total", pc.lookups - pc.hits);
  header(out, "puredrive_prefix_cache_evictions_total", "counter",
         "Prefix-cache blocks and state snapshots dropped for room.");
  sample(out, "puredrive_prefix_cache_evictions_total", pc.evictions);
  header(out, "puredrive_prefix_cache_demotions_total", "counter",
         "Prefix-cache blocks and state snapshots moved from device to host memory for room.");
  sample(out, "puredrive_prefix_cache_demotions_total", pc.demotions);
  header(out, "puredrive_prefix_cache_bytes", "gauge", "Bytes the prefix cache holds, by memory tier.");
  out += fmt::format("puredrive_prefix_cache_bytes{{tier=\"device\"}} {}\n", pc.device_bytes);
  out += fmt::format("puredrive_prefix_cache_bytes{{tier=\"host\"}} {}\n", pc.host_bytes);
  header(out, "puredrive_prefix_cache_budget_bytes", "gauge",
         "The prefix cache's budgets (--prefix-cache-mib, --prefix-cache-host-mib).");
  out += fmt::format("puredrive_prefix_cache_budget_bytes{{tier=\"device\"}} {}\n", pc.device_budget);
  out += fmt::format("puredrive_prefix_cache_budget_bytes{{tier=\"host\"}} {}\n", pc.host_budget);
  header(out, "puredrive_prefix_cache_blocks", "gauge", "Token blocks (KV rows) in the prefix cache.");
  sample(out, "puredrive_prefix_cache_blocks", pc.blocks);
  header(out, "puredrive_prefix_cache_snapshots", "gauge", "GDN state snapshots in the prefix cache.");
  sample(out, "puredrive_prefix_cache_snapshots", pc.snapshots);
  header(out, "puredrive_queue_length", "gauge", "Requests waiting for the engine.");
  sample(out, "puredrive_queue_length", queue.waiting);
  header(out, "puredrive_queue_capacity", "gauge", "Most requests that may wait (--max-queue).");
  sample(out, "puredrive_queue_capacity", queue.capacity);
  header(out, "puredrive_requests_running", "gauge",
         "Requests the engine is generating for (single stream).");
  sample(out, "puredrive_requests_running", queue.running);
  return out;
}

}  // namespace pd::server
