// Subprocess: a child process owned by an RAII handle.
//
// The destructor kills (SIGKILL) and reaps a child that is still running, so a failing test
// or launcher never leaves processes behind. Thread-safety: one owner at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace parasol {

class Subprocess {
 public:
  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  // Starts argv[0] (a path) with `argv`. When `log_path` is not empty, the child's stdout and
  // stderr are appended to that file.
  static Result<Subprocess> Spawn(const std::vector<std::string>& argv,
                                  const std::string& log_path = "");
  // Starts argv[0] with its stdout and stderr going into a pipe; output_fd() reads it.
  static Result<Subprocess> SpawnPiped(const std::vector<std::string>& argv);

  // The read end of the output pipe (SpawnPiped), or -1. Owned by this object.
  int output_fd() const { return output_fd_; }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_status_; }

  // Sends `signal` if the child still runs.
  void Signal(int signal);

  // Waits up to `timeout` for the child to exit. Returns its wait status (as from waitpid), or
  // an empty optional on time-out.
  std::optional<int> Wait(std::chrono::milliseconds timeout);

  // Non-blocking: the wait status if the child has exited.
  std::optional<int> Poll();

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  int output_fd_ = -1;
};

// "exited with code 3", "killed by signal 9".
std::string DescribeWaitStatus(int status);

// Resident memory of process `pid` in bytes (VmRSS of /proc/PID/status), or 0.
uint64_t ResidentBytes(pid_t pid);

}  // namespace parasol
