#include "shard_node/server/resp_proxy.h"

#include <algorithm>
#include <atomic>

#include "kvmesh/router.h"
#include "shard_node/server/resp_protocol.h"
#include "shard_node/server/resp_session.h"
#include "transport/asio_listener.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// First read size per GET: values are usually far below a slot; a larger one
// is read again at its size (one more round trip for that key only).
constexpr uint64_t kFirstReadBytes = 256u << 10;

// The cluster, through the router, as a RESP backend. Runs on the workers.
class RouterBackend final : public RespBackend {
 public:
  RouterBackend(Router* router, const RespProxyOptions& o) : router_(router), o_(o) {
    ro_.timeout_ms = o.timeout_ms;
  }

  void Get(std::span<const std::string_view> keys, RespReply* out) override {
    std::vector<std::string> values(keys.size());
    std::vector<GetItem> items(keys.size());
    const uint64_t first = std::min(o_.max_value_bytes, kFirstReadBytes);
    for (size_t i = 0; i < keys.size(); ++i) {
      values[i].resize(first);
      items[i].key = RespKey(keys[i]);
      items[i].dst = std::as_writable_bytes(std::span<char>(values[i]));
    }
    (void)router_->GetBatch(items, ro_);  // per-item results; a dead node's items miss
    std::vector<GetItem> again;           // values larger than the first read
    std::vector<size_t> where;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].status.code() != StatusCode::kResourceExhausted || items[i].size <= first) continue;
      values[i].resize(items[i].size);
      again.push_back(GetItem{items[i].key, std::as_writable_bytes(std::span<char>(values[i])), 0, {}});
      where.push_back(i);
    }
    if (!again.empty()) {
      (void)router_->GetBatch(again, ro_);
      for (size_t k = 0; k < again.size(); ++k) items[where[k]].status = again[k].status, items[where[k]].size = again[k].size;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].status.ok()) {
        out->Nil();
        continue;
      }
      values[i].resize(items[i].size);
      out->BulkOwned(std::move(values[i]));
    }
  }

  void Set(std::span<const std::string_view> keys, std::span<const std::string_view> values,
           std::span<Status> statuses) override {
    std::vector<PutItem> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      items[i].key = RespKey(keys[i]);
      items[i].data = std::as_bytes(std::span<const char>(values[i]));
    }
    RequestOptions ro = ro_;
    ro.replace = true;  // Redis SET semantics: the new value wins (one round trip: the PUT's replace flag)
    (void)router_->PutBatch(items, ro);
    for (size_t i = 0; i < items.size(); ++i) statuses[i] = std::move(items[i].status);
  }

  int64_t Exists(std::span<const std::string_view> keys) override {
    std::vector<BlockKey> k = Keys(keys);
    std::vector<uint8_t> found(k.size(), 0);
    if (!router_->ExistsBatch(k, found, ro_).ok()) return 0;
    return std::count(found.begin(), found.end(), uint8_t{1});
  }

  // The router's Erase does not say which keys were there: DEL counts the
  // keys that existed just before it (a concurrent SET may race it, as with
  // any two clients).
  int64_t Del(std::span<const std::string_view> keys) override {
    std::vector<BlockKey> k = Keys(keys);
    std::vector<uint8_t> found(k.size(), 0);
    (void)router_->ExistsBatch(k, found, ro_);
    (void)router_->Erase(k, ro_);
    return std::count(found.begin(), found.end(), uint8_t{1});
  }

  int64_t DbSize() override {
    if (!o_.stats) return 0;
    Result<RespClusterStats> s = o_.stats();
    return s.ok() ? static_cast<int64_t>(s->blocks) : 0;
  }

  std::string Info() override {
    std::string o = "role:proxy\r\n# Cluster\r\n";
    auto kv = [&](const char* k, uint64_t v) { o += std::string(k) + ":" + std::to_string(v) + "\r\n"; };
    kv("shard_map_epoch", router_->epoch());
    RouterStats rs = router_->Stats();
    kv("router_node_errors", rs.node_errors);
    if (o_.stats) {
      Result<RespClusterStats> s = o_.stats();
      if (s.ok()) {
        kv("live_nodes", s->nodes);
        o += "# Stats\r\n";
        kv("keyspace_hits", s->hits);
        kv("keyspace_misses", s->misses);
        kv("evicted_keys", s->evictions);
        o += "# Memory\r\n";
        kv("used_memory", s->bytes_stored);
        kv("slot_bytes", o_.max_value_bytes);
        o += "# Keyspace\r\n";
        o += "db0:keys=" + std::to_string(s->blocks) + ",expires=0,avg_ttl=0\r\n";
      } else {
        o += "cluster_stats_error:" + s.status().ToString() + "\r\n";
      }
    }
    return o;
  }

 private:
  static std::vector<BlockKey> Keys(std::span<const std::string_view> keys) {
    std::vector<BlockKey> k;
    k.reserve(keys.size());
    for (std::string_view s : keys) k.push_back(RespKey(s));
    return k;
  }

  Router* router_;
  const RespProxyOptions& o_;
  RequestOptions ro_;
};

class Proxy final : public RespProxy {
 public:
  Proxy(Router* router, RespProxyOptions o)
      : o_(std::move(o)), backend_(router, o_), commands_(&backend_, o_.max_value_bytes),
        workers_(std::max<uint32_t>(1, o_.workers)) {}
  ~Proxy() override { Stop(); }

  Status Bind() {
    conn_.max_value_bytes = o_.max_value_bytes;
    conn_.max_bulk_bytes = o_.max_bulk_bytes ? o_.max_bulk_bytes : std::max<uint64_t>(o_.max_value_bytes, 16u << 20);
    conn_.workers = &workers_;
    AsioListenerOptions l;
    l.host = o_.host;
    l.port = o_.port;
    l.session_threads = std::max<uint32_t>(1, o_.io_threads);
    l.what = "RESP proxy";
    KVMESH_ASSIGN_OR_RETURN(listener_, AsioListener::Start(l, [this](tcp::socket s) {
                              return ServeRespConnection(std::move(s), &commands_, conn_);
                            }));
    return Status::Ok();
  }
  uint16_t port() const override { return listener_->port(); }
  uint64_t commands() const override { return commands_.commands(); }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    // Connection threads first: no new run reaches the workers. Then the runs
    // in flight finish (bounded by the router timeout); their answers are
    // posted to stopped io_contexts and dropped with the connections when the
    // listener is destroyed.
    if (listener_) listener_->Stop();
    workers_.join();
  }

 private:
  RespProxyOptions o_;
  RouterBackend backend_;
  RespCommands commands_;
  RespConnectionOptions conn_;
  asio::thread_pool workers_;
  std::atomic<bool> stopped_{false};
  std::unique_ptr<AsioListener> listener_;  // last: its connections use the members above
};

}  // namespace

Result<std::unique_ptr<RespProxy>> RespProxy::Start(Router* router, RespProxyOptions options) {
  auto p = std::make_unique<Proxy>(router, std::move(options));
  KVMESH_RETURN_IF_ERROR(p->Bind());
  return std::unique_ptr<RespProxy>(std::move(p));
}

}  // namespace kvmesh
