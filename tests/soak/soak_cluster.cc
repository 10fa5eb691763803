#include "soak_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/spawn.h"
#include "transport/http_client.h"


namespace kvmesh::soak {

using namespace std::chrono_literals;

namespace {
std::mutex g_groups_mu;
std::set<pid_t> g_groups;  // guarded by g_groups_mu: started, not reaped
}  // namespace

void KillAllDaemons() {
  std::lock_guard<std::mutex> lock(g_groups_mu);
  for (pid_t g : g_groups) ::kill(-g, SIGKILL);
}

Daemon::~Daemon() {
  Signal(SIGKILL);
  (void)Reap(5s);
  if (out_ >= 0) ::close(out_);
}

Status Daemon::Start(const std::vector<std::string>& argv, const std::string& log_path) {
  auto c = SpawnWithStdoutPipe(argv, log_path, /*append_log=*/true);
  if (!c.ok()) return c.status();
  const pid_t pid = c->pid;
  pid_ = pid;
  {
    std::lock_guard<std::mutex> lock(g_groups_mu);
    g_groups.insert(pid);
  }
  out_ = c->out;
  exited_ = false;
  buf_.clear();
  log_ = log_path;
  return Status::Ok();
}

std::optional<nlohmann::json> Daemon::WaitEvent(const std::string& event, std::chrono::milliseconds timeout) {
  const auto end = SteadyClock::now() + timeout;
  for (;;) {
    size_t nl;
    while ((nl = buf_.find('\n')) != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("event", "") == event) return j;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()).count();
    if (left <= 0 || out_ < 0) return std::nullopt;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char b[4096];
    const ssize_t n = ::read(out_, b, sizeof(b));
    if (n > 0) {
      buf_.append(b, static_cast<size_t>(n));
    } else if (n == 0) {
      ::close(out_);
      out_ = -1;
    }
  }
}

void Daemon::Signal(int sig) {
  if (running()) ::kill(-pid_, sig);
}

std::optional<int> Daemon::Reap(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return std::nullopt;
  if (exited_) return status_;
  const auto end = SteadyClock::now() + timeout;
  for (;;) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      exited_ = true;
      status_ = st;
      {
        std::lock_guard<std::mutex> lock(g_groups_mu);
        g_groups.erase(pid_);
      }
      if (out_ >= 0) ::close(out_), out_ = -1;
      return st;
    }
    if (SteadyClock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(5ms);
  }
}

std::string Daemon::LogTail(size_t bytes) const {
  std::ifstream f(log_, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

std::string DescribeWaitStatus(int st) {
  if (WIFEXITED(st)) return "exited " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by ") + ::sigabbrev_np(WTERMSIG(st));
  return "status " + std::to_string(st);
}

// ---- Cluster --------------------------------------------------------------------

Cluster::Cluster(const Options& o, Invariants& inv) : o_(o), inv_(inv) {
  dir_ = o.work_dir.empty() ? "/tmp/kvmesh-soak-" + std::to_string(::getpid()) : o.work_dir;
  ::mkdir(dir_.c_str(), 0755);
  config_path_ = dir_ + "/cluster.json";
  for (uint32_t i = 0; i < o.nodes; ++i) {
    nodes_.push_back(std::make_unique<NodeSlot>());
    nodes_.back()->id = "n" + std::to_string(i);
  }
}

Cluster::~Cluster() {
  for (auto& n : nodes_)
    if (n->proc) n->proc->Signal(SIGKILL);
  coord_->Signal(SIGKILL);
}

int Cluster::IndexOf(const std::string& id) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i]->id == id) return static_cast<int>(i);
  return -1;
}

Status Cluster::Start() {
  // A small fp16 model (8 KiB blocks), small budgets so eviction and
  // demotion work all the time, fast failure detection.
  nlohmann::json cfg = {
      {"name", "soak"},
      {"model", {{"model_id", "kvmesh-soak"}, {"num_layers", 2}, {"num_kv_heads", 2}, {"head_dim", 32},
                 {"dtype", "fp16"}, {"block_tokens", 16}}},
      {"store", {{"stripes", 4}, {"verify_checksums", true}}},
      {"transport", {{"backend", o_.transport}, {"io_threads", 2}, {"max_frame_bytes", "4MiB"},
                     {"timeout_ms", o_.timeout_ms}}},
      {"coordinator", {{"host", "127.0.0.1"}, {"port", 0}, {"heartbeat_ms", 100}, {"dead_after_ms", 600}}},
      {"sequences", {{"idle_timeout_ms", 30000}, {"max_sequences", 64}, {"max_sequence_tokens", 4096}}},
      {"placement", {{"replicas", o_.replicas}}},
  };
  for (auto& n : nodes_) {
    nlohmann::json mem = {{"device", o_.node_memory}};
    if (!o_.node_host.empty()) mem["host"] = o_.node_host;
    cfg["nodes"].push_back({{"id", n->id}, {"host", "127.0.0.1"},
                            {"ports", {{"data", 0}, {"http", 0}, {"resp", 0}}}, {"memory", mem}});
  }
  std::ofstream(config_path_) << cfg.dump(2);
  KVMESH_RETURN_IF_ERROR(coord_->Start({o_.kvmesh_bin, "coordinator", "--config", config_path_, "--port", "0"},
                                       dir_ + "/coordinator.log"));
  auto j = coord_->WaitEvent("listening", 10s);
  if (!j) return Unavailable("coordinator did not print its listening line: " + coord_->LogTail(2000));
  coord_port_ = (*j)["ports"]["http"].get<uint16_t>();
  for (size_t i = 0; i < nodes_.size(); ++i) KVMESH_RETURN_IF_ERROR(StartNode(i));
  if (!WaitNodes(nodes_.size(), 10s)) return Unavailable("the coordinator did not list every node");
  return Status::Ok();
}

