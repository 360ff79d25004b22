#include "puredrive/server/scheduler.h"

#include <algorithm>
#include <exception>

#include "puredrive/server/stop_matcher.h"

namespace pd::server {

struct Job {
  GenerationRequest request;
  std::vector<std::string> stops;
  std::shared_ptr<RequestHandle> handle;
  std::chrono::steady_clock::time_point enqueued;
};

struct SchedulerState {
  size_t max_queue = 0;
  Metrics* metrics = nullptr;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  std::shared_ptr<RequestHandle> running;
  bool stopping = false;

  void finish_cancelled(const std::shared_ptr<RequestHandle>& handle, double queue_seconds);
};

namespace {

StreamEvent finished_event(GenerationResult result) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::kFinished;
  e.result = std::move(result);
  return e;
}

}  // namespace

// Delivers engine output to the request's handle through the stop-string matcher.
class HandleSink final : public GenerationSink {
 public:
  HandleSink(RequestHandle& handle, std::vector<std::string> stops, std::vector<int32_t> stop_ids)
      : handle_(handle), stop_(std::move(stops)), stop_ids_(std::move(stop_ids)) {}

  bool on_output(GenerationOutput output) override {
    if (handle_.cancelled()) return false;
    drop_stop_tokens(output);
    for (auto& o : stop_.push(std::move(output))) deliver(std::move(o));
    return !stop_.matched();
  }
  bool cancelled() const override { return handle_.cancelled() || stop_.matched(); }

  // Settles the finish reason and releases held text; the caller then pushes the kFinished event.
  GenerationResult settle(GenerationResult result) {
    if (stop_.matched()) {
      result.reason = FinishReason::kStop;  // the engine saw our refusal as a cancellation
      result.stop_string = stop_.matched_string();
    } else if (result.reason != FinishReason::kCancelled) {
      for (auto& o : stop_.flush()) deliver(std::move(o));
    }
    return result;
  }

 private:
  // An end-of-turn token ends the generation but is no part of the answer: clients see neither its id nor
  // its logprob (OpenAI's convention), whether or not the engine included it.
  void drop_stop_tokens(GenerationOutput& o) const {
    const bool aligned = o.logprobs.size() == o.token_ids.size();
    size_t kept = 0;
    for (size_t i = 0; i < o.token_ids.size(); ++i) {
      if (std::find(stop_ids_.begin(), stop_ids_.end(), o.token_ids[i]) != stop_ids_.end()) continue;
      if (kept != i) {  // no self-move: it would empty the strings
        o.token_ids[kept] = o.token_ids[i];
        if (aligned) o.logprobs[kept] = std::move(o.logprobs[i]);
      }
      ++kept;
    }
    o.token_ids.resize(kept);
    if (aligned) o.logprobs.resize(kept);
  }

  void deliver(GenerationOutput o) {
    StreamEvent e;
    e.output = std::move(o);
    handle_.push(std::move(e));
  }

  RequestHandle& handle_;
  StopMatcher stop_;
  std::vector<int32_t> stop_ids_;
};

void SchedulerState::finish_cancelled(const std::shared_ptr<RequestHandle>& handle, double queue_seconds) {
  GenerationResult r;
  r.reason = FinishReason::kCancelled;
  if (metrics) metrics->on_generation(r, queue_seconds);
  handle->push(finished_event(std::move(r)));
}

std::optional<StreamEvent> RequestHandle::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void RequestHandle::push(StreamEvent event) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void RequestHandle::cancel() {
  if (cancelled_.exchange(true)) return;
  auto state = scheduler_.lock();
  if (!state) return;
  std::unique_lock lock(state->mu);
  for (auto it = state->queue.begin(); it != state->queue.end(); ++it) {
    if (it->handle.get() != this) continue;
    auto handle = std::move(it->handle);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - it->enqueued).count();
    state->queue.erase(it);
    lock.unlock();
    state->finish_cancelled(handle, waited);
    return;
  }
}

Scheduler::Scheduler(Engine& engine, size_t max_queue, Metrics* metrics)
    : engine_(engine), state_(std::make_shared<SchedulerState>()) {
  state_->max_queue = max_queue;
  state_->metrics = metrics;
  thread_ = std::thread([this] { engine_loop(); });
}

Scheduler::~Scheduler() {
  shutdown();
}

std::shared_ptr<RequestHandle> Scheduler::submit(GenerationRequest request,
                                                 std::vector<std::string> stop_strings) {
  auto handle = std::make_shared<RequestHandle>(request.id);
  handle->scheduler_ = state_;
  {
    std::lock_guard lock(state_->mu);
    if (state_->stopping || state_->queue.size() >= state_->max_queue) return nullptr;
    state_->queue.push_back(
        Job{std::move(request), std::move(stop_strings), handle, std::chrono::steady_clock::now()});
    if (state_->metrics) state_->metrics->on_admitted();
  }
  state_->cv.notify_all();
  return handle;
}

QueueGauges Scheduler::gauges() const {
  std::lock_guard lock(state_->mu);
  return QueueGauges{.waiting = state_->queue.size(),
                     .running = state_->running ? size_t{1} : size_t{0},
                     .capacity = state_->max_queue};
}

void Scheduler::shutdown() {
  std::deque<Job> dropped;
  {
    std::lock_guard lock(state_->mu);
    if (state_->stopping && !thread_.joinable()) return;
    state_->stopping = true;
    dropped.swap(state_->queue);
    if (state_->running) state_->running->cancelled_.store(true);
  }
  state_->cv.notify_all();
  for (auto& job : dropped) {
    job.handle->cancelled_.store(true);
    state_->finish_cancelled(job.handle, 0.0);
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::engine_loop() {
  SchedulerState& st = *state_;
  for (;;) {
    Job job;
    {
      std::unique_lock lock(st.mu);
      st.cv.wait(lock, [&] { return st.stopping || !st.queue.empty(); });
      if (st.stopping) return;
      job = std::move(st.queue.front());
      st.queue.pop_front();
      st.running = job.handle;
    }
    RequestHandle& handle = *job.handle;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.enqueued).count();
    handle.queue_seconds_.store(waited);
    handle.started_.store(true);

    HandleSink sink(handle, std::move(job.stops), job.request.stop_token_ids);
    GenerationResult result;
    try {
      result = engine_.generate(job.request, sink);
    } catch (const std::exception& e) {
      result.reason = FinishReason::kError;
      result.error = std::string("engine failed: ") + e.what();
    }
    result = sink.settle(std::move(result));
    // Metrics and the running gauge are settled before the client can see the end of its request.
    if (st.metrics) st.metrics->on_generation(result, waited);
    {
      std::lock_guard lock(st.mu);
      st.running.reset();
    }
    handle.push(finished_event(std::move(result)));
  }
}

}  // namespace pd::server
