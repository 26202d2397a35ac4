// Test support for tests that run a helper program and act on it (kill it, signal it, freeze it) at a point of its
// work, or cap the size of the files it may write (a disk that fills up): the program reports its progress as lines
// on stdout, and the test waits for the line it needs, never for an amount of time. The only clock is a hang guard, a
// bound so generous that only a hung program reaches it, so that a hang fails the test instead of stalling CI; no
// test asserts how fast the machine is.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace dapo::test {

// Only against hangs: a correct run on the slowest machine stays far below it.
inline constexpr std::chrono::seconds kHangGuard{600};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct SpawnOptions {
  // Each name is removed from the inherited environment, then set when it has a value.
  std::vector<std::pair<std::string, std::optional<std::string>>> environment;
  bool pipe_stdout = false;           // read it with Child::read_line
  std::filesystem::path stdout_file;  // else stdout goes here (empty: inherited)
  std::filesystem::path stderr_file;  // empty: inherited
  // RLIMIT_FSIZE of the child (bytes), with SIGXFSZ ignored there (an ignored signal stays ignored across exec), so
  // that a write beyond the limit fails with EFBIG instead of killing it: a disk that fills up, for one process.
  std::optional<rlim_t> file_size_limit;
};

// A child process; one still running when the object goes is killed (SIGKILL) and reaped, so that a failed REQUIRE
// leaves no stray process behind.
class Child {
 public:
  Child(const std::vector<std::string>& arguments, const SpawnOptions& options = {}) {
    REQUIRE(!arguments.empty());
    std::vector<std::string> environment;
    for (char** variable = environ; *variable != nullptr; ++variable) {
      const std::string text = *variable;
      bool replaced = false;
      for (const auto& [name, value] : options.environment) replaced = replaced || text.rfind(name + "=", 0) == 0;
      if (!replaced) environment.push_back(text);
    }
    for (const auto& [name, value] : options.environment) {
      if (value) environment.push_back(name + "=" + *value);
    }
    std::vector<std::string> args = arguments;
    std::vector<char*> argv, envp;
    for (auto& text : args) argv.push_back(text.data());
    argv.push_back(nullptr);
    for (auto& text : environment) envp.push_back(text.data());
    envp.push_back(nullptr);

    int pipe_fds[2] = {-1, -1};
    if (options.pipe_stdout) REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (options.pipe_stdout) {
      posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    } else if (!options.stdout_file.empty()) {
      posix_spawn_file_actions_addopen(&actions, 1, options.stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (!options.stderr_file.empty()) {
      posix_spawn_file_actions_addopen(&actions, 2, options.stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    int error = 0;
    if (options.file_size_limit) {
      // posix_spawn cannot set a resource limit: fork, then only async-signal-safe calls until exec.
      pid_ = ::fork();
      if (pid_ == 0) {
        if (options.pipe_stdout) ::dup2(pipe_fds[1], 1);
        const auto redirect = [](const std::filesystem::path& file, int fd) {
          if (file.empty()) return;
          const int opened = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          if (opened < 0) return;
          ::dup2(opened, fd);
          ::close(opened);
        };
        if (!options.pipe_stdout) redirect(options.stdout_file, 1);
        redirect(options.stderr_file, 2);
        const rlimit limit{*options.file_size_limit, *options.file_size_limit};
        ::setrlimit(RLIMIT_FSIZE, &limit);
        ::signal(SIGXFSZ, SIG_IGN);
        ::execve(args[0].c_str(), argv.data(), envp.data());
        ::_exit(127);
      }
      error = pid_ < 0 ? errno : 0;
    } else {
      error = posix_spawn(&pid_, args[0].c_str(), &actions, nullptr, argv.data(), envp.data());
    }
    posix_spawn_file_actions_destroy(&actions);
    if (options.pipe_stdout) {
      ::close(pipe_fds[1]);  // ours: the child holds the only write end, so its exit is our end of file
      stdout_ = pipe_fds[0];
    }
    REQUIRE_MESSAGE(error == 0, "cannot start " << args[0] << ": " << std::strerror(error));
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_ >= 0) ::close(stdout_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int number) const { ::kill(pid_, number); }

  // The next line the child wrote to its stdout (without the newline); nothing once it closed its stdout (exited).
  std::optional<std::string> read_line() {
    REQUIRE(stdout_ >= 0);
    const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
    for (;;) {
      const std::size_t end = pending_.find('\n');
      if (end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd ready{stdout_, POLLIN, 0};
      const int polled = ::poll(&ready, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (polled < 0 && errno == EINTR) continue;
      REQUIRE_MESSAGE(polled > 0, "no output from process " << pid_ << " within the hang guard of "
                                                            << kHangGuard.count() << " s: it hangs");
      char buffer[4096];
      const ssize_t got = ::read(stdout_, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        if (pending_.empty()) return std::nullopt;
        std::string line = std::move(pending_);
        pending_.clear();
        return line;
      }
      pending_.append(buffer, static_cast<std::size_t>(got));
    }
  }

  // Reads lines until one equals `line`; fails the test (showing what came instead) if the child ends first.
  void wait_for_line(const std::string& line) {
    std::string seen;
    while (const auto next = read_line()) {
      if (*next == line) return;
      seen += *next + "\n";
    }
    FAIL("process " << pid_ << " ended without printing \"" << line << "\"; it printed:\n" << seen);
  }

  // Waits until the child has stopped (SIGSTOP, raised by itself or sent).
  void wait_stopped() {
    const int status = wait_status(WUNTRACED);
    REQUIRE_MESSAGE(WIFSTOPPED(status), "process " << pid_ << " ended (status " << status << ") instead of stopping");
  }

  // Waits until the child exits: its exit status, or 128 + the signal that killed it.
  int wait() {
    const int status = wait_status(0);
    exited_ = true;
    killed_by_signal_ = WIFSIGNALED(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // After wait(): whether a signal ended the child (wait() gives 128 + signal either way; a program that handles
  // SIGTERM and exits with 143 itself returns false here).
  bool killed_by_signal() const { return killed_by_signal_; }

 private:
  // waitpid on a thread, so that the hang guard can bound it without polling.
  int wait_status(int flags) {
    REQUIRE_FALSE(exited_);
    auto waited = std::async(std::launch::async, [pid = pid_, flags] {
      int status = 0;
      while (::waitpid(pid, &status, flags) < 0 && errno == EINTR) {
      }
      return status;
    });
    if (waited.wait_for(kHangGuard) != std::future_status::ready) {
      ::kill(pid_, SIGKILL);  // ends the wait above
      exited_ = true;
      waited.get();
      FAIL("process " << pid_ << " still running after the hang guard of " << kHangGuard.count() << " s: it hangs");
    }
    return waited.get();
  }

  pid_t pid_ = -1;
  int stdout_ = -1;
  bool exited_ = false;
  bool killed_by_signal_ = false;
  std::string pending_;
};

}  // namespace dapo::test
