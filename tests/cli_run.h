// Runs the puredrive binary under test (PD_BINARY, defined by the test's CMake target) and captures what it
// prints, for the command-line tests.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace pd::test {

struct CliRun {
  int rc = -1;      // exit status; -1 when the process did not exit normally
  std::string out;  // stdout, and stderr too when asked
};

// `PD_BINARY args` through the shell; stderr is merged into out when with_stderr, else discarded.
inline CliRun run_cli(const std::string& args, bool with_stderr) {
  CliRun r;
  const std::string cmd = std::string(PD_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace pd::test
