// tests/tenant_node.h — a shard node with tenants ($.auth.tenants) behind a
// data server that wants the cluster token, in process, reached over loopback
// TCP with a tenant's credentials; and the one-block calls the tenant, pin and
// quota tests make through a ShardChannel.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "shard_node/tenants.h"
#include "tests/test_data.h"
#include "transport/tcp_channel.h"

namespace kvmesh::testing {

struct TenantNodeOptions {
  uint32_t max_block_bytes = 0;  // the data server's limits.max_block_bytes (0: its default)
  std::optional<SequenceServiceOptions> sequences;  // ShardNode::Create's (none: the default)
};

// The node of issue 39's reproduction: "n0", 128 MiB of host memory in 1 MiB
// blocks, cluster token "cluster-secret", and `tenants` (a JSON array of
// $.auth.tenants entries).
inline ClusterConfig MiBBlockNodeConfig(const std::string& tenants) {
  auto c = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"host": "128MiB"}}],
    "store": {"slot_bytes": "1MiB"},
    "auth": {"token": "cluster-secret", "tenants": )" + tenants + "}}");
  REQUIRE(c.ok());
  return *c;
}

// Node "n0" of `cfg` behind a DataServer on a port the kernel chose.
struct TenantNode {
  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<DataServer> server;

  explicit TenantNode(ClusterConfig c, const TenantNodeOptions& t = {}) : cfg(std::move(c)) {
    auto n = ShardNode::Create(cfg, "n0", nullptr, t.sequences);
    REQUIRE(n.ok());
    node = std::move(*n);
    DataServerOptions o;
    o.token = cfg.auth.token;
    if (t.max_block_bytes != 0) o.limits.max_block_bytes = t.max_block_bytes;
    auto s = DataServer::Start(node.get(), o, &epoch);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  ~TenantNode() {
    if (server) server->Stop();
  }
  // One connection as `tenant` ("" with the cluster token: the cluster identity).
  std::unique_ptr<TcpChannel> As(const std::string& tenant, const std::string& token) const {
    TcpChannelOptions o;
    o.port = server->port();
    o.tenant = tenant;
    o.token = token;
    o.connections = 1;
    return TcpChannel::Create(o);
  }
};

// Puts one block; its own status.
inline Status PutOne(ShardChannel& ch, const BlockKey& k, const std::vector<std::byte>& data, bool replace = false) {
  PutItem p{k, data, {}};
  RequestOptions o;
  o.replace = replace;
  KVMESH_RETURN_IF_ERROR(ch.Put(std::span<PutItem>(&p, 1), o));
  return p.status;
}

// Whether `ch` sees a block under k (without touching it).
inline bool Has(ShardChannel& ch, const BlockKey& k) {
  uint8_t found = 0;
  REQUIRE(ch.Exists(std::span<const BlockKey>(&k, 1), std::span<uint8_t>(&found, 1), /*touch=*/false, {}).ok());
  return found != 0;
}

// A gauge or counter of tenant `name` in the node's Prometheus text (-1: absent).
inline int64_t TenantMetric(ShardNode& node, const std::string& family, const std::string& name) {
  const std::string text = node.tenants().PrometheusText();
  const std::string key = family + "{tenant=\"" + name + "\"} ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + key.size()));
}

}  // namespace kvmesh::testing
