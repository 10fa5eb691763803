// tests/cluster_process.h — child processes for the multi-process tests:
// start `kvmesh ...` (or mpirun, redis-cli) with stdout on a pipe, read its
// JSON event lines with a deadline, signal it, and always kill its whole
// process group on destruction so a failing test leaves nothing behind.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvmesh::testing {

class Process {
 public:
  Process() = default;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() { Kill(SIGKILL), Wait(std::chrono::seconds(5)); }

  // Starts argv[0] (a path) in its own process group. With merge_stderr its
  // stderr (the daemons' later JSON events) goes to the same pipe as stdout.
  // Started from the test's main thread, the child is SIGKILLed when the test
  // process dies, even by SIGKILL (ctest's timeout), when no destructor runs.
  // (PR_SET_PDEATHSIG fires when the forking *thread* exits, so a child
  // started from a helper thread that ends first does not get it.)
  bool Start(const std::vector<std::string>& argv, bool merge_stderr = false) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    const pid_t parent = ::getpid();
    const bool main_thread = ::gettid() == parent;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      if (main_thread) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);  // the test died before prctl
      }
      ::setpgid(0, 0);
      ::dup2(fds[1], 1);
      if (merge_stderr) ::dup2(fds[1], 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
    ::close(fds[1]);
    out_ = fds[0];
    ::fcntl(out_, F_SETFL, O_NONBLOCK);
    return true;
  }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }

  // The next stdout line, or nullopt at the deadline / EOF.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || out_ < 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[4096];
      ssize_t n = ::read(out_, b, sizeof(b));
      if (n > 0) buf_.append(b, static_cast<size_t>(n));
      else if (n == 0) {
        ::close(out_);
        out_ = -1;
      }
    }
  }

  // The next line that is a JSON object whose "event" is `event`.
  std::optional<nlohmann::json> WaitEvent(const std::string& event, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto line = ReadLine(left);
      if (!line) return std::nullopt;
      auto j = nlohmann::json::parse(*line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("event", "") == event) return j;
    }
  }

  // Signals the process itself (mpirun forwards it to its ranks). SIGSTOP
  // returns once every thread of the process is stopped (see WaitStopped).
  void Signal(int sig) {
    if (!running()) return;
    ::kill(pid_, sig);
    if (sig == SIGSTOP) WaitStopped(std::chrono::seconds(5));
  }

  // Signals the whole process group; SIGSTOP as in Signal.
  void Kill(int sig) {
    if (!running()) return;
    ::kill(-pid_, sig);
    if (sig == SIGSTOP) WaitStopped(std::chrono::seconds(5));
  }

  // kill(SIGSTOP) only queues the stop: the thread that takes it tells the
  // others, and until they run and stop, a thread woken by a request can still
  // answer it (seen in CI: a lookup right after SIGSTOP found a block). True
  // once /proc shows every thread of the process stopped ('T' or 't').
  bool WaitStopped(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
    for (;;) {
      bool all = true, any = false;
      if (DIR* d = ::opendir(dir.c_str())) {
        while (dirent* e = ::readdir(d)) {
          if (e->d_name[0] == '.') continue;
          any = true;
          all = all && TaskStopped(dir + "/" + e->d_name + "/stat");
        }
        ::closedir(d);
      }
      if (any && all) return true;
      if (!any || std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // Exit status (as from waitpid) or nullopt if still running at the deadline.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    if (exited_) return status_;
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        status_ = st;
        if (out_ >= 0) ::close(out_), out_ = -1;
        return st;
      }
      if (std::chrono::steady_clock::now() >= end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  // The state letter of /proc/PID/task/TID/stat follows "(comm) ".
  static bool TaskStopped(const std::string& stat) {
    char buf[512];
    const int fd = ::open(stat.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;  // the thread is gone
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return true;
    buf[n] = '\0';
    const char* paren = std::strrchr(buf, ')');
    return paren == nullptr || paren[1] == '\0' || paren[2] == 'T' || paren[2] == 't' || paren[2] == 'Z';
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
  bool exited_ = false;
  int status_ = 0;
};

// Runs argv to its end and returns everything it printed (stdout; stderr too
// with merge_stderr), or nullopt when it could not start or had not ended
// `timeout` (+1 s) later (it is killed then, by ~Process).
inline std::optional<std::string> RunToEnd(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                                           bool merge_stderr = false) {
  using namespace std::chrono_literals;
  Process p;
  if (!p.Start(argv, merge_stderr)) return std::nullopt;
  std::string out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    auto line = p.ReadLine(100ms);
    if (line)
      out += *line + "\n";
    else if (p.Wait(0ms))
      break;
  }
  while (auto line = p.ReadLine(10ms)) out += *line + "\n";
  if (!p.Wait(1s)) return std::nullopt;
  return out;
}

// The cluster config of issue 39's reproduction: a coordinator and two nodes
// (n0, n1) of 128 MiB on 127.0.0.1 storing 1 MiB blocks of model `model_id`,
// cluster token `secret`, and tenants alice (8 MiB quota, token alice-token)
// and bob (64 MiB, bob-token).
inline nlohmann::json Issue39Cluster(const std::string& name, const std::string& model_id, const std::string& secret) {
  return {{"name", name},
          {"model",
           {{"model_id", model_id}, {"num_layers", 4}, {"num_kv_heads", 4}, {"head_dim", 64}, {"dtype", "fp16"},
            {"block_tokens", 16}}},
          {"nodes",
           {{{"id", "n0"}, {"host", "127.0.0.1"}, {"memory", {{"host", "128MiB"}}}},
            {{"id", "n1"}, {"host", "127.0.0.1"}, {"memory", {{"host", "128MiB"}}}}}},
          {"store", {{"slot_bytes", "1MiB"}}},
          {"transport", {{"timeout_ms", 2000}}},
          {"coordinator", {{"host", "127.0.0.1"}, {"port", 0}, {"heartbeat_ms", 200}, {"dead_after_ms", 1000}}},
          {"auth",
           {{"token", secret},
            {"tenants",
             {{{"name", "alice"}, {"token", "alice-token"}, {"quota", "8MiB"}},
              {{"name", "bob"}, {"token", "bob-token"}, {"quota", "64MiB"}}}}}}};
}

}  // namespace kvmesh::testing
