// The single engine stream: a bounded FIFO of requests and the one thread that owns the engine.
// HTTP threads submit() and then pull their request's events from its RequestHandle; they never touch the
// engine. cancel() takes a queued request out of the queue at once and makes a running one stop before its
// next token (the engine polls GenerationSink::cancelled()). Stop strings are matched here, on the engine
// thread, so the engine stops as soon as one appears.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "puredrive/server/engine_port.h"
#include "puredrive/server/metrics.h"

namespace pd::server {

struct StreamEvent {
  enum class Kind { kOutput, kFinished };
  Kind kind = Kind::kOutput;
  GenerationOutput output;  // kOutput
  GenerationResult result;  // kFinished: always the last event of a request
};

struct SchedulerState;

class RequestHandle {
 public:
  explicit RequestHandle(std::string id) : id_(std::move(id)) {}
  RequestHandle(const RequestHandle&) = delete;
  RequestHandle& operator=(const RequestHandle&) = delete;

  const std::string& id() const { return id_; }
  // The next event, waiting at most `timeout`; nullopt when none came in time.
  std::optional<StreamEvent> next(std::chrono::milliseconds timeout);
  // Idempotent. The kFinished event (reason kCancelled unless the request had already finished) follows.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  bool started() const { return started_.load(); }  // the engine took it off the queue
  double queue_seconds() const { return queue_seconds_.load(); }

 private:
  friend class Scheduler;
  friend class HandleSink;
  friend struct SchedulerState;
  void push(StreamEvent event);

  const std::string id_;
  std::weak_ptr<SchedulerState> scheduler_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> started_{false};
  std::atomic<double> queue_seconds_{0.0};
};

class Scheduler {
 public:
  // max_queue: how many requests may wait while one runs; further submits are refused.
  Scheduler(Engine& engine, size_t max_queue, Metrics* metrics);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // nullptr when the queue is full or the scheduler is shutting down.
  std::shared_ptr<RequestHandle> submit(GenerationRequest request, std::vector<std::string> stop_strings);
  QueueGauges gauges() const;
  // Refuses new work, cancels the queued and the running request and joins the engine thread.
  void shutdown();

 private:
  void engine_loop();

  Engine& engine_;
  std::shared_ptr<SchedulerState> state_;
  std::thread thread_;
};

}  // namespace pd::server
