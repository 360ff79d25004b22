#include "cli/bench_common.h"

#include <algorithm>
#include <ctime>
#include <fstream>

#include <fmt/format.h>

#ifdef PD_HAVE_CUDA
#include "puredrive/backend/cuda/cuda_backend.h"
#endif

namespace pd::cli {

void bench_fail(const Status& s) {
  fmt::print(stderr, "puredrive bench: {}\n", s.message());
  throw CLI::RuntimeError(1);
}

Expected<std::vector<int>> parse_contexts(const std::string& text) {
  std::vector<int> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    int64_t mult = 1;
    if (!item.empty() && (item.back() == 'k' || item.back() == 'K')) {
      mult = 1024;
      item.pop_back();
    }
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v <= 0 || v * mult > (1 << 24)) throw std::out_of_range("context");
      out.push_back(static_cast<int>(v * mult));
    } catch (const std::exception&) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--contexts: '{}' is not a context size like 2k or 32768", text.substr(i, j - i));
    }
    i = j + 1;
  }
  if (out.empty()) return make_error(ErrorCode::kInvalidArgument, "--contexts is empty");
  return out;
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double copy_bandwidth(Backend& be, int64_t bytes) {
  Buffer a = bench_check(be.alloc(DType::kU8, 1, bytes)), b = bench_check(be.alloc(DType::kU8, 1, bytes));
  for (int i = 0; i < 2; ++i) bench_check(be.copy(b.tensor(), a.tensor()));
  bench_check(be.synchronize());
  const int n = 10;
  std::vector<double> times;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
      bench_check(be.copy(i % 2 == 0 ? b.tensor() : a.tensor(), i % 2 == 0 ? a.tensor() : b.tensor()));
    bench_check(be.synchronize());
    times.push_back(seconds(t0, Clock::now()));
  }
  return 2.0 * static_cast<double>(bytes) * n / median(times);
}

nlohmann::json device_json(const Backend& be) {
  nlohmann::json device = {{"backend", be.name()}};
#ifdef PD_HAVE_CUDA
  if (std::optional<CudaDeviceInfo> d = cuda_device_info(be)) {
    device = {{"backend", be.name()},
              {"name", d->name},
              {"compute_capability", fmt::format("{}.{}", d->compute_major, d->compute_minor)},
              {"multiprocessors", d->multiprocessors},
              {"memory_bytes", d->total_memory},
              {"cuda_driver_version", d->driver_version},
              {"cuda_runtime_version", d->runtime_version}};
  }
#endif
  return device;
}

void write_record(const std::string& path, const nlohmann::json& record) {
  if (path.empty()) return;
  std::ofstream f(path);
  f << record.dump(2) << "\n";
  if (!f) bench_fail(make_error(ErrorCode::kIo, "cannot write --json {}", path));
}

}  // namespace pd::cli
