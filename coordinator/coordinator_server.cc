#include "coordinator/coordinator_server.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "coordinator/etcd_control.h"
#include "coordinator/membership.h"
#include "transport/http_server.h"
#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

using nlohmann::json;

class Coordinator final : public CoordinatorServer {
 public:
  explicit Coordinator(const ClusterConfig& c) : config_(c), members_(c) {}
  ~Coordinator() override { Stop(); }

  Status Start(uint16_t port) {
    HttpServerOptions o;
    if (config_.tls.enabled()) {
      KVMESH_ASSIGN_OR_RETURN(o.tls, MakeTlsServerContext(config_.tls, config_.tls.client_auth == "all"));
    }
    // Credentials and each route's body limit are decided on a request's head, before its body is read.
    o.head_check = [this](const HttpServerRequest& head) { return members_.Admit(head); };
    auto s = HttpServer::Start(config_.coordinator.host, port,
                               [this](const HttpServerRequest& r) { return members_.Handle(r); }, std::move(o));
    if (!s.ok()) return s.status();
    http_ = std::move(*s);
    if (config_.coordinator.etcd.enabled()) {  // the members and the map live in etcd (coordinator/etcd_control.h)
      KVMESH_ASSIGN_OR_RETURN(etcd_, EtcdControl::Create(config_, &members_, config_.coordinator.host + ":" +
                                                                                 std::to_string(http_->port())));
      members_.SetStoreReachable(false);  // until the first round reaches etcd
    }
    reaper_ = std::thread([this] { Reap(); });
    return Status::Ok();
  }

  uint16_t port() const override { return http_->port(); }
  uint64_t epoch() const override { return members_.epoch(); }
  size_t live_nodes() const override { return members_.live_nodes(); }
  std::string ListeningJson() const override {
    return json{{"event", "listening"}, {"role", "coordinator"}, {"node_id", "coordinator"},
                {"host", config_.coordinator.host}, {"pid", ::getpid()}, {"tls", config_.tls.enabled()},
                {"ports", {{"http", port()}}}}
        .dump();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    if (etcd_) etcd_->Stop();
    if (http_) http_->Stop();
  }

 private:
  void Reap() {
    const auto period = std::chrono::milliseconds(std::max<int64_t>(10, config_.coordinator.heartbeat_ms / 2));
    std::unique_lock<std::mutex> lock(mu_);
    do {
      lock.unlock();
      members_.Reap(std::chrono::steady_clock::now());
      if (etcd_) etcd_->Tick();  // blocking calls to etcd: on this thread, never the HTTP server's
      lock.lock();
    } while (!cv_.wait_for(lock, period, [this] { return stopping_; }));
  }

  const ClusterConfig config_;
  Membership members_;
  std::unique_ptr<HttpServer> http_;  // after members_: stopped (and destroyed) before it
  std::unique_ptr<EtcdControl> etcd_;  // with $.coordinator.etcd; the reaper thread's
  std::thread reaper_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const ClusterConfig& config, uint16_t port_override) {
  auto c = std::make_unique<Coordinator>(config);
  KVMESH_RETURN_IF_ERROR(c->Start(port_override ? port_override : config.coordinator.port));
  return std::unique_ptr<CoordinatorServer>(std::move(c));
}

}  // namespace kvmesh
