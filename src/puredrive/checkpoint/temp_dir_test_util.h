// Test-only: a temporary directory and a file writer for tests that write checkpoints.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "puredrive/util/status.h"

namespace pd::testing_util {

// A directory under $TMPDIR (or /tmp) removed when the object dies.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/pd_checkpoint_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    PD_ASSERT(::mkdtemp(buf.data()) != nullptr, "mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  PD_ASSERT(f != nullptr, "cannot write {}", path);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

}  // namespace pd::testing_util
