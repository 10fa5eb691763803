// bench/bench_router.cc — Router fan-out against the serial path, in one run.
//
// Starts N shard nodes (4 and 8 by default), each behind its own TCP data
// server on 127.0.0.1 in this process, and two routers over the same TCP
// channels: one with RouterOptions::parallel_fanout (every node's call in
// flight together) and one without (the serial path: one node after
// another). For a prompt of 64 blocks, spread over the nodes by rendezvous
// hashing, it times MatchPrefix, GetBatch and PutBatch, the two routers in
// alternating trials (bench_util MeasurePair), and reports the median latency
// of each and serial/fan-out as the speedup. An in-process row (same code,
// in-process channels: fan-out never applies) checks the embedded path.
//
// Loopback has no wire: a "round trip" there is only CPU (syscalls, wake-ups,
// the node's work), which client and nodes share on this machine's cores.
// --rtt-us N puts a forwarder in front of every node that holds each byte
// N/2 us in each direction (threads that sleep, not spin), the latency a
// datacenter network adds; both routers go through the same forwarders.
//
//   build-*/bin/bench_router [--nodes 4,8] [--block-kib 16,256] [--blocks 64]
//                            [--trials 200] [--server-threads 1] [--rtt-us 0,100] [--json]
//
// Progress on stderr; a Markdown table (or with --json one JSON object) on stdout.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "coordinator/embedded/inproc_channel.h"
#include "kvmesh/config.h"
#include "kvmesh/router.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "transport/shard_channel.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"

using namespace kvmesh;

namespace {

struct Args {
  std::vector<int> nodes{4, 8};
  std::vector<int> block_kib{16, 256};
  int blocks = 64;
  int trials = 200;
  int server_threads = 1;
  std::vector<int> rtt_us{0, 100};
  bool json = false;
  bool help = false;  // --help: usage printed, nothing run
};

std::vector<int> IntList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    p = std::strchr(p, ',');
    if (p == nullptr) break;
    ++p;
  }
  return v;
}

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--nodes") a->nodes = IntList(val());
    else if (k == "--block-kib") a->block_kib = IntList(val());
    else if (k == "--blocks") a->blocks = std::atoi(val());
    else if (k == "--trials") a->trials = std::atoi(val());
    else if (k == "--server-threads") a->server_threads = std::atoi(val());
    else if (k == "--rtt-us") a->rtt_us = IntList(val());
    else if (k == "--json") a->json = true;
    else {
      a->help = k == "--help" || k == "-h";
      std::fprintf(a->help ? stdout : stderr,
                   "usage: bench_router [--nodes 4,8] [--block-kib 16,256] [--blocks 64] [--trials 200] "
                   "[--server-threads 1] [--rtt-us 0,100] [--json]\n");
      return false;
    }
  }
  for (int kib : a->block_kib)
    if (kib < 2 || kib % 2 != 0) {
      std::fprintf(stderr, "--block-kib: even sizes >= 2\n");
      return false;
    }
  return !a->nodes.empty() && !a->block_kib.empty() && a->blocks > 0 && a->trials > 0;
}

