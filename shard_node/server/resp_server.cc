#include "shard_node/server/resp_server.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/checksum.h"
#include "shard_node/shard_node.h"
#include "shard_node/tenant_view.h"
#include "shard_node/tenants.h"
#include "transport/asio_listener.h"
#include "transport/resp/resp_session.h"
#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

using boost::asio::ip::tcp;

// This node's store as the connection's identity sees it (a TenantView:
// a tenant's keys live in its namespace and count against its quota),
// answering each step at once.
class NodeBackend final : public RespSyncBackend {
 public:
  explicit NodeBackend(ShardNode* node) : node_(node) {}

  void Run(uint32_t identity, std::span<BlockIo> ios, uint64_t* held) override {
    TenantView v(node_, identity);
    for (BlockIo& io : ios) {  // reads first (resp_ops.h)
      switch (io.kind) {
        case BlockIo::Kind::kGet: Get(v, io, held); break;
        case BlockIo::Kind::kExists:
          io.found = v.Exists(io.key, /*touch=*/true);
          io.status = Status::Ok();
          break;
        case BlockIo::Kind::kStats: Stats(identity, io); break;
        default: break;
      }
    }
    for (BlockIo& io : ios) {  // then writes, in order
      if (io.kind == BlockIo::Kind::kPut) Put(v, io);
      else if (io.kind == BlockIo::Kind::kErase) io.status = v.Erase(io.key);
    }
  }

 private:
  void Get(TenantView& v, BlockIo& io, uint64_t* held) {
    Result<BlockRef> r = v.Get(io.key);
    if (!r.ok()) {  // a miss, or a corrupt block (erased): a miss either way
      io.status = r.status();
      return;
    }
    io.status = Status::Ok();
    const uint64_t size = r->data().size();
    const uint64_t chunk = std::max(node_->store().ChunkBytesFor(size), size);
    if (r->meta().codec == 0 && node_->store().backend().host_accessible() && chunk <= 2 * size) {
      // Zero copy: the block stays pinned until the answer is written. Its
      // whole chunk counts against the connection's bound.
      auto d = r->data();
      io.value = std::span<const char>(reinterpret_cast<const char*>(d.data()), d.size());
      io.keep = std::make_shared<BlockRef>(std::move(*r));
      *held += chunk - size;
      return;
    }
    // A small value in a larger chunk (or memory the front cannot send
    // from): copied out, so an unread answer does not keep the chunk.
    auto copy = std::make_shared<std::string>();
    if (r->meta().codec != 0) {  // stored encoded (config.codec): the decoded bytes
      copy->resize(r->meta().logical_size);
      r->Release();
      Result<size_t> n = v.GetInto(io.key, std::as_writable_bytes(std::span<char>(*copy)));
      if (!n.ok()) {
        io.status = n.status();
        return;
      }
      copy->resize(*n);
    } else {
      copy->resize(r->data().size());
      node_->store().backend().CopyOut(reinterpret_cast<std::byte*>(copy->data()), r->data().data(), copy->size());
    }
    io.value = std::span<const char>(*copy);
    io.keep = std::move(copy);
  }

  void Put(TenantView& v, BlockIo& io) {
    PutOptions po;
    po.replace = io.replace;
    std::span<const char> block = io.data;
    if (!io.head.empty() && !io.data.empty()) {  // one contiguous block for the store
      // Header and value straight into the block's chunk, hashed as they are
      // copied (the store's one copy). A node whose pool is device memory
      // refuses the reservation: stage them below. (RESP blocks are grouped
      // keys, which a codec never encodes, so a codec does not refuse it.)
      Result<BlockReservation> r = v.ReservePut(io.key, io.head.size() + io.data.size(), po);
      if (r.ok()) {
        const uint64_t sum = GatherWithChecksum64(r->data().data(), {io.head, io.data});
        io.status = v.CommitPut(*r, sum, /*verify=*/false);
        return;
      }
      if (r.status().code() == StatusCode::kAlreadyExists) {  // as Put: stored (or being stored) already
        io.status = Status::Ok();
        return;
      }
      if (r.status().code() != StatusCode::kFailedPrecondition) {
        io.status = r.status();
        return;
      }
      scratch_.resize(io.head.size() + io.data.size());
      std::memcpy(scratch_.data(), io.head.data(), io.head.size());
      std::memcpy(scratch_.data() + io.head.size(), io.data.data(), io.data.size());
      block = scratch_;
    } else if (!io.head.empty()) {
      block = io.head;
    }
    io.status = v.Put(io.key, std::as_bytes(block), po);
  }

