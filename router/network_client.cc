#include "kvmesh/network.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "kvmesh/build_config.h"
#include "common/credentials.h"
#include "router/map_fetch.h"
#include "router/map_json.h"
#include "transport/http_client.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"
#include "transport/fd_tls_client.h"
#if defined(KVMESH_HAVE_UCX)
#include "transport/ucx_channel.h"
#include "transport/ucx_worker.h"
#endif

namespace kvmesh {

namespace {
// A node's channel, whichever backend, with its epoch setter.
struct NodeChannel {
  std::shared_ptr<ShardChannel> channel;
  std::function<void(uint64_t)> set_epoch;
};
}  // namespace

struct NetworkClient::Impl {
  NetworkClientOptions o;
  std::vector<CoordinatorAddress> coordinators;  // o.coordinator: one or several, tried in turn
  std::atomic<size_t> preferred{0};              // the coordinator that answered last
  std::unique_ptr<Router> router;
  mutable std::mutex mu;  // serialises refreshes; guards channels and epoch
  std::map<std::string, NodeChannel> channels;  // by "id@host:port[#ucx]"
  uint64_t epoch = 0;
  size_t nodes = 0;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread refresher;
#if defined(KVMESH_HAVE_UCX)
  std::shared_ptr<UcxContext> ucx_context;  // one for every UCX channel: registered memory is mapped once
#endif

  std::shared_ptr<const TlsClientContext> tls;  // with o.tls_ca: HTTPS and TLS data channels

  Result<PublishedMap> Fetch() {
    HttpRequestOptions h;
    h.tls = tls;
    if (!o.tenant.empty()) h.authorization = BasicAuthorization(o.tenant, o.token);
    else if (!o.token.empty()) h.authorization = BearerAuthorization(o.token);
    size_t at = preferred.load();
    Result<PublishedMap> pm = FetchPublishedMap(coordinators, &at, o.timeout_ms, h);
    preferred.store(at);
    return pm;
  }

  // Builds the map and channels for `pm`; REQUIRES mu held.
  Status Install(const PublishedMap& pm) {
    if (router && pm.epoch <= epoch) return Status::Ok();
    KVMESH_ASSIGN_OR_RETURN(auto map, BuildShardMap(pm));
    std::vector<std::shared_ptr<ShardChannel>> list;
    std::map<std::string, NodeChannel> next;
    for (const ShardInfo& n : map->nodes()) {
      auto ucx_it = pm.ucx_addresses.find(n.id);
      // UCX carries no encryption: a client that asked for TLS stays on TCP with TLS.
      const bool want_ucx = pm.backend == "ucx" && ucx_it != pm.ucx_addresses.end() && !tls;
      const std::string key = n.id + "@" + n.host + ":" + std::to_string(n.ports.data) +
                              (want_ucx ? "#" + ucx_it->second.substr(0, 64) : "");
      NodeChannel ch;
      auto it = channels.find(key);
      if (it != channels.end()) ch = it->second;
#if defined(KVMESH_HAVE_UCX)
      if (!ch.channel && want_ucx) {
        // A node that cannot be reached over UCX now is served over TCP instead.
        auto addr = HexDecode(ucx_it->second);
        auto progress = ParseUcxProgress(o.ucx_progress);
        if (!ucx_context) {
          auto ctx = UcxContext::Create(/*mt_workers=*/true);
          if (ctx.ok()) ucx_context = std::move(*ctx);
        }
        if (addr.ok() && progress.ok() && ucx_context) {
          UcxChannelOptions uo;
          uo.node_address = *addr;
          uo.client_id = o.client_id;
          uo.tenant = o.tenant;
          uo.token = o.token;
          uo.timeout_ms = o.timeout_ms;
          uo.context = ucx_context;
          uo.progress = *progress;
          uo.spin_us = o.ucx_spin_us;
          uo.local_reads = o.ucx_local_reads;
          auto u = UcxChannel::Connect(uo);
          if (u.ok()) {
            std::shared_ptr<UcxChannel> uc = std::move(*u);
            ch = NodeChannel{uc, [uc](uint64_t e) { uc->set_epoch(e); }};
          }
        }
      }
#endif
      if (!ch.channel) {
        TcpChannelOptions co;
        co.host = n.host;
        co.port = n.ports.data;
        co.client_id = o.client_id;
        co.tenant = o.tenant;
        co.token = o.token;
        co.connections = o.connections_per_node;
        co.timeout_ms = o.timeout_ms;
        co.connect_timeout_ms = o.connect_timeout_ms;
        co.tls = tls;
        std::shared_ptr<TcpChannel> tc = TcpChannel::Create(co);
        ch = NodeChannel{tc, [tc](uint64_t e) { tc->set_epoch(e); }};
      }
      ch.set_epoch(pm.epoch);
      next[key] = ch;
      list.push_back(ch.channel);
    }
    if (!router) {
      RouterOptions ro;
      ro.tenant_salt = o.tenant_salt;
      ro.timeout_ms = o.timeout_ms;
      ro.refresh = [this](Router&) { return Refresh(); };
#if defined(KVMESH_HAVE_UCX)
      // Over UCX: memory the nodes of this host map themselves (UcxContext::Allocate).
      ro.allocate_memory = [this](size_t bytes) -> Result<std::shared_ptr<std::byte>> {
        std::shared_ptr<UcxContext> ctx;
        {
          std::lock_guard<std::mutex> lock(mu);
          ctx = ucx_context;
        }
        if (!ctx) return std::shared_ptr<std::byte>();  // no UCX node: the router's default
        KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<UcxMemory> m, ctx->Allocate(bytes));
        std::byte* base = m->base();
        return std::shared_ptr<std::byte>(std::move(m), base);
      };
#endif
      KVMESH_ASSIGN_OR_RETURN(router, Router::Create(pm.model, map, std::move(list), ro));
    } else {
      Status s = router->UpdateMap(map, std::move(list));
      if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) return s;
    }
    channels = std::move(next);
    epoch = pm.epoch;
    nodes = map->nodes().size();
    return Status::Ok();
  }

  Status Refresh() {
    KVMESH_ASSIGN_OR_RETURN(PublishedMap pm, Fetch());
    std::lock_guard<std::mutex> lock(mu);
    return Install(pm);
  }
};

