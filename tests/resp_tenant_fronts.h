// tests/resp_tenant_fronts.h — the RESP fronts with tenants, in process: a
// node-local front (LocalFront) and a proxy over two nodes' data servers
// (ProxyFront), on a cluster of 64 KiB blocks where tenant "alpha" (password
// alpha-pw) has a 256 KiB quota per node and "beta" (beta-pw) none. Ports
// are chosen by the kernel; everything stops on destruction.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "router/proxy/resp_proxy.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/server/resp_server.h"
#include "shard_node/shard_node.h"
#include "shard_node/tenants.h"
#include "tests/test_data.h"
#include "transport/resp/resp_commands.h"

namespace kvmesh::testing {

constexpr uint64_t kRespSlot = 64 << 10;
constexpr uint64_t kRespQuota = 256 << 10;  // tenant "alpha"'s bytes per node

inline ClusterConfig RespTenantConfig(int nodes) {
  return NodesConfig(R"("model": {"model_id": "rt", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16,
                                 "block_tokens": 4}, "store": {"slot_bytes": "64KiB", "size_classes": 8},
                      "auth": {"token": "cluster-secret", "tenants": [
                        {"name": "alpha", "password": "alpha-pw", "quota": "256KiB"},
                        {"name": "beta", "token": "beta-pw"}]})",
                     nodes, "16MiB");
}

// n seeded pseudo-random bytes as a RESP value.
inline std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  std::mt19937_64 rng(seed);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A RespProxy over `map` with options `po` (po.map is set here).
inline std::unique_ptr<RespProxy> StartRespProxy(RespProxyOptions po, std::shared_ptr<const ShardMap> map) {
  po.map = [m = std::move(map)] { return m; };
  auto p = RespProxy::Start(po);
  REQUIRE(p.ok());
  return std::move(*p);
}

// One ShardNode with tenants and its node-local RESP front (node "n0" of `c`).
struct LocalFront {
  explicit LocalFront(ClusterConfig c = RespTenantConfig(1)) : cfg(std::move(c)) {
    auto n = ShardNode::Create(cfg, "n0");
    REQUIRE(n.ok());
    node = std::move(*n);
    RespServerOptions o;
    o.max_value_bytes = 8u << 20;
    o.auth = MakeClusterAuth(cfg.auth);
    auto s = RespServer::Start(node.get(), o);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  ~LocalFront() {
    if (server) server->Stop();
  }
  uint16_t port() const { return server->port(); }
  ShardNode* node_of(const std::string&) const { return node.get(); }
  ClusterConfig cfg;
  std::unique_ptr<ShardNode> node;
  std::unique_ptr<RespServer> server;
};

// Two ShardNodes with tenants behind TCP data servers that want the
// cluster secret, and a proxy over them that knows the tenants.
struct ProxyFront {
  ProxyFront() {
    cfg = RespTenantConfig(2);
    std::vector<ShardInfo> infos;
    for (const NodeConfig& nc : cfg.nodes) {
      auto node = ShardNode::Create(cfg, nc.id);
      REQUIRE(node.ok());
      DataServerOptions d;
      d.token = cfg.auth.token;
      auto srv = DataServer::Start(node->get(), d, &epoch);
      REQUIRE(srv.ok());
      ShardInfo s;
      s.id = nc.id;
      s.host = "127.0.0.1";
      s.ports.data = (*srv)->port();
      infos.push_back(s);
      nodes.push_back(std::move(*node));
      servers.push_back(std::move(*srv));
    }
    map = ShardMap::Build(1, infos, {}, {}, 1).value();
    RespProxyOptions po;
    po.block_bytes = kRespSlot;
    po.max_value_bytes = 8u << 20;
    po.token = cfg.auth.token;
    po.auth = MakeClusterAuth(cfg.auth);
    po.tenants = cfg.auth.tenants;
    proxy = StartRespProxy(po, map);
  }
  ~ProxyFront() {
    if (proxy) proxy->Stop();
    for (auto& s : servers) s->Stop();
  }
  uint16_t port() const { return proxy->port(); }
  // The node that owns a RESP key.
  ShardNode* node_of(const std::string& key) const {
    return nodes[map->Primary(RespKey(key, RespKeyRules{}), {})].get();
  }
  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<DataServer>> servers;
  std::shared_ptr<const ShardMap> map;
  std::unique_ptr<RespProxy> proxy;
};

}  // namespace kvmesh::testing
