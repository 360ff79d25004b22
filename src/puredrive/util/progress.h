// Progress of a long job measured in bytes (writing, converting or loading a checkpoint). On a terminal, one
// line on stderr with a bar, rewritten in place; otherwise (a server log, CI) a log line at every tenth and
// one at the end, so that logs show the progress without a line per update.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace pd {

class Progress {
 public:
  enum class Mode { kAuto, kBar, kLines, kOff };  // kAuto: kBar when stderr is a terminal, else kLines

  Progress(std::string label, uint64_t total_bytes, Mode mode = Mode::kAuto);
  ~Progress();  // finish() if not yet done
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // done: bytes so far (monotonic). Called from one thread at a time.
  void update(uint64_t done);
  // The final report: "<label>: 37.00 GB in 12.3 s (3.01 GB/s)". Returns the elapsed seconds.
  double finish();
  double elapsed_seconds() const;

 private:
  void draw_bar(double fraction, double rate) const;

  std::string label_;
  uint64_t total_;
  Mode mode_;
  std::chrono::steady_clock::time_point start_;
  uint64_t done_ = 0;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
  bool finished_ = false;
};

// Calls poll() a few times a second on its own thread and reports the value to a Progress; stops (and
// reports once more) when destroyed.
class ProgressPoller {
 public:
  ProgressPoller(Progress& progress, std::function<uint64_t()> poll);
  ~ProgressPoller();
  ProgressPoller(const ProgressPoller&) = delete;
  ProgressPoller& operator=(const ProgressPoller&) = delete;

 private:
  Progress& progress_;
  std::function<uint64_t()> poll_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// "37.00 GB" (decimal units, as the rates are in GB/s).
std::string format_gb(double bytes);

}  // namespace pd
