// bench/bench_transport.cc — kvmesh over TCP (and UCX) vs Redis vs raw loopback TCP, in one run.
//
// Starts a standalone `kvmesh node` (binary protocol) and a `redis-server`
// (no persistence) on 127.0.0.1, then for each block size (64 KiB, 256 KiB,
// 1 MiB) and client count (1, 8) measures PUT/SET and GET throughput (GB/s,
// ops/s) and p50/p99 latency, each cell repeated `--reps` times with the
// three systems interleaved; medians are printed. Raw loopback TCP is measured
// twice: a one-way stream (the link's ceiling) and a request/ack exchange of
// the same size (what a perfect store over one TCP round trip could reach).
//
//   build/bench/bench_transport [--seconds 1] [--reps 3] [--sizes 65536,262144,1048576] [--clients 1,8]
//                               [--tables transport,resp] [--resp-sizes 16384] [--resp-clients 1,8]
//
// The RESP table (docs/resp.md): redis-benchmark-style SET and GET (one
// blocking request per client at a time) of --resp-sizes values against
// redis-server, the node-local RESP front of one `kvmesh node`, and a
// `kvmesh proxy` in front of a coordinator and two nodes (every key through
// the router to its owner), interleaved per rep; medians and ratios.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/histogram.h"
#include "kvmesh/build_config.h"
#include "tests/cluster_process.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"
#if defined(KVMESH_HAVE_UCX)
#include "transport/ucx_channel.h"
#include "transport/ucx_worker.h"
#endif

using namespace kvmesh;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// One random value of `size` bytes per client, seeded by the size (the same
// bytes in every run and table).
std::vector<std::vector<std::byte>> Payloads(size_t clients, size_t size) {
  std::vector<std::vector<std::byte>> payload(clients, std::vector<std::byte>(size));
  std::mt19937_64 rng(size);
  for (auto& p : payload)
    for (auto& b : p) b = static_cast<std::byte>(rng());
  return payload;
}

#if defined(KVMESH_HAVE_UCX)
constexpr bool KVMESH_UCX_ON = true;
#else
constexpr bool KVMESH_UCX_ON = false;
#endif

struct Cell {
  double gbps = 0, ops = 0, p50_us = 0, p99_us = 0;
};

Cell Median(std::vector<Cell> v) {
  auto med = [&](auto f) {
    std::vector<double> x;
    for (auto& c : v) x.push_back(f(c));
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  return Cell{med([](const Cell& c) { return c.gbps; }), med([](const Cell& c) { return c.ops; }),
              med([](const Cell& c) { return c.p50_us; }), med([](const Cell& c) { return c.p99_us; })};
}

// Runs `clients` threads of op(thread, iteration) for `seconds`; returns throughput and latency.
Cell RunClients(int clients, double seconds, size_t bytes_per_op, const std::function<bool(int, uint64_t)>& op) {
  std::vector<LatencyHistogram> hist(clients);
  std::vector<uint64_t> done(clients, 0);
  std::atomic<bool> failed{false};
  const auto t0 = SteadyClock::now();
  const auto end = t0 + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> ts;
  for (int c = 0; c < clients; ++c) {
    ts.emplace_back([&, c] {
      uint64_t i = 0;
      while (SteadyClock::now() < end) {
        auto a = SteadyClock::now();
        if (!op(c, i++)) {
          failed = true;
          return;
        }
        hist[c].Record(std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - a).count());
        ++done[c];
      }
    });
  }
  for (auto& t : ts) t.join();
  const double dt = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  if (failed) std::fprintf(stderr, "bench: an operation failed\n");
  LatencyHistogram all;
  uint64_t n = 0;
  for (int c = 0; c < clients; ++c) {
    all.Merge(hist[c]);
    n += done[c];
  }
  return Cell{double(n) * double(bytes_per_op) / dt / 1e9, double(n) / dt, all.Percentile(0.5) / 1e3,
              all.Percentile(0.99) / 1e3};
}

uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// ---- a minimal blocking RESP client -------------------------------------------
class RedisClient {
 public:
  bool Connect(uint16_t port) {
    for (int i = 0; i < 100; ++i) {
      auto fd = ConnectTcp("127.0.0.1", port, SteadyClock::now() + 1s);
      if (fd.ok()) {
        fd_ = std::move(*fd);
        SetNoDelay(fd_.get());
        return true;
      }
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  bool Set(const std::string& key, std::span<const std::byte> v) {
    std::string h = "*3\r\n$3\r\nSET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n$" +
                    std::to_string(v.size()) + "\r\n";
    std::vector<iovec> iov{{h.data(), h.size()}, {const_cast<std::byte*>(v.data()), v.size()}, {crlf_, 2}};
    if (!WriteAllV(fd_.get(), iov, SteadyClock::now() + 5s).ok()) return false;
    char ok[5];
    return ReadFull(fd_.get(), ok, 5, 5000, {}).ok() && std::memcmp(ok, "+OK\r\n", 5) == 0;
  }
  bool Get(const std::string& key, std::vector<std::byte>* out) {
    std::string h = "*2\r\n$3\r\nGET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n";
    if (!WriteAll(fd_.get(), h.data(), h.size(), SteadyClock::now() + 5s).ok()) return false;
    std::string line;
    char c;
    while (true) {  // "$<len>\r\n"
      if (!ReadFull(fd_.get(), &c, 1, 5000, {}).ok()) return false;
      if (c == '\n') break;
      line += c;
    }
    if (line.size() < 2 || line[0] != '$') return false;
    long n = std::atol(line.c_str() + 1);
    if (n < 0) return false;
    out->resize(static_cast<size_t>(n) + 2);
    return ReadFull(fd_.get(), out->data(), out->size(), 5000, {}).ok();
  }

 private:
  UniqueFd fd_;
  char crlf_[2] = {'\r', '\n'};
};

// ---- raw loopback TCP: a sink that acks each message ----------------------------
class RawServer {
 public:
  explicit RawServer(size_t msg) : msg_(msg) {
    lfd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(lfd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(lfd_, 64);
    socklen_t len = sizeof(a);
    ::getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] {
      for (;;) {
        int fd = ::accept(lfd_, nullptr, nullptr);
        if (fd < 0) return;
        conns_.emplace_back([this, fd] {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          std::vector<char> buf(msg_);
          char mode;
          if (::recv(fd, &mode, 1, MSG_WAITALL) != 1) return (void)::close(fd);
          for (;;) {
            if (::recv(fd, buf.data(), buf.size(), MSG_WAITALL) != static_cast<ssize_t>(buf.size())) break;
            if (mode == 'a' && ::send(fd, "k", 1, MSG_NOSIGNAL) != 1) break;
          }
          ::close(fd);
        });
      }
    });
  }
  ~RawServer() {
    ::shutdown(lfd_, SHUT_RDWR);
    ::close(lfd_);
    acceptor_.join();
    for (auto& t : conns_) t.join();
  }
  uint16_t port() const { return port_; }

 private:
  size_t msg_;
  int lfd_;
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> conns_;
};

int RawClient(uint16_t port, char mode) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::send(fd, &mode, 1, 0);
  return fd;
}

std::vector<size_t> ParseList(const std::string& s) {
  std::vector<size_t> v;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t c = s.find(',', pos);
    v.push_back(std::stoul(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos)));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return v;
}

