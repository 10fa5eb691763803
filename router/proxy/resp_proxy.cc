#include "router/proxy/resp_proxy.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>

#include "kvmesh/router.h"
#include "transport/resp/resp_protocol.h"
#include "transport/resp/resp_session.h"
#include "transport/asio_listener.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// First read size per GET: values are usually far below a slot; a larger one
// is read again at its size (one more round trip for that key only).
constexpr uint64_t kFirstReadBytes = 256u << 10;

// The cluster, through the router, as a RESP backend. Runs on the connection
// threads (and the workers); thread-safe (the router is).
class RouterBackend final : public RespBackend {
 public:
  RouterBackend(Router* router, const RespProxyOptions& o) : router_(router), o_(o) {
    ro_.timeout_ms = o.timeout_ms;
  }

  void Get(std::span<const std::string_view> keys, RespReply* out) override {
    // Each value lands in a buffer of its own, handed to the reply without a
    // copy. Allocated, not zero-filled: the node writes every byte we answer
    // (a std::string of the first-read size would memset 256 KiB per GET).
    std::vector<std::shared_ptr<char[]>> values(keys.size());
    std::vector<GetItem> items(keys.size());
    const uint64_t first = std::min(o_.max_value_bytes, kFirstReadBytes);
    for (size_t i = 0; i < keys.size(); ++i) {
      values[i].reset(new char[first]);
      items[i].key = RespKey(keys[i]);
      items[i].dst = std::as_writable_bytes(std::span<char>(values[i].get(), first));
    }
    (void)router_->GetBatch(items, ro_);  // per-item results; a dead node's items miss
    std::vector<GetItem> again;           // values larger than the first read
    std::vector<size_t> where;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].status.code() != StatusCode::kResourceExhausted || items[i].size <= first) continue;
      values[i].reset(new char[items[i].size]);
      again.push_back(GetItem{items[i].key, std::as_writable_bytes(std::span<char>(values[i].get(), items[i].size)), 0, {}});
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
      out->BulkBorrowed(std::span<const char>(values[i].get(), items[i].size), values[i]);
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
    KVMESH_ASSIGN_OR_RETURN(listener_, AsioListener::Start(l, [this](tcp::socket s) { return Session(std::move(s)); }));
    return Status::Ok();
  }
  uint16_t port() const override { return listener_->port(); }
  uint64_t commands() const override { return commands_.commands(); }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    // No connection is given a thread from here on; then the listener stops
    // (no new connection; its Asio connections stop being served).
    {
      std::lock_guard<std::mutex> lock(conn_mu_);
      stopping_ = true;
    }
    if (listener_) listener_->Stop();
    // Wake every connection thread: a read or write in progress fails at
    // once; a router call in progress finishes (bounded by the router
    // timeout) and its answer fails to write.
    {
      std::lock_guard<std::mutex> lock(conn_mu_);
      for (ConnThread& c : conns_)
        if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
    }
    for (ConnThread& c : conns_) c.thread.join();  // conns_ no longer changes (stopping_)
    conns_.clear();
    // The Asio connections' runs in flight finish; their answers are posted
    // to stopped io_contexts and dropped with the connections when the
    // listener is destroyed.
    workers_.join();
  }

 private:
  // One connection on a thread of its own. fd is closed by its thread, under
  // conn_mu_, which is when fd becomes -1 and done true.
  struct ConnThread {
    int fd = -1;
    bool done = false;
    std::thread thread;
  };

  // A new connection: a thread of its own when allowed, else the Asio path.
  asio::awaitable<void> Session(tcp::socket s) {
    if (!Adopt(s)) co_await ServeRespConnection(std::move(s), &commands_, conn_);
  }

  // Moves the socket to a new connection thread. False when the Asio path
  // must serve s instead: stopping, at connection_threads, or no thread could
  // be started. (True with s empty also when s could not be served at all.)
  bool Adopt(tcp::socket& s) {
    std::lock_guard<std::mutex> lock(conn_mu_);
    if (stopping_) return false;
    for (auto it = conns_.begin(); it != conns_.end();) {  // reap finished connections
      if (!it->done) {
        ++it;
        continue;
      }
      it->thread.join();  // it is past its last statement: the join waits for no I/O
      it = conns_.erase(it);
    }
    if (conns_.size() >= o_.connection_threads) return false;
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    const tcp::endpoint local = s.local_endpoint(ec);
    if (ec) return false;
    const int fd = s.release(ec);
    if (ec || fd < 0) return false;
    // Blocking I/O from here on (Asio may have made the socket non-blocking).
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    ConnThread& c = conns_.emplace_back();
    c.fd = fd;
    try {
      c.thread = std::thread([this, &c, fd] { ServeOnThread(&c, fd); });
    } catch (const std::system_error&) {  // no thread to be had: the Asio path serves it
      conns_.pop_back();
      s.assign(local.protocol(), fd, ec);
      if (!ec) return false;  // back in s
      ::close(fd);
      return true;  // closed: nothing left to serve
    }
    return true;
  }

  void ServeOnThread(ConnThread* c, int fd) {
    ServeRespConnectionBlocking(fd, &commands_, conn_);
    std::lock_guard<std::mutex> lock(conn_mu_);
    ::close(fd);
    c->fd = -1;
    c->done = true;
  }

  RespProxyOptions o_;
  RouterBackend backend_;
  RespCommands commands_;
  RespConnectionOptions conn_;
  asio::thread_pool workers_;
  std::atomic<bool> stopped_{false};
  std::mutex conn_mu_;
  bool stopping_ = false;        // guarded by conn_mu_
  std::list<ConnThread> conns_;  // guarded by conn_mu_ (stable addresses for the threads)
  std::unique_ptr<AsioListener> listener_;  // last: its connections use the members above
};

}  // namespace

Result<std::unique_ptr<RespProxy>> RespProxy::Start(Router* router, RespProxyOptions options) {
  auto p = std::make_unique<Proxy>(router, std::move(options));
  KVMESH_RETURN_IF_ERROR(p->Bind());
  return std::unique_ptr<RespProxy>(std::move(p));
}

}  // namespace kvmesh