Status Cluster::StartNode(size_t i) {
  NodeSlot& n = *nodes_[i];
  n.proc = std::make_unique<Daemon>();
  KVMESH_RETURN_IF_ERROR(n.proc->Start({o_.kvmesh_bin, "node", "--config", config_path_, "--id", n.id,
                                        "--coordinator", coordinator(), "--no-resp"},
                                       dir_ + "/" + n.id + ".log"));
  auto j = n.proc->WaitEvent("listening", 10s);
  if (!j) return Unavailable("node " + n.id + " did not print its listening line: " + n.proc->LogTail(2000));
  n.data_port = (*j)["ports"]["data"].get<uint16_t>();
  n.down = false;
  return Status::Ok();
}

void Cluster::KillNode(size_t i) {
  NodeSlot& n = *nodes_[i];
  n.generation.fetch_add(1);
  n.down = true;
  n.proc->Signal(SIGKILL);
  auto st = n.proc->Reap(5s);
  if (!st) {
    inv_.Violation("daemon_exit", n.id + " survived SIGKILL for 5 s");
  } else if (!(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL)) {
    inv_.Violation("daemon_exit", n.id + " had already " + DescribeWaitStatus(*st) + " before the SIGKILL");
  }
  if (st) n.dead_generation.store(n.generation.load());
}

void Cluster::KillCoordinator() {
  coord_down_ = true;
  coord_->Signal(SIGKILL);
  auto st = coord_->Reap(5s);
  if (!st) {
    inv_.Violation("daemon_exit", "the coordinator survived SIGKILL for 5 s");
  } else if (!(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL)) {
    inv_.Violation("daemon_exit", "the coordinator had already " + DescribeWaitStatus(*st) + " before the SIGKILL");
  }
}

Status Cluster::RestartCoordinator() {
  coord_ = std::make_unique<Daemon>();
  // The same port: nodes and clients know the coordinator by its address.
  KVMESH_RETURN_IF_ERROR(coord_->Start({o_.kvmesh_bin, "coordinator", "--config", config_path_, "--port",
                                        std::to_string(coord_port_)},
                                       dir_ + "/coordinator.log"));
  auto j = coord_->WaitEvent("listening", 10s);
  if (!j) return Unavailable("the restarted coordinator did not print its listening line: " + coord_->LogTail(2000));
  coord_down_ = false;
  return Status::Ok();
}

int Cluster::LiveNodes() {
  auto r = HttpRequest("127.0.0.1", coord_port_, "GET", "/nodes", "", 500);
  if (!r.ok() || r->status != 200) return -1;
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("nodes")) return -1;
  return static_cast<int>(j["nodes"].size());
}

bool Cluster::WaitNodes(size_t n, std::chrono::milliseconds timeout) {
  const auto end = SteadyClock::now() + timeout;
  while (SteadyClock::now() < end) {
    if (LiveNodes() == static_cast<int>(n)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

void Cluster::CheckExits(Stats& st) {
  if (!coord_down_ && coord_->running()) {
    if (auto s = coord_->Reap(0ms)) {
      inv_.Violation("daemon_exit", "coordinator " + DescribeWaitStatus(*s) + "; log: " + coord_->LogTail(1500));
      st.unexpected_exits++;
    }
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    NodeSlot& n = *nodes_[i];
    if (n.down || !n.proc || !n.proc->running()) continue;
    auto s = n.proc->Reap(0ms);
    if (!s) continue;
    inv_.Violation("daemon_exit", n.id + " " + DescribeWaitStatus(*s) + " unasked; log: " + n.proc->LogTail(1500));
    st.unexpected_exits++;
    n.generation.fetch_add(1);  // its sequences are gone, as if killed
    n.dead_generation.store(n.generation.load());  // and it was reaped above
    Status r = StartNode(i);
    if (!r.ok()) inv_.Violation("restart", r.ToString());
  }
}

void Cluster::StopAll() {
  auto stop = [&](Daemon& d, const std::string& name) {
    if (!d.running()) return;
    d.Signal(SIGTERM);
    if (!d.WaitEvent("stopped", 10s)) inv_.Violation("daemon_exit", name + " printed no \"stopped\" after SIGTERM");
    auto s = d.Reap(10s);
    if (!s) {
      inv_.Violation("daemon_exit", name + " still running 10 s after SIGTERM");
    } else if (!(WIFEXITED(*s) && WEXITSTATUS(*s) == 0)) {
      inv_.Violation("daemon_exit", name + " " + DescribeWaitStatus(*s) + " after SIGTERM; log: " + d.LogTail(1500));
    }
  };
  for (auto& n : nodes_)
    if (n->proc && !n->down) stop(*n->proc, n->id);
  if (!coord_down_) stop(*coord_, "coordinator");
}

}  // namespace kvmesh::soak
