#include "cli/serve/daemons.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/spawn.h"
#include "transport/http_client.h"

namespace kvmesh::serve {

using namespace std::chrono_literals;

Status LocalDaemons::Spawn(const std::vector<std::string>& argv, const std::string& log, Proc* p) {
  auto c = SpawnWithStdoutPipe(argv, log, /*append_log=*/false);
  if (!c.ok()) {
    p->pid = -1;
    return c.status();
  }
  p->pid = c->pid;
  p->out = c->out;
  return Status::Ok();
}

Result<nlohmann::json> LocalDaemons::WaitListening(Proc& p, const std::string& log) {
  const auto end = std::chrono::steady_clock::now() + 15s;
  while (std::chrono::steady_clock::now() < end) {
    size_t nl;
    while ((nl = p.buf.find('\n')) != std::string::npos) {
      auto j = nlohmann::json::parse(p.buf.substr(0, nl), nullptr, false);
      p.buf.erase(0, nl + 1);
      if (!j.is_discarded() && j.is_object() && j.value("event", "") == "listening") return j;
    }
    pollfd fd{p.out, POLLIN, 0};
    if (::poll(&fd, 1, 100) <= 0) continue;
    char b[4096];
    const ssize_t n = ::read(p.out, b, sizeof b);
    if (n > 0) p.buf.append(b, size_t(n));
    if (n == 0) break;
  }
  return Unavailable("a daemon printed no listening line; see " + log);
}

Result<std::unique_ptr<LocalDaemons>> LocalDaemons::Start(const std::string& kvmesh_bin,
                                                          const nlohmann::json& config,
                                                          const std::string& work_dir) {
  ::mkdir(work_dir.c_str(), 0755);
  const std::string path = work_dir + "/cluster.json";
  std::ofstream(path) << config.dump(2);
  std::unique_ptr<LocalDaemons> d(new LocalDaemons());
  d->procs_.emplace_back();
  const std::string clog = work_dir + "/coordinator.log";
  KVMESH_RETURN_IF_ERROR(d->Spawn({kvmesh_bin, "coordinator", "--config", path, "--port", "0"}, clog,
                                  &d->procs_.back()));
  KVMESH_ASSIGN_OR_RETURN(nlohmann::json j, d->WaitListening(d->procs_.back(), clog));
  d->coordinator_ = "127.0.0.1:" + std::to_string(j["ports"]["http"].get<int>());
  for (const auto& n : config["nodes"]) {
    const std::string id = n["id"].get<std::string>(), log = work_dir + "/" + id + ".log";
    d->procs_.emplace_back();
    KVMESH_RETURN_IF_ERROR(d->Spawn({kvmesh_bin, "node", "--config", path, "--id", id, "--coordinator",
                                     d->coordinator_, "--no-resp"},
                                    log, &d->procs_.back()));
    KVMESH_ASSIGN_OR_RETURN(const nlohmann::json listening, d->WaitListening(d->procs_.back(), log));
    d->node_http_.push_back(listening["ports"].value("http", 0));
  }
  return d;
}

Result<std::vector<nlohmann::json>> LocalDaemons::NodeStats() const {
  std::vector<nlohmann::json> out;
  for (uint16_t port : node_http_) {
    KVMESH_ASSIGN_OR_RETURN(const HttpResult r, HttpRequest("127.0.0.1", port, "GET", "/stats", "", 5000));
    if (r.status != 200) return Unavailable("node /stats: HTTP " + std::to_string(r.status));
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Unavailable("node /stats: not a JSON object");
    out.push_back(std::move(j));
  }
  return out;
}

Result<double> LocalDaemons::WaitWarmed(double timeout_s) const {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string gauge = "\nkvmesh_ucx_warm_pending_bytes ";  // the sample line, not its # TYPE line
  for (;;) {
    uint64_t pending = 0;
    for (uint16_t port : node_http_) {
      KVMESH_ASSIGN_OR_RETURN(const HttpResult r, HttpRequest("127.0.0.1", port, "GET", "/metrics", "", 5000));
      if (r.status != 200) return Unavailable("node /metrics: HTTP " + std::to_string(r.status));
      const size_t at = r.body.find(gauge);
      if (at != std::string::npos) pending += std::strtoull(r.body.c_str() + at + gauge.size(), nullptr, 10);
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pending == 0) return waited;
    if (waited > timeout_s)
      return DeadlineExceeded("nodes still warming " + std::to_string(pending) + " bytes of registered memory after " +
                              std::to_string(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

LocalDaemons::~LocalDaemons() {
  for (Proc& p : procs_)
    if (p.pid > 0) ::kill(-p.pid, SIGTERM);
  for (Proc& p : procs_) {
    if (p.pid <= 0) continue;
    int st = 0;
    bool gone = false;
    for (int i = 0; i < 300 && !gone; ++i) {
      gone = ::waitpid(p.pid, &st, WNOHANG) == p.pid;
      if (!gone) std::this_thread::sleep_for(10ms);
    }
    if (!gone) {
      ::kill(-p.pid, SIGKILL);
      ::waitpid(p.pid, &st, 0);
    }
    if (p.out >= 0) ::close(p.out);
  }
}

}  // namespace kvmesh::serve