NetworkClient::NetworkClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NetworkClient::~NetworkClient() {
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->refresher.joinable()) impl_->refresher.join();
}

Result<std::unique_ptr<NetworkClient>> NetworkClient::Connect(NetworkClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  KVMESH_ASSIGN_OR_RETURN(impl->coordinators, ParseCoordinatorList(impl->o.coordinator));
  if (!impl->o.tls_ca.empty()) {
    TlsClientOptions t;
    t.ca = impl->o.tls_ca;
    t.cert = impl->o.tls_cert;
    t.key = impl->o.tls_key;
    t.setting = "tls_";  // errors name NetworkClientOptions::tls_ca etc.
    KVMESH_ASSIGN_OR_RETURN(impl->tls, TlsClientContext::Create(t));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(impl->o.timeout_ms);
  Status last;
  for (;;) {
    Result<PublishedMap> pm = impl->Fetch();
    if (pm.ok()) {
      std::lock_guard<std::mutex> lock(impl->mu);
      last = impl->Install(*pm);
      if (last.ok()) break;
    } else {
      last = pm.status();
      // Wrong credentials stay wrong: no point waiting for the deadline.
      if (last.code() == StatusCode::kPermissionDenied)
        return last.WithContext("fetching the shard map from " + impl->o.coordinator);
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return last.WithContext("fetching the shard map from " + impl->o.coordinator);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Impl* raw = impl.get();
  if (raw->o.refresh_ms > 0) {
    raw->refresher = std::thread([raw] {
      std::unique_lock<std::mutex> lock(raw->stop_mu);
      while (!raw->stop_cv.wait_for(lock, std::chrono::milliseconds(raw->o.refresh_ms), [raw] { return raw->stopping; })) {
        lock.unlock();
        (void)raw->Refresh();  // a coordinator hiccup keeps the old map
        lock.lock();
      }
    });
  }
  return std::unique_ptr<NetworkClient>(new NetworkClient(std::move(impl)));
}

Router& NetworkClient::router() { return *impl_->router; }
Status NetworkClient::Refresh() { return impl_->Refresh(); }
uint64_t NetworkClient::epoch() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->epoch;
}
size_t NetworkClient::num_nodes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->nodes;
}

}  // namespace kvmesh