std::string SizeName(size_t b) { return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB"; }

// ---- the RESP table: redis-server vs node-local front vs kvmesh proxy -------------
int RespTable(const std::string& kvmesh_bin, const std::string& redis_bin, double seconds, int reps,
              const std::vector<size_t>& sizes, const std::vector<size_t>& client_counts) {
  const size_t max_clients = *std::max_element(client_counts.begin(), client_counts.end());
  const size_t keys_per_client = 16;
  const std::string cfg_path = "/tmp/kvmesh-bench-resp-" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream f(cfg_path);
    f << R"({"model": {"model_id": "bench", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64, "block_tokens": 16},
            "nodes": [{"id": "r0", "ports": {"data": 0, "http": 0, "resp": 0}, "memory": {"host": "256MiB"}},
                      {"id": "r1", "ports": {"data": 0, "http": 0, "resp": 0}, "memory": {"host": "256MiB"}}],
            "store": {"slot_bytes": "1MiB", "stripes": 8},
            "transport": {"io_threads": 2, "backend": "tcp"},
            "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_ms": 200, "dead_after_ms": 2000}})";
  }
  testing::Process coord, proxy, redis;
  std::vector<std::unique_ptr<testing::Process>> nodes;
  auto cleanup = [&] {
    proxy.Kill(SIGTERM), proxy.Wait(5s);
    for (auto& n : nodes) n->Kill(SIGTERM), n->Wait(5s);
    coord.Kill(SIGTERM), coord.Wait(5s);
    redis.Kill(SIGTERM), redis.Wait(5s);
    ::unlink(cfg_path.c_str());
  };
  if (!coord.Start({kvmesh_bin, "coordinator", "--config", cfg_path, "--port", "0"})) return 1;
  auto ce = coord.WaitEvent("listening", 10s);
  if (!ce) return cleanup(), 1;
  const std::string coord_addr = "127.0.0.1:" + std::to_string((*ce)["ports"]["http"].get<uint16_t>());
  uint16_t local_port = 0;
  for (const char* id : {"r0", "r1"}) {
    nodes.push_back(std::make_unique<testing::Process>());
    if (!nodes.back()->Start({kvmesh_bin, "node", "--config", cfg_path, "--id", id, "--coordinator", coord_addr}))
      return cleanup(), 1;
    auto ne = nodes.back()->WaitEvent("listening", 10s);
    if (!ne) return cleanup(), 1;
    if (local_port == 0) local_port = (*ne)["ports"]["resp"].get<uint16_t>();
  }
  std::this_thread::sleep_for(600ms);  // both nodes registered (heartbeat 200 ms)
  if (!proxy.Start({kvmesh_bin, "proxy", "--config", cfg_path, "--coordinator", coord_addr, "--resp-port", "0"}))
    return cleanup(), 1;
  auto pe = proxy.WaitEvent("listening", 10s);
  if (!pe) {
    std::fprintf(stderr, "bench: kvmesh proxy did not start\n");
    return cleanup(), 1;
  }
  const uint16_t proxy_port = (*pe)["ports"]["resp"].get<uint16_t>();
  const int proxy_nodes = (*pe)["nodes"].get<int>();
  const uint16_t redis_port = FreePort();
  const bool have_redis = ::access(redis_bin.c_str(), X_OK) == 0 &&
                          redis.Start({redis_bin, "--port", std::to_string(redis_port), "--bind", "127.0.0.1", "--save",
                                       "", "--appendonly", "no", "--protected-mode", "no"});
  struct Target {
    const char* name = "";
    uint16_t port = 0;
    std::vector<RedisClient> c;
  };
  std::vector<Target> targets(3);
  targets[0].name = "redis", targets[0].port = redis_port;
  targets[1].name = "local", targets[1].port = local_port;
  targets[2].name = "proxy", targets[2].port = proxy_port;
  for (auto& t : targets) {
    if (std::string(t.name) == "redis" && !have_redis) continue;
    t.c.resize(max_clients);
    for (auto& c : t.c)
      if (!c.Connect(t.port)) return std::fprintf(stderr, "bench: cannot reach %s\n", t.name), cleanup(), 1;
  }
  std::printf("\n# RESP: redis-server vs kvmesh node-local front vs kvmesh proxy (%d nodes) — %d reps x %.1f s per "
              "cell, medians\n", proxy_nodes, reps, seconds);
  std::printf("| op | value | clients | redis ops/s | redis p50/p99 us | node-local ops/s | node-local p50/p99 us | "
              "proxy ops/s | proxy p50/p99 us | proxy/redis | proxy/node-local | node-local/redis |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t size : sizes) {
    const std::vector<std::vector<std::byte>> payload = Payloads(max_clients, size);
    std::vector<std::vector<std::byte>> dst(max_clients, std::vector<std::byte>(size + 2));
    auto key = [&](int c, uint64_t i) {
      return "rk" + std::to_string(c) + ":" + std::to_string(i % keys_per_client) + ":" + std::to_string(size);
    };
    for (auto& t : targets)  // every key exists before any timed GET
      for (size_t c = 0; c < t.c.size(); ++c)
        for (size_t k = 0; k < keys_per_client; ++k)
          if (!t.c[c].Set(key(int(c), k), payload[c])) return std::fprintf(stderr, "bench: SET on %s\n", t.name), cleanup(), 1;
    for (size_t clients : client_counts) {
      std::map<std::string, std::vector<Cell>> cells;
      for (int r = 0; r < reps; ++r) {
        for (auto& t : targets) {
          if (t.c.empty()) continue;
          cells[std::string(t.name) + "_set"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            return t.c[c].Set(key(c, i), payload[c]);
          }));
          cells[std::string(t.name) + "_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            return t.c[c].Get(key(c, i), &dst[c]) && dst[c].size() == size + 2 &&
                   std::memcmp(dst[c].data(), payload[c].data(), size) == 0;
          }));
        }
      }
      for (const char* op : {"set", "get"}) {
        auto med = [&](const char* t) {
          auto& v = cells[std::string(t) + "_" + op];
          return v.empty() ? Cell{} : Median(v);
        };
        const Cell rd = med("redis"), lo = med("local"), px = med("proxy");
        auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
        std::printf("| %s | %s | %zu | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f | %.2fx | %.2fx | %.2fx |\n",
                    std::string(op) == "set" ? "SET" : "GET", SizeName(size).c_str(), clients, rd.ops, rd.p50_us,
                    rd.p99_us, lo.ops, lo.p50_us, lo.p99_us, px.ops, px.p50_us, px.p99_us, ratio(px.ops, rd.ops),
                    ratio(px.ops, lo.ops), ratio(lo.ops, rd.ops));
        std::fflush(stdout);
      }
    }
  }
  cleanup();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  int reps = 3;
  std::string sizes_arg = "65536,262144,1048576", clients_arg = "1,8";
  std::string kvmesh_bin = KVMESH_BIN, redis_bin = KVMESH_REDIS_SERVER;
  std::string tables = "transport,resp", resp_sizes_arg = "16384", resp_clients_arg = "1,8";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--seconds") seconds = std::stod(v);
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--sizes") sizes_arg = v;
    else if (k == "--clients") clients_arg = v;
    else if (k == "--kvmesh") kvmesh_bin = v;
    else if (k == "--redis-server") redis_bin = v;
    else if (k == "--tables") tables = v;
    else if (k == "--resp-sizes") resp_sizes_arg = v;
    else if (k == "--resp-clients") resp_clients_arg = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const auto sizes = ParseList(sizes_arg);
  for (size_t s : sizes)
    if (s == 0 || s > (1u << 20)) {
      std::fprintf(stderr, "sizes must be in 1..1048576 (the node's slot size)\n");
      return 2;
    }
  const auto client_counts = ParseList(clients_arg);
  const bool want_transport = tables.find("transport") != std::string::npos;
  const bool want_resp = tables.find("resp") != std::string::npos;
  if (!want_transport) {
    if (!want_resp) return 0;
    return RespTable(kvmesh_bin, redis_bin, seconds, reps, ParseList(resp_sizes_arg), ParseList(resp_clients_arg));
  }
  const size_t max_clients = *std::max_element(client_counts.begin(), client_counts.end());
  const size_t keys_per_client = 16;

  // The kvmesh node: one standalone daemon with room for every key of the run.
  const std::string cfg_path = "/tmp/kvmesh-bench-" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream f(cfg_path);
    f << R"({"model": {"model_id": "bench", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64, "block_tokens": 16},
            "nodes": [{"id": "b0", "memory": {"host": ")"
      << (sizes.size() * max_clients * keys_per_client + 160) << R"(MiB"}}],
            "store": {"slot_bytes": "1MiB", "stripes": 8},
            "transport": {"io_threads": 2, "backend": ")" << (KVMESH_UCX_ON ? "ucx" : "tcp") << R"("}})";
  }
  testing::Process node;
  if (!node.Start({kvmesh_bin, "node", "--config", cfg_path, "--id", "b0", "--no-resp"})) return 1;
  auto ev = node.WaitEvent("listening", 10s);
  if (!ev) {
    std::fprintf(stderr, "bench: kvmesh node did not start\n");
    return 1;
  }
  const uint16_t data_port = (*ev)["ports"]["data"].get<uint16_t>();
  std::vector<std::unique_ptr<ShardChannel>> ux;  // UCX channels, one per client (empty without UCX)
