#include "puredrive/util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "puredrive/util/log.h"

namespace pd {

std::string format_gb(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.1f} kB", bytes / 1e3);
}

Progress::Progress(std::string label, uint64_t total_bytes, Mode mode)
    : label_(std::move(label)), total_(total_bytes), mode_(mode), start_(std::chrono::steady_clock::now()) {
  if (mode_ == Mode::kAuto) mode_ = isatty(fileno(stderr)) != 0 ? Mode::kBar : Mode::kLines;
}

Progress::~Progress() {
  if (!finished_) finish();
}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(uint64_t done) {
  if (mode_ == Mode::kOff || finished_) return;
  done_ = std::max(done_, std::min(done, total_));
  const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const double secs = elapsed_seconds();
  const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0.0;
  if (mode_ == Mode::kBar) {
    const auto now = std::chrono::steady_clock::now();
    if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw_bar(frac, rate);
    return;
  }
  const int tenth = static_cast<int>(frac * 10.0);
  if (tenth == last_tenth_ || done_ == total_) return;  // the end is finish()'s line
  last_tenth_ = tenth;
  if (tenth == 0) return;
  PD_LOG_INFO("{}: {}% ({} of {}, {}/s)", label_, tenth * 10, format_gb(static_cast<double>(done_)),
              format_gb(static_cast<double>(total_)), format_gb(rate));
}

void Progress::draw_bar(double frac, double rate) const {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  fmt::print(stderr, "\r{}: [{}{}] {:5.1f}%  {} of {}, {}/s ", label_, std::string(filled, '#'),
             std::string(kWidth - filled, '.'), 100.0 * frac, format_gb(static_cast<double>(done_)),
             format_gb(static_cast<double>(total_)), format_gb(rate));
  std::fflush(stderr);
}

double Progress::finish() {
  const double secs = elapsed_seconds();
  if (finished_) return secs;
  if (mode_ == Mode::kBar) {
    draw_bar(total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0,
             secs > 0 ? static_cast<double>(done_) / secs : 0.0);
    fmt::print(stderr, "\n");
  }
  finished_ = true;
  if (mode_ != Mode::kOff) {
    PD_LOG_INFO("{}: {} in {:.1f} s ({}/s)", label_, format_gb(static_cast<double>(done_)), secs,
                format_gb(secs > 0 ? static_cast<double>(done_) / secs : 0.0));
  }
  return secs;
}

ProgressPoller::ProgressPoller(Progress& progress, std::function<uint64_t()> poll)
    : progress_(progress), poll_(std::move(poll)) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (!stop_) progress_.update(poll_());
    }
  });
}

ProgressPoller::~ProgressPoller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  progress_.update(poll_());
}

}  // namespace pd
