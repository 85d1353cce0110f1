#include "common/subprocess.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

extern char** environ;

namespace parasol {

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), exit_status_(other.exit_status_), output_fd_(other.output_fd_) {
  other.pid_ = -1;
  other.exit_status_.reset();
  other.output_fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    this->~Subprocess();
    pid_ = other.pid_;
    exit_status_ = other.exit_status_;
    output_fd_ = other.output_fd_;
    other.pid_ = -1;
    other.exit_status_.reset();
    other.output_fd_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
  if (output_fd_ >= 0) ::close(output_fd_);
  output_fd_ = -1;
}

Result<Subprocess> Subprocess::SpawnPiped(const std::vector<std::string>& argv) {
  if (argv.empty()) return InvalidArgument("Subprocess::SpawnPiped: empty argv");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return IoError(std::string("pipe: ") + std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return IoError("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  Subprocess p;
  p.pid_ = pid;
  p.output_fd_ = fds[0];
  return p;
}

Result<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                     const std::string& log_path) {
  if (argv.empty()) return InvalidArgument("Subprocess::Spawn: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return IoError("cannot start " + argv[0] + ": " + std::strerror(rc));
  Subprocess p;
  p.pid_ = pid;
  return p;
}

void Subprocess::Signal(int signal) {
  if (running()) ::kill(pid_, signal);
}

std::optional<int> Subprocess::Poll() {
  if (exit_status_ || pid_ <= 0) return exit_status_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_status_ = status;
  return exit_status_;
}

std::optional<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto s = Poll()) return s;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped (status " + std::to_string(status) + ")";
}

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace parasol
