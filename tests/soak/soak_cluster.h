// tests/soak/soak_cluster.h — the soak's real cluster: a `kvmesh coordinator`
// and N `kvmesh node` daemons as child processes on 127.0.0.1 with run-time
// ports (the listening JSON line names them), each in its own process group
// with its stderr in a log file, killed whole on destruction.
//
// Children are started with posix_spawn (nothing runs between fork and exec
// in this multithreaded process), with every other fd closed and SIGPIPE back
// at its default, so a daemon never holds a copy of a client's socket.
//
// Thread-safety: Daemon and Cluster are driven by one thread at a time (the
// main thread, then the chaos thread); generation() and dead_generation()
// may be read from any.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvmesh/status.h"
#include "soak.h"

namespace kvmesh::soak {

class Daemon {
 public:
  Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon();

  // Starts argv (argv[0] a path) in its own process group; stdout on a pipe,
  // stderr appended to log_path.
  Status Start(const std::vector<std::string>& argv, const std::string& log_path);
  // The next stdout line that is a JSON object with "event" == event.
  std::optional<nlohmann::json> WaitEvent(const std::string& event, std::chrono::milliseconds timeout);
  // Signals the whole process group.
  void Signal(int sig);
  // The wait status once it exited (nullopt: still running at the deadline).
  std::optional<int> Reap(std::chrono::milliseconds timeout);
  bool running() const { return pid_ > 0 && !exited_; }
  pid_t pid() const { return pid_; }
  // The last bytes of its log, for a report.
  std::string LogTail(size_t bytes) const;

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_, log_;
  bool exited_ = false;
  int status_ = 0;
};

// SIGKILLs every process group a Daemon started and has not reaped (for a
// watchdog: callable from any thread).
void KillAllDaemons();

// "exited 0", "killed by SIGSEGV", ...
std::string DescribeWaitStatus(int status);

struct NodeSlot {
  std::string id;
  std::unique_ptr<Daemon> proc;
  uint16_t data_port = 0;
  bool down = false;  // killed on purpose and not restarted yet
  std::atomic<uint64_t> generation{0};  // bumped before every deliberate SIGKILL
  // The generation whose process is known dead (reaped): a handle of an older
  // generation cannot reach its old process any more once this caught up.
  std::atomic<uint64_t> dead_generation{0};
};

class Cluster {
 public:
  Cluster(const Options& o, Invariants& inv);
  ~Cluster();  // kills every process group

  // Writes the config and starts the coordinator and every node; waits
  // until the coordinator lists them all.
  Status Start();
  std::string coordinator() const { return "127.0.0.1:" + std::to_string(coord_port_); }
  size_t size() const { return nodes_.size(); }
  NodeSlot& node(size_t i) { return *nodes_[i]; }
  // Index of node id "n<i>", or -1.
  int IndexOf(const std::string& id) const;
  uint64_t generation(size_t i) const { return nodes_[i]->generation.load(); }
  uint64_t dead_generation(size_t i) const { return nodes_[i]->dead_generation.load(); }

  Status StartNode(size_t i);
  // SIGKILL (the generation is bumped first); checks it died of it.
  void KillNode(size_t i);
  // SIGKILL the coordinator (checks it died of it), and start a new one on
  // the same port: nodes re-register, clients refresh their map.
  void KillCoordinator();
  Status RestartCoordinator();
  // Nodes the coordinator lists now (-1: no answer).
  int LiveNodes();
  bool WaitNodes(size_t n, std::chrono::milliseconds timeout);
  // Reaps daemons that exited without being killed on purpose: each is a
  // violation (with its exit status and log tail) and is started again.
  void CheckExits(Stats& st);
  // SIGTERM to every daemon: each must print "stopped" and exit 0.
  void StopAll();
  const std::string& work_dir() const { return dir_; }

 private:
  const Options& o_;
  Invariants& inv_;
  std::string dir_, config_path_;
  std::unique_ptr<Daemon> coord_ = std::make_unique<Daemon>();
  uint16_t coord_port_ = 0;
  bool coord_down_ = false;  // killed on purpose and not restarted yet
  std::vector<std::unique_ptr<NodeSlot>> nodes_;
};

}  // namespace kvmesh::soak
