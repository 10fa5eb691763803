#include "shard_node/server/resp_server.h"

#include <cstring>

#include "shard_node/shard_node.h"
#include "transport/asio_listener.h"
#include "transport/resp/resp_session.h"

namespace kvmesh {
namespace {

using boost::asio::ip::tcp;

// This node's store, answering each step at once.
class NodeBackend final : public RespSyncBackend {
 public:
  explicit NodeBackend(ShardNode* node) : node_(node) {}

  void Run(std::span<BlockIo> ios) override {
    for (BlockIo& io : ios) {  // reads first (resp_ops.h)
      switch (io.kind) {
        case BlockIo::Kind::kGet: Get(io); break;
        case BlockIo::Kind::kExists:
          io.found = node_->Exists(io.key, /*touch=*/true);
          io.status = Status::Ok();
          break;
        case BlockIo::Kind::kStats: Stats(io); break;
        default: break;
      }
    }
    for (BlockIo& io : ios) {  // then writes, in order
      if (io.kind == BlockIo::Kind::kPut) Put(io);
      else if (io.kind == BlockIo::Kind::kErase) io.status = node_->Erase(io.key);
    }
  }

 private:
  void Get(BlockIo& io) {
    Result<BlockRef> r = node_->Get(io.key);
    if (!r.ok()) {  // a miss, or a corrupt block (erased): a miss either way
      io.status = r.status();
      return;
    }
    io.status = Status::Ok();
    if (r->meta().codec == 0 && node_->store().backend().host_accessible()) {
      // Zero copy: the block stays pinned until the answer is written.
      auto d = r->data();
      io.value = std::span<const char>(reinterpret_cast<const char*>(d.data()), d.size());
      io.keep = std::make_shared<BlockRef>(std::move(*r));
      return;
    }
    auto copy = std::make_shared<std::string>();
    if (r->meta().codec != 0) {  // stored encoded (config.codec): the decoded bytes
      copy->resize(r->meta().logical_size);
      r->Release();
      Result<size_t> n = node_->GetInto(io.key, std::as_writable_bytes(std::span<char>(*copy)));
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

  void Put(BlockIo& io) {
    PutOptions po;
    po.replace = io.replace;
    std::span<const char> block = io.data;
    if (!io.head.empty() && !io.data.empty()) {  // one contiguous block for the store
      scratch_.resize(io.head.size() + io.data.size());
      std::memcpy(scratch_.data(), io.head.data(), io.head.size());
      std::memcpy(scratch_.data() + io.head.size(), io.data.data(), io.data.size());
      block = scratch_;
    } else if (!io.head.empty()) {
      block = io.head;
    }
    io.status = node_->Put(io.key, std::as_bytes(block), po);
  }

  void Stats(BlockIo& io) {
    NodeStats st = node_->Stats();
    const StoreStats& s = st.store;
    auto text = std::make_shared<std::string>("role:node\r\nnode_id:" + st.node_id + "\r\n# Stats\r\n");
    auto kv = [&](const char* k, uint64_t v) { *text += std::string(k) + ":" + std::to_string(v) + "\r\n"; };
    kv("keyspace_hits", s.hits);
    kv("keyspace_misses", s.misses);
    kv("evicted_keys", s.evictions);
    *text += "# Memory\r\n";
    kv("used_memory", s.bytes_stored);
    kv("maxmemory", s.capacity_bytes);
    kv("slot_bytes", s.slot_bytes);
    *text += "# Keyspace\r\n";
    *text += "db0:keys=" + std::to_string(s.blocks) + ",expires=0,avg_ttl=0\r\n";
    io.count = s.blocks;
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
    AsioListenerOptions l;
    l.host = o_.host;
    l.port = o_.port;
    l.what = "RESP";
    KVMESH_ASSIGN_OR_RETURN(listener_, AsioListener::Start(l, [this](tcp::socket s) {
                              return ServeRespConnection(std::move(s), &commands_, &backend_, conn_);
                            }));
    return Status::Ok();
  }
  uint16_t port() const override { return listener_->port(); }
  uint64_t commands() const override { return commands_.commands(); }
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
    return f;
  }

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
