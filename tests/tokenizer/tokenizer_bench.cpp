// Encode speed of the C++ tokenizer on the reference corpus, single thread (bench/tokenizer.md).
// Usage: tokenizer_bench MODEL_DIR (CORPUS.jsonl | TEXT_FILE) [PASSES]
// A .jsonl file gives the "text" of each line (the reference corpus); any other file is one string
// per line, newline included.
// Prints load CPU time, and MB/s (per CPU second) of encoding every corpus string separately: the first pass
// (empty per-word cache) and the best of the later passes (warm cache).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "puredrive/tokenizer/tokenizer.h"

namespace {

// CPU time of this thread: the build machines are shared, so wall time measures the neighbours too.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR (CORPUS.jsonl | TEXT_FILE) [PASSES]\n", argv[0]);
    return 2;
  }
  const int passes = argc > 3 ? std::max(2, std::atoi(argv[3])) : 5;
  std::vector<std::string> texts;
  size_t bytes = 0;
  {
    const std::string path = argv[2];
    const bool jsonl = path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (jsonl) {
        if (line.empty()) continue;
        texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
      } else {
        texts.push_back(line + (in.eof() ? "" : "\n"));
        if (texts.back().empty()) texts.pop_back();
      }
    }
    for (const auto& t : texts) bytes += t.size();
  }
  double best_load = 1e9;
  for (int i = 0; i < 3; ++i) {
    const double t0 = cpu_seconds();
    auto t = pd::Tokenizer::load(argv[1]);
    if (!t) {
      std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
      return 1;
    }
    best_load = std::min(best_load, cpu_seconds() - t0);
  }
  auto tok = pd::Tokenizer::load(argv[1]);
  size_t n_ids = 0;
  double first = 0, best = 1e9;
  for (int p = 0; p < passes; ++p) {
    n_ids = 0;
    const double t0 = cpu_seconds();
    for (const auto& s : texts) n_ids += tok->encode(s, true)->size();
    const double dt = cpu_seconds() - t0;
    if (p == 0)
      first = dt;
    else
      best = std::min(best, dt);
  }
  const double mb = static_cast<double>(bytes) / 1e6;
  std::printf("strings %zu, %.3f MB, %zu tokens\n", texts.size(), mb, n_ids);
  std::printf("load (best of 3): %.3f CPU s\n", best_load);
  std::printf("encode, first pass (cold cache): %.3f CPU s, %.2f MB/s\n", first, mb / first);
  std::printf("encode, best later pass (warm cache): %.3f CPU s, %.2f MB/s\n", best, mb / best);
  return 0;
}