  void Stats(uint32_t identity, BlockIo& io) {
    if (identity != kClusterTenant) {  // a tenant sees its own figures only
      const TenantStats t = node_->tenants().Stats(identity);
      return Info("tenant:" + t.name, t.hits, t.misses, t.quota_evictions, t.bytes, t.quota_bytes, 0, t.blocks, io);
    }
    NodeStats st = node_->Stats();
    const StoreStats& s = st.store;
    Info("node_id:" + st.node_id, s.hits, s.misses, s.evictions, s.bytes_stored, s.capacity_bytes, s.slot_bytes,
         s.blocks, io);
  }

  // INFO's text for `who` (slot_bytes 0: no slot_bytes line), kept alive by io.
  static void Info(const std::string& who, uint64_t hits, uint64_t misses, uint64_t evicted, uint64_t used,
                   uint64_t max, uint64_t slot_bytes, uint64_t keys, BlockIo& io) {
    auto text = std::make_shared<std::string>("role:node\r\n" + who + "\r\n# Stats\r\n");
    auto kv = [&](const char* k, uint64_t v) { *text += std::string(k) + ":" + std::to_string(v) + "\r\n"; };
    kv("keyspace_hits", hits);
    kv("keyspace_misses", misses);
    kv("evicted_keys", evicted);
    *text += "# Memory\r\n";
    kv("used_memory", used);
    kv("maxmemory", max);
    if (slot_bytes != 0) kv("slot_bytes", slot_bytes);
    *text += "# Keyspace\r\n";
    *text += "db0:keys=" + std::to_string(keys) + ",expires=0,avg_ttl=0\r\n";
    io.count = keys;
    io.value = std::span<const char>(*text);
    io.keep = std::move(text);
    io.status = Status::Ok();
  }

  ShardNode* node_;
  std::vector<char> scratch_;  // the I/O thread's (one listener thread)
};

class Server final : public RespServer {
 public:
  Server(ShardNode* node, RespServerOptions o) : o_(std::move(o)), backend_(node), commands_(FrontOptions(node, o_)) {}
  ~Server() override { Stop(); }

  Status Bind() {
    conn_.max_bulk_bytes = RespMaxBulk(o_.max_value_bytes);
    conn_.limits = o_.limits;
    conn_.timeouts = &timeouts_;
    if (o_.tls.enabled()) {
      KVMESH_ASSIGN_OR_RETURN(conn_.tls, MakeTlsServerContext(o_.tls, o_.tls.client_auth == "all"));
      conn_.tls_failures = &tls_failures_;
    }
    AsioListenerOptions l;
    l.host = o_.host;
    l.port = o_.port;
    l.what = "RESP";
    l.max_connections = o_.limits.max_connections;
    l.max_connections_per_peer = o_.limits.max_connections_per_peer;
    if (!o_.tls.enabled()) l.on_refused = RespRefuseConnection;
    KVMESH_ASSIGN_OR_RETURN(listener_, AsioListener::Start(l, [this](tcp::socket s) {
                              return ServeRespConnection(std::move(s), &commands_, &backend_, conn_);
                            }));
    return Status::Ok();
  }
  uint16_t port() const override { return listener_->port(); }
  uint64_t commands() const override { return commands_.commands(); }
  uint64_t tls_failures() const override { return tls_failures_.load(std::memory_order_relaxed); }
  uint64_t connections_refused() const override { return listener_->refused(); }
  const WatchCounters& timeouts() const override { return timeouts_; }
  void Stop() override {
    if (listener_) listener_->Stop();
  }

 private:
  static RespFrontOptions FrontOptions(ShardNode* node, const RespServerOptions& o) {
    RespFrontOptions f;
    f.block_bytes = node->store().slot_bytes();
    f.max_value_bytes = o.max_value_bytes;
    f.rules = o.rules;
    f.auth = o.auth;
    f.role = "node";
    f.cluster = o.cluster;
    // A SET over a tenant's quota is refused with what its blocks would hold here.
    f.block_charge = [node](uint64_t n) { return node->HeldBytes(nullptr, n); };
    return f;
  }

  RespServerOptions o_;
  NodeBackend backend_;
  RespCommands commands_;
  RespConnectionOptions conn_;
  std::atomic<uint64_t> tls_failures_{0};
  WatchCounters timeouts_;
  std::unique_ptr<AsioListener> listener_;  // last: its sessions use the members above
};

}  // namespace

Result<std::unique_ptr<RespServer>> RespServer::Start(ShardNode* node, RespServerOptions options) {
  auto s = std::make_unique<Server>(node, std::move(options));
  KVMESH_RETURN_IF_ERROR(s->Bind());
  return std::unique_ptr<RespServer>(std::move(s));
}

}  // namespace kvmesh