// A model whose full block is `kib` KiB: 2 (K,V) x 4 layers x 8 heads x 16 tokens x head_dim x 2 (fp16).
ClusterConfig Config(int nodes, int kib, int blocks) {
  const int head_dim = kib * 1024 / (2 * 4 * 8 * 16 * 2);
  const uint64_t budget = (uint64_t(blocks) * kib * 1024 * 2) / uint64_t(nodes) + (8u << 20);  // room for imbalance
  std::string j = R"({"model": {"model_id": "bench-router", "num_layers": 4, "num_kv_heads": 8, "head_dim": )" +
                  std::to_string(head_dim) + R"(, "dtype": "fp16", "block_tokens": 16}, "nodes": [)";
  for (int i = 0; i < nodes; ++i)
    j += std::string(i ? "," : "") + R"({"id": "n)" + std::to_string(i) + R"(", "memory": {"host": )" +
         std::to_string(budget) + "}}";
  j += "]}";
  auto c = ParseConfig(j);
  if (!c.ok()) {
    std::fprintf(stderr, "config: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return *c;
}

// A TCP forwarder in front of one node that delays every byte by `one_way`
// in each direction. Per direction a reader stamps what it receives and a
// writer sends it when due, so delay does not limit bandwidth.
class DelayProxy {
 public:
  DelayProxy(uint16_t target, std::chrono::microseconds one_way) : target_(target), delay_(one_way) {
    lfd_ = UniqueFd(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(lfd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(lfd_.get(), 16) != 0) {
      std::perror("proxy listen");
      std::exit(1);
    }
    socklen_t len = sizeof(a);
    ::getsockname(lfd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { Accept(); });
  }
  ~DelayProxy() {
    stop_ = true;
    ::shutdown(lfd_.get(), SHUT_RDWR);
    accept_.join();  // then nothing adds connections, pipes or threads
    for (auto& fd : fds_) ::shutdown(fd->get(), SHUT_RDWR);
    for (auto& p : pipes_) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->closed = true;
      p->cv.notify_all();
    }
    for (auto& t : threads_) t.join();
  }
  uint16_t port() const { return port_; }

 private:
  struct Pipe {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<std::chrono::steady_clock::time_point, std::vector<char>>> q;
    bool closed = false;
  };
  void Accept() {
    while (!stop_) {
      int c = ::accept(lfd_.get(), nullptr, nullptr);
      if (c < 0) return;
      auto s = ConnectTcp("127.0.0.1", target_, std::chrono::steady_clock::now() + std::chrono::seconds(2));
      if (!s.ok()) {
        ::close(c);
        continue;
      }
      SetNoDelay(c);
      SetNoDelay(s->get());
      ::fcntl(s->get(), F_SETFL, ::fcntl(s->get(), F_GETFL) & ~O_NONBLOCK);  // the pumps block
      fds_.push_back(std::make_unique<UniqueFd>(c));
      fds_.push_back(std::make_unique<UniqueFd>(std::move(*s)));
      const int cf = fds_[fds_.size() - 2]->get(), sf = fds_.back()->get();
      for (auto [from, to] : {std::pair{cf, sf}, std::pair{sf, cf}}) {
        pipes_.push_back(std::make_unique<Pipe>());
        Pipe* p = pipes_.back().get();
        threads_.emplace_back([this, p, from] { Read(p, from); });
        threads_.emplace_back([this, p, to] { Write(p, to); });
      }
    }
  }
  void Read(Pipe* p, int fd) {
    for (;;) {
      std::vector<char> buf(256 << 10);
      ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      std::lock_guard<std::mutex> lock(p->mu);
      if (n <= 0) {
        p->closed = true;
        p->cv.notify_all();
        return;
      }
      buf.resize(size_t(n));
      p->q.emplace_back(std::chrono::steady_clock::now() + delay_, std::move(buf));
      p->cv.notify_all();
    }
  }
  void Write(Pipe* p, int fd) {
    ::prctl(PR_SET_TIMERSLACK, 1UL);  // wake on time (the default slack is 50 us)
    for (;;) {
      std::unique_lock<std::mutex> lock(p->mu);
      p->cv.wait(lock, [&] { return p->closed || !p->q.empty(); });
      if (p->q.empty()) return;
      auto [due, buf] = std::move(p->q.front());
      p->q.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(due);
      for (size_t off = 0; off < buf.size();) {
        ssize_t w = ::send(fd, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
        if (w <= 0) return;
        off += size_t(w);
      }
    }
  }

  uint16_t target_, port_ = 0;
  std::chrono::microseconds delay_;
  UniqueFd lfd_;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  // Written by the accept thread only, read by the destructor after joining it.
  std::vector<std::unique_ptr<UniqueFd>> fds_;
  std::vector<std::unique_ptr<Pipe>> pipes_;
  std::vector<std::thread> threads_;
};

struct Row {
  std::string transport, op;
  int nodes = 0, block_kib = 0, rtt_us = 0;
  double fan_us = 0, serial_us = 0;  // median latency
  double speedup() const { return fan_us > 0 ? serial_us / fan_us : 0; }
};

void Die(const char* what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Times MatchPrefix, GetBatch and PutBatch of one prompt with both routers.
void MeasureCluster(const Args& a, const std::string& transport, int nodes, int kib, int rtt_us,
                    std::vector<Row>* rows) {
  ClusterConfig cfg = Config(nodes, kib, a.blocks);
  std::atomic<uint64_t> epoch{0};
  std::vector<std::unique_ptr<ShardNode>> shard;
  std::vector<std::unique_ptr<DataServer>> servers;
  std::vector<std::shared_ptr<ShardChannel>> channels;
  std::vector<std::unique_ptr<DelayProxy>> proxies;
  for (const NodeConfig& nc : cfg.nodes) {
    auto n = ShardNode::Create(cfg, nc.id);
    if (!n.ok()) Die("node", n.status());
    shard.push_back(std::move(*n));
    if (transport == "tcp") {
      DataServerOptions so;
      so.threads = static_cast<uint32_t>(a.server_threads);
      auto s = DataServer::Start(shard.back().get(), so, &epoch);
      if (!s.ok()) Die("data server", s.status());
      servers.push_back(std::move(*s));
      TcpChannelOptions co;
      co.port = servers.back()->port();
      if (rtt_us > 0) {
        proxies.push_back(std::make_unique<DelayProxy>(co.port, std::chrono::microseconds(rtt_us / 2)));
        co.port = proxies.back()->port();
      }
      auto ch = TcpChannel::Create(co);
      if (Status c = ch->Connect(); !c.ok()) Die("connect", c);
      channels.push_back(std::move(ch));
    } else {
      channels.push_back(MakeInProcessChannel(shard.back().get()));
    }
  }
  auto map = ShardMap::FromConfig(cfg).value();
  RouterOptions fo, so;
  fo.parallel_fanout = true;
  so.parallel_fanout = false;
  auto fan = Router::Create(cfg.model, map, channels, fo).value();
  auto serial = Router::Create(cfg.model, map, channels, so).value();

  std::vector<TokenId> prompt(size_t(a.blocks) * cfg.model.block_tokens);
  std::iota(prompt.begin(), prompt.end(), TokenId(nodes * 100000 + kib));
  const std::vector<BlockKey> keys = fan->Keys(prompt);
  const size_t bytes = cfg.model.FullBlockBytes();
  std::vector<std::vector<std::byte>> data(keys.size(), std::vector<std::byte>(bytes));
  std::mt19937_64 rng(uint64_t(nodes) * 131 + uint64_t(kib));
  for (auto& d : data)
    for (auto& b : d) b = static_cast<std::byte>(rng());
  std::vector<PutItem> puts;
  for (size_t i = 0; i < keys.size(); ++i) puts.push_back(PutItem{keys[i], data[i], {}});
  if (Status s = serial->PutBatch(puts); !s.ok()) Die("initial PutBatch", s);
  std::vector<size_t> per_node(nodes, 0);
  for (const BlockKey& k : keys) ++per_node[map->Primary(k, {})];

  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(bytes));
  std::vector<GetItem> gets(keys.size());
  auto match = [&](Router& r) {
    auto m = r.MatchPrefix(prompt);
    if (!m.ok() || *m != keys.size()) Die("MatchPrefix", m.ok() ? Internal("partial match") : m.status());
    return 1.0;
  };
  auto get = [&](Router& r) {
    for (size_t i = 0; i < keys.size(); ++i) gets[i] = GetItem{keys[i], dst[i], 0, {}};
    if (Status s = r.GetBatch(gets); !s.ok()) Die("GetBatch", s);
    for (const GetItem& g : gets)
      if (!g.status.ok()) Die("GetBatch item", g.status);
    return 1.0;
  };
  auto put = [&](Router& r) {
    for (PutItem& p : puts) p.status = Status::Ok();
    if (Status s = r.PutBatch(puts); !s.ok()) Die("PutBatch", s);
    return 1.0;
  };
  struct Op {
    const char* name;
    std::function<double(Router&)> fn;
  };
  const Op ops[] = {{"MatchPrefix", match}, {"GetBatch", get}, {"PutBatch", put}};
  for (const Op& op : ops) {
    // Large blocks move MiBs per call: fewer trials keep a cell near a second.
    // Odd, so the median rate is exactly 1 / the median latency.
    const int trials = std::max(21, kib >= 128 ? a.trials / 4 : a.trials) | 1;
    auto [f, s] = bench::MeasurePair(trials, [&] { return op.fn(*fan); }, [&] { return op.fn(*serial); });
    Row row{transport, op.name, nodes, kib, rtt_us, 1e6 / f.median, 1e6 / s.median};
    std::fprintf(stderr, "  %-6s %d nodes %4d KiB rtt %3d us %-11s fan-out %9.1f us  serial %9.1f us  x%.2f\n",
                 transport.c_str(), nodes, kib, rtt_us, op.name, row.fan_us, row.serial_us, row.speedup());
    rows->push_back(row);
  }
  std::string spread;
  for (size_t n : per_node) spread += (spread.empty() ? "" : "/") + std::to_string(n);
  std::fprintf(stderr, "  (%s: blocks per node %s)\n", transport.c_str(), spread.c_str());
  fan.reset();
  serial.reset();
  channels.clear();  // closes the connections, so the forwarders' threads end
  proxies.clear();
  for (auto& s : servers) s->Stop();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!Parse(argc, argv, &a)) return a.help ? 0 : 2;
  std::vector<Row> rows;
  for (int kib : a.block_kib) {
    for (int rtt : a.rtt_us) {
      for (int n : a.nodes) {
        std::fprintf(stderr, "bench_router: %d nodes over TCP (rtt +%d us), %d x %d KiB blocks, %d trials\n", n, rtt,
                     a.blocks, kib, a.trials);
        MeasureCluster(a, "tcp", n, kib, rtt, &rows);
      }
    }
    std::fprintf(stderr, "bench_router: %d in-process nodes, %d x %d KiB blocks\n", a.nodes.front(), a.blocks, kib);
    MeasureCluster(a, "inproc", a.nodes.front(), kib, 0, &rows);
  }
  if (a.json) {
    nlohmann::json j;
    j["benchmark"] = "bench_router";
    j["blocks"] = a.blocks;
    j["server_threads"] = a.server_threads;
    for (const Row& r : rows)
      j["results"].push_back({{"transport", r.transport}, {"nodes", r.nodes}, {"block_kib", r.block_kib},
                              {"added_rtt_us", r.rtt_us},
                              {"op", r.op}, {"fanout_median_us", r.fan_us}, {"serial_median_us", r.serial_us},
                              {"speedup", r.speedup()}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("| transport | added RTT | nodes | block | op | fan-out p50 (us) | serial p50 (us) | serial / fan-out |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %d us | %d | %d KiB | %s | %.1f | %.1f | %.2fx |\n", r.transport.c_str(), r.rtt_us, r.nodes,
                r.block_kib, r.op.c_str(), r.fan_us, r.serial_us, r.speedup());
  return 0;
}
