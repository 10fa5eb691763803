#include "shard_node/server/resp_server.h"

#include <algorithm>

#include "transport/resp/resp_protocol.h"
#include "transport/resp/resp_session.h"
#include "shard_node/shard_node.h"
#include "transport/asio_listener.h"

namespace kvmesh {
namespace {

using boost::asio::ip::tcp;

// This node's store as a RESP backend.
class NodeBackend final : public RespBackend {
 public:
  explicit NodeBackend(ShardNode* node) : node_(node) {}

  void Get(std::span<const std::string_view> keys, RespReply* out) override {
    for (std::string_view k : keys) GetOne(k, out);
  }
  void Set(std::span<const std::string_view> keys, std::span<const std::string_view> values,
           std::span<Status> statuses) override {
    PutOptions po;
    po.replace = true;  // Redis SET semantics: the new value wins
    for (size_t i = 0; i < keys.size(); ++i)
      statuses[i] = node_->Put(RespKey(keys[i]), std::as_bytes(std::span<const char>(values[i])), po);
  }
  int64_t Exists(std::span<const std::string_view> keys) override {
    int64_t n = 0;
    for (std::string_view k : keys) n += node_->Exists(RespKey(k), false);
    return n;
  }
  int64_t Del(std::span<const std::string_view> keys) override {
    int64_t n = 0;
    for (std::string_view k : keys) n += node_->Erase(RespKey(k)).ok();
    return n;
  }
  int64_t DbSize() override { return static_cast<int64_t>(node_->Stats().store.blocks); }
  std::string Info() override {
    NodeStats st = node_->Stats();
    const StoreStats& s = st.store;
    std::string o = "node_id:" + st.node_id + "\r\n# Stats\r\n";
    auto kv = [&](const char* k, uint64_t v) { o += std::string(k) + ":" + std::to_string(v) + "\r\n"; };
    kv("keyspace_hits", s.hits);
    kv("keyspace_misses", s.misses);
    kv("evicted_keys", s.evictions);
    o += "# Memory\r\n";
    kv("used_memory", s.bytes_stored);
    kv("maxmemory", s.capacity_bytes);
    kv("slot_bytes", s.slot_bytes);
    o += "# Keyspace\r\n";
    o += "db0:keys=" + std::to_string(s.blocks) + ",expires=0,avg_ttl=0\r\n";
    return o;
  }

 private:
  void GetOne(std::string_view key, RespReply* out) {
    Result<BlockRef> r = node_->Get(RespKey(key));
    if (!r.ok()) return out->Nil();  // a miss, or a corrupt block (erased): nil either way
    if (r->meta().codec != 0) {  // stored encoded (config.codec): answer the decoded value
      std::string value(r->meta().logical_size, '\0');
      r->Release();
      Result<size_t> n = node_->GetInto(RespKey(key), std::as_writable_bytes(std::span<char>(value)));
      if (!n.ok()) return out->Nil();
      value.resize(*n);
      return out->BulkOwned(std::move(value));
    }
    if (node_->store().backend().host_accessible()) {  // zero copy: the block stays pinned until written
      auto d = r->data();
      std::span<const char> bytes(reinterpret_cast<const char*>(d.data()), d.size());
      return out->BulkBorrowed(bytes, std::make_shared<BlockRef>(std::move(*r)));
    }
    std::string copy(r->data().size(), '\0');
    node_->store().backend().CopyOut(reinterpret_cast<std::byte*>(copy.data()), r->data().data(), copy.size());
    out->BulkOwned(std::move(copy));
  }

  ShardNode* node_;
};

class Server final : public RespServer {
 public:
  Server(ShardNode* node, RespServerOptions o)
      : o_(std::move(o)), backend_(node), commands_(&backend_, o_.max_value_bytes) {}
  ~Server() override { Stop(); }

  Status Bind() {
    conn_.max_value_bytes = o_.max_value_bytes;
    conn_.max_bulk_bytes = o_.max_bulk_bytes ? o_.max_bulk_bytes : std::max<uint64_t>(o_.max_value_bytes, 16u << 20);
    AsioListenerOptions l;
    l.host = o_.host;
    l.port = o_.port;
    l.what = "RESP";
    KVMESH_ASSIGN_OR_RETURN(listener_, AsioListener::Start(l, [this](tcp::socket s) {
                              return ServeRespConnection(std::move(s), &commands_, conn_);
                            }));
    return Status::Ok();
  }
  uint16_t port() const override { return listener_->port(); }
  uint64_t commands() const override { return commands_.commands(); }
  void Stop() override {
    if (listener_) listener_->Stop();
  }

 private:
  RespServerOptions o_;
  NodeBackend backend_;
  RespCommands commands_;
  RespConnectionOptions conn_;
  std::unique_ptr<AsioListener> listener_;  // last: its sessions use the members above
};

}  // namespace

Result<std::unique_ptr<RespServer>> RespServer::Start(ShardNode* node, RespServerOptions options) {
  auto s = std::make_unique<Server>(node, std::move(options));
  KVMESH_RETURN_IF_ERROR(s->Bind());
  return std::unique_ptr<RespServer>(std::move(s));
}

}  // namespace kvmesh