#if defined(KVMESH_HAVE_UCX)
  {
    auto addr = HexDecode(ev->value("ucx_address", ""));
    for (size_t c = 0; addr.ok() && !addr->empty() && c < max_clients; ++c) {
      UcxChannelOptions uo;
      uo.node_address = *addr;
      uo.timeout_ms = 10000;
      uo.limits.max_body_bytes = 64 << 20;
      auto u = UcxChannel::Connect(uo);
      if (!u.ok()) {
        std::fprintf(stderr, "bench: UCX channel: %s\n", u.status().ToString().c_str());
        ux.clear();
        break;
      }
      ux.push_back(std::move(*u));
    }
  }
#endif

  // redis-server with persistence off, on loopback.
  testing::Process redis;
  const uint16_t redis_port = FreePort();
  bool have_redis = ::access(redis_bin.c_str(), X_OK) == 0 &&
                    redis.Start({redis_bin, "--port", std::to_string(redis_port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--protected-mode", "no"});
  std::vector<RedisClient> rc(max_clients);
  if (have_redis)
    for (auto& c : rc) have_redis = have_redis && c.Connect(redis_port);
  if (!have_redis) std::fprintf(stderr, "bench: redis-server unavailable, its columns stay empty\n");

  std::vector<std::unique_ptr<TcpChannel>> ch;
  for (size_t c = 0; c < max_clients; ++c) {
    TcpChannelOptions o;
    o.port = data_port;
    o.connections = 1;
    o.timeout_ms = 10000;
    ch.push_back(TcpChannel::Create(o));
    if (!ch.back()->Connect().ok()) return 1;
  }

  std::printf("# kvmesh TCP vs redis-server vs raw loopback TCP — %d reps x %.1f s per cell, medians\n", reps, seconds);
  std::printf("| op | block | clients | kvmesh TCP GB/s | kvmesh TCP ops/s | kvmesh TCP p50/p99 us | kvmesh UCX GB/s | "
              "kvmesh UCX p50/p99 us | redis GB/s | redis p50/p99 us | raw req/ack GB/s | raw stream GB/s | "
              "TCP/redis | UCX/redis | TCP/raw req |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t size : sizes) {
    const std::vector<std::vector<std::byte>> payload = Payloads(max_clients, size);
    std::vector<std::vector<std::byte>> dst(max_clients, std::vector<std::byte>(size + 2));
    auto key = [&](int c, uint64_t i) {
      uint64_t x = (uint64_t(c) << 32 | (i % keys_per_client)) * 0x9E3779B97F4A7C15ull + size;
      return BlockKey{x ^ (x >> 29), uint64_t(c) << 32 | (i % keys_per_client)};
    };
    // Every key exists before any timed GET (the timed PUT phase may not reach them all).
    for (size_t c = 0; c < max_clients; ++c) {
      for (size_t k = 0; k < keys_per_client; ++k) {
        PutItem it{key(int(c), k), payload[c], {}};
        if (!ch[c]->Put(std::span<PutItem>(&it, 1), {}).ok() || !it.status.ok()) return 1;
        if (have_redis && !rc[c].Set("k" + std::to_string(c) + ":" + std::to_string(k) + ":" + std::to_string(size), payload[c]))
          return 1;
      }
    }
    RawServer raw(size);
    for (size_t clients : client_counts) {
      std::map<std::string, std::vector<Cell>> cells;
      for (int r = 0; r < reps; ++r) {
        cells["kv_put"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
          PutItem it{key(c, i), payload[c], {}};
          Status s = ch[c]->Put(std::span<PutItem>(&it, 1), {});
          if (!s.ok() || !it.status.ok()) std::fprintf(stderr, "PUT: %s / %s\n", s.ToString().c_str(), it.status.ToString().c_str());
          return s.ok() && it.status.ok();
        }));
        cells["kv_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
          GetItem it{key(c, i), dst[c], 0, {}};
          Status s = ch[c]->Get(std::span<GetItem>(&it, 1), {});
          if (!s.ok() || !it.status.ok()) std::fprintf(stderr, "GET: %s / %s\n", s.ToString().c_str(), it.status.ToString().c_str());
          return s.ok() && it.status.ok() && it.size == size;
        }));
        if (!ux.empty()) {
          cells["ux_put"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            PutItem it{key(c, i), payload[c], {}};
            return ux[c]->Put(std::span<PutItem>(&it, 1), {}).ok() && it.status.ok();
          }));
          cells["ux_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            GetItem it{key(c, i), dst[c], 0, {}};
            return ux[c]->Get(std::span<GetItem>(&it, 1), {}).ok() && it.status.ok() && it.size == size;
          }));
        }
        if (have_redis) {
          cells["rd_put"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            return rc[c].Set("k" + std::to_string(c) + ":" + std::to_string(i % keys_per_client) + ":" + std::to_string(size), payload[c]);
          }));
          cells["rd_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            return rc[c].Get("k" + std::to_string(c) + ":" + std::to_string(i % keys_per_client) + ":" + std::to_string(size), &dst[c]);
          }));
        }
        std::vector<int> fds;
        for (size_t c = 0; c < clients; ++c) fds.push_back(RawClient(raw.port(), 'a'));
        cells["raw_req"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t) {
          char k;
          return ::send(fds[c], payload[c].data(), size, MSG_NOSIGNAL) == ssize_t(size) &&
                 ::recv(fds[c], &k, 1, MSG_WAITALL) == 1;
        }));
        for (int fd : fds) ::close(fd);
        fds.clear();
        for (size_t c = 0; c < clients; ++c) fds.push_back(RawClient(raw.port(), 's'));
        cells["raw_stream"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t) {
          return ::send(fds[c], payload[c].data(), size, MSG_NOSIGNAL) == ssize_t(size);
        }));
        for (int fd : fds) ::close(fd);
      }
      const Cell raw_req = Median(cells["raw_req"]), raw_stream = Median(cells["raw_stream"]);
      for (const char* op : {"put", "get"}) {
        const Cell kv = Median(cells[std::string("kv_") + op]);
        const Cell rd = have_redis ? Median(cells[std::string("rd_") + op]) : Cell{};
        const Cell uc = ux.empty() ? Cell{} : Median(cells[std::string("ux_") + op]);
        std::printf("| %s | %s | %zu | %.2f | %.0f | %.0f / %.0f | %.2f | %.0f / %.0f | %.2f | %.0f / %.0f | %.2f | %.2f | "
                    "%.2fx | %.2fx | %.2fx |\n",
                    std::string(op) == "put" ? "PUT/SET" : "GET", SizeName(size).c_str(), clients, kv.gbps, kv.ops,
                    kv.p50_us, kv.p99_us, uc.gbps, uc.p50_us, uc.p99_us, rd.gbps, rd.p50_us, rd.p99_us, raw_req.gbps,
                    raw_stream.gbps, rd.gbps > 0 ? kv.gbps / rd.gbps : 0.0, rd.gbps > 0 ? uc.gbps / rd.gbps : 0.0,
                    raw_req.gbps > 0 ? kv.gbps / raw_req.gbps : 0.0);
        std::fflush(stdout);
      }
    }
  }
  node.Kill(SIGTERM);
  node.Wait(5s);
  redis.Kill(SIGTERM);
  redis.Wait(5s);
  ::unlink(cfg_path.c_str());
  if (want_resp)
    return RespTable(kvmesh_bin, redis_bin, seconds, reps, ParseList(resp_sizes_arg), ParseList(resp_clients_arg));
  return 0;
}
