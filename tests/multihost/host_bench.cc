#include "host_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/credentials.h"
#include "kvmesh/build_config.h"
#include "raw_tcp.h"
#include "router/map_fetch.h"
#include "router/map_json.h"
#include "soak.h"
#include "transport/http_client.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"
#if defined(KVMESH_HAVE_UCX)
#include "transport/ucx_channel.h"
#include "transport/ucx_worker.h"
#endif

namespace kvmesh::multihost {
namespace {

using Clock = std::chrono::steady_clock;

// One channel per bench thread, to one node, over the map's backend.
Result<std::unique_ptr<ShardChannel>> Channel(const PublishedMap& pm, const ShardInfo& n,
                                              const HostBenchOptions& o, size_t block) {
  proto::ProtocolLimits limits;
  limits.max_block_bytes = static_cast<uint32_t>(block);
  if (pm.backend == "ucx") {
#if defined(KVMESH_HAVE_UCX)
    auto it = pm.ucx_addresses.find(n.id);
    if (it == pm.ucx_addresses.end()) return FailedPrecondition("node " + n.id + " published no UCX address");
    KVMESH_ASSIGN_OR_RETURN(std::string addr, HexDecode(it->second));
    UcxChannelOptions u;
    u.node_address = addr;
    u.client_id = "kvmesh-multihost-bench";
    u.token = o.token;
    u.timeout_ms = o.timeout_ms;
    u.limits = limits;
    KVMESH_ASSIGN_OR_RETURN(auto ch, UcxChannel::Connect(u));
    return std::unique_ptr<ShardChannel>(std::move(ch));
#else
    return FailedPrecondition("the map's backend is ucx but this build has no UCX");
#endif
  }
  TcpChannelOptions t;
  t.host = n.host;
  t.port = n.ports.data;
  t.client_id = "kvmesh-multihost-bench";
  t.token = o.token;
  t.connections = 1;
  t.timeout_ms = o.timeout_ms;
  t.connect_timeout_ms = o.timeout_ms;
  t.limits = limits;
  auto ch = TcpChannel::Create(t);
  KVMESH_RETURN_IF_ERROR(ch->Connect());
  return std::unique_ptr<ShardChannel>(std::move(ch));
}

BlockKey KeyOf(uint64_t seed, uint32_t thread, uint64_t i) {
  return BlockKey{soak::Mix(seed ^ (uint64_t{thread} << 48) ^ i), soak::Mix(~seed ^ (uint64_t{thread} << 40) ^ i)};
}

constexpr uint64_t kWindow = 32;  // keys per channel: the bench measures the path, not eviction

// PUTs for `seconds` on every channel (one thread each), over kWindow keys
// per channel with replace (each PUT stores its block again); the keys each
// stored.
double PutFor(std::vector<std::unique_ptr<ShardChannel>>& chs, const HostBenchOptions& o, size_t block,
              uint64_t salt, std::vector<std::vector<BlockKey>>* keys, BenchCounters* k) {
  std::vector<std::thread> ts;
  std::atomic<uint64_t> bytes{0};
  keys->assign(chs.size(), {});
  const auto t0 = Clock::now(), end = t0 + std::chrono::microseconds(static_cast<int64_t>(o.seconds * 1e6));
  for (uint32_t t = 0; t < chs.size(); ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::vector<std::byte>> data(kWindow);
      std::vector<bool> stored(kWindow, false);
      RequestOptions ro;
      ro.replace = true;
      for (uint64_t i = 0; Clock::now() < end; ++i) {
        const BlockKey key = KeyOf(o.seed ^ salt, t, i % kWindow);
        auto& d = data[i % kWindow];
        if (d.empty()) {
          d.resize(block);
          soak::Payload(key, o.seed, d);
        }
        PutItem item{key, d, {}};
        Status s = chs[t]->Put(std::span(&item, 1), ro);
        k->calls++;
        if (!s.ok() || !item.status.ok()) {
          k->errors++;
          continue;
        }
        bytes += block;
        stored[i % kWindow] = true;
      }
      for (uint64_t i = 0; i < kWindow; ++i)
        if (stored[i]) (*keys)[t].push_back(KeyOf(o.seed ^ salt, t, i));
    });
  }
  for (auto& t : ts) t.join();
  return double(bytes.load()) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

// GETs of the keys each channel stored, round robin, for `seconds`; every
// byte compared.
double GetFor(std::vector<std::unique_ptr<ShardChannel>>& chs, const HostBenchOptions& o, size_t block,
              const std::vector<std::vector<BlockKey>>& keys, BenchCounters* k) {
  std::vector<std::thread> ts;
  std::atomic<uint64_t> bytes{0};
  const auto t0 = Clock::now(), end = t0 + std::chrono::microseconds(static_cast<int64_t>(o.seconds * 1e6));
  for (uint32_t t = 0; t < chs.size(); ++t) {
    ts.emplace_back([&, t] {
      const auto& mine = keys[t];
      if (mine.empty()) return;
      std::vector<std::byte> got(block), want(block);
      RequestOptions ro;
      for (uint64_t i = 0; Clock::now() < end; ++i) {
        const BlockKey key = mine[i % mine.size()];
        GetItem item{key, got, 0, {}};
        Status s = chs[t]->Get(std::span(&item, 1), ro);
        k->calls++;
        if (!s.ok() || !item.status.ok()) {
          k->errors++;
          continue;
        }
        soak::Payload(key, o.seed, want);
        if (item.size != block || std::memcmp(got.data(), want.data(), block) != 0) {
          k->wrong_bytes += block;
          continue;
        }
        k->bytes_compared += block;
        bytes += block;
      }
    });
  }
  for (auto& t : ts) t.join();
  return double(bytes.load()) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

}  // namespace

Result<nlohmann::json> RunHostBench(const HostBenchOptions& o, BenchCounters* counters) {
  std::string chost;
  uint16_t cport = 0;
  KVMESH_RETURN_IF_ERROR(SplitHostPort(o.coordinator, &chost, &cport));
  HttpRequestOptions h;
  if (!o.token.empty()) h.authorization = BearerAuthorization(o.token);
  KVMESH_ASSIGN_OR_RETURN(PublishedMap pm, FetchPublishedMap(chost, cport, o.timeout_ms, h));
  nlohmann::json hosts = nlohmann::json::array();
  for (const ShardInfo& n : pm.nodes) {
    if (!o.only_node.empty() && n.id != o.only_node) continue;
    std::vector<std::unique_ptr<ShardChannel>> chs;
    for (uint32_t t = 0; t < o.threads; ++t) {
      KVMESH_ASSIGN_OR_RETURN(auto ch, Channel(pm, n, o, o.block));
      chs.push_back(std::move(ch));
    }
    std::vector<double> put, get, up, down;
    for (uint32_t rep = 0; rep < o.reps; ++rep) {
      std::vector<std::vector<BlockKey>> keys;
      put.push_back(PutFor(chs, o, o.block, /*salt=*/1, &keys, counters));  // the same keys every round
      get.push_back(GetFor(chs, o, o.block, keys, counters));
      for (auto [mode, out] : {std::pair{RawMode::kUpload, &up}, std::pair{RawMode::kDownload, &down}}) {
        KVMESH_ASSIGN_OR_RETURN(RawResult rr, RawThroughput(n.host, o.sink_port, mode, o.block, o.threads, o.seconds));
        out->push_back(rr.gbps());
      }
    }
    const double p = Median(put), g = Median(get), u = Median(up), d = Median(down);
    hosts.push_back({{"node", n.id},
                     {"host", n.host},
                     {"gbps", {{"put", p}, {"get", g}, {"raw_up", u}, {"raw_down", d}}},
                     {"ratio", {{"put_over_raw_up", Ratio(p, u)}, {"get_over_raw_down", Ratio(g, d)}}}});
  }
  if (hosts.empty()) return NotFound("no node " + (o.only_node.empty() ? std::string("in the map") : o.only_node));
  return nlohmann::json{{"backend", pm.backend}, {"block", o.block},   {"threads", o.threads},
                        {"seconds", o.seconds},  {"reps", o.reps},     {"hosts", hosts}};
}

}  // namespace kvmesh::multihost
