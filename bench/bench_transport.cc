// bench/bench_transport.cc — kvmesh over TCP and UCX vs the limits of this
// machine, in one run.
//
// Starts a standalone `kvmesh node` (binary protocol; UCX when built) and a
// `redis-server` (no persistence) on 127.0.0.1, then for each block size
// (64 KiB, 256 KiB, 1 MiB) and client count (1, 8) measures PUT/SET and GET
// throughput (GB/s, ops/s) and p50/p99 latency, each cell repeated `--reps`
// times with the systems interleaved; medians are printed. Each client's
// blocks live in one buffer registered with its UCX channel (an engine's KV
// pool; by default memory from UcxContext::Allocate, what
// Router::AllocateMemory hands out; --ucx-memory malloc for heap memory), so
// UCX GETs and PUTs are one-sided (GET_INTO / PUT_FROM); --ucx-memory
// unregistered registers nothing, so they are two-sided; TCP reads and writes
// the same buffers. The baselines, measured in the same run:
// ucx_perftest (ucp_am_lat per size: what one UCX message costs between two
// processes with the same UCX_TLS; ucp_am_bw per size and for 64 KiB), raw loopback TCP
// request/ack of the same size (what a perfect store over one TCP round trip
// could reach; "req/ack" is PUT-shaped, "get" sends a 1-byte request and
// reads the block back, the GET shape; both from one cache-hot buffer per
// connection, and again over the store's footprint: the raw server rotates
// through as many buffers per client as the node holds blocks for it, and
// raw GETs land in as many destinations, so neither end is cache-hot) and
// redis-server. Every cell also
// reports CPU us per operation (user + system of this process and of the
// server process: the node, redis-server; the raw server's threads live in
// this process), a cost that holds whatever else the cores are doing. Beside
// the UCX GETs, "copy+verify": client threads that copy each block from a
// pool-sized source into the GET's destination and hash it there, the work a
// one-sided GET cannot avoid, with no transport (the ceiling of that
// footprint at that many clients on these cores), and the hand-over
// ceilings: the same work done by as many server threads as the node has UCX
// workers, each request and answer handed over between threads through
// shared memory with the cheapest waits (a futex, between threads or
// processes; poll() on a datagram socket between processes, UCX's wake-up
// shape; a spin then a futex; sched_yield; and the one-sided-read shape,
// where the client copies after the answer), with no transport (HandOver). After each size, the
// issue-36 targets as same-run ratios (UCX GET many clients / 1 client, /
// ucp_am_bw, p99 / p50, CPU per GET; TCP GET / raw same shape, / raw same
// footprint) and each hand-over ceiling's many / one ratio, with the load
// average. Batch rows: one GetInto / PutFrom of
// 64 x 64 KiB blocks against ucp_am_bw. Progress goes to stderr.
//
//   build/bin/bench_transport [--seconds 1] [--reps 3] [--sizes 65536,262144,1048576] [--clients 1,8]
//                             [--tables transport,resp] [--resp-sizes 16384] [--resp-clients 1,8]
//                             [--resp-pipeline 1,16] [--redis-benchmark /usr/bin/redis-benchmark]
//                             [--ucx-progress poll|event|hybrid|adaptive] [--ucx-memory allocated|malloc|unregistered] [--json]
//                             [--ucx-workers N]   (the node's $.transport.ucx.workers; 0 = its default)
//                             [--io-threads N]    (the node's $.transport.io_threads, its TCP data server's threads; default 2)
//                             [--keys K]   (blocks per client, default 16: the footprint the GETs read and write)
//                             [--backends tcp,ucx,redis,raw,batch]   (which cells run, batch = the batch rows: to profile one path)
//                             [--ops GET,PUT]   (which operations of those cells run)
//                             [--ucx-local-reads on|off]   (default on: the UCX channels read blocks straight from
//                               the node's pool, transport/local_index.h; the GET cells then run again over
//                               channels without them, "UCX messages", the path every GET took before; the TCP
//                               cells run against a second node with the TCP backend, whose pool is private)
//
// --json prints one object, {"rows": [{backend, op, block_bytes, clients,
// batch, gbps, ops, p50_us, p99_us, cpu_us, server_cpu_us}, ...]}, backends tcp, ucx, redis, raw (op req/ack
// or get), ucx_perftest, copy+verify, the hand-over ceilings (backend "hand-over, futex", ...), instead of the tables (raw ops: req/ack, get, req/ack-footprint, get-footprint).
// server_cpu_us is the server's part of cpu_us: the node, redis-server, or the
// raw server's connection threads.
//
// The RESP table (docs/resp.md): redis-benchmark-style SET and GET (one
// blocking request per client at a time) of --resp-sizes values against
// redis-server, the node-local RESP front of one `kvmesh node`, and a
// `kvmesh proxy` in front of a coordinator and two nodes (every key through
// the router to its owner), interleaved per rep; medians and ratios; then the
// same three driven by the stock redis-benchmark (--resp-pipeline depths),
// with a fourth: two nodes in Redis Cluster mode under redis-benchmark
// --cluster (each key straight to its slot's node).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
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

double CpuSeconds(pid_t pid);  // user + system seconds of a process so far

// The hand-over ceiling: a GET's work (the node's copy of a block into the
// client's memory, the client's check) and the least costly hand-over of
// each request and answer, with no transport: `servers` server threads (the
// node's UCX workers) serve `clients` slots (client c by server c % servers)
// through shared memory. A client publishes its request, rings its server's
// bell, and waits for the answer; a server copies the block, publishes the
// answer and wakes the client if it sleeps. How a thread waits is the mode:
// kFutex sleeps on a futex once `spin_us` of polling found nothing (0: at
// once, as UCX's `event`), kYield never sleeps and gives its core away with
// sched_yield between polls. With `processes` each server is a process of its
// own (forked; the state lives in a shared mapping, the destinations must
// too), so every hand-over also switches address spaces, as between a client
// and its node. With `sockets` a sleeper sleeps in poll() on a datagram
// socket of its own and is woken by a 1-byte datagram, which it drains
// after waking: the shape of UCX's wake-up between processes on one host
// (the shared-memory transport's signal socket under the worker's fd).
class HandOver {
 public:
  enum class Wait { kFutex, kYield };
  // client_copies: the client copies the block itself once the server has
  // answered (the shape of a one-sided read by the client: the server only
  // looks the block up).
  // warm: memory the server processes write (their page tables are filled
  // before the first call; a forked process inherits none for a shared mapping).
  HandOver(int servers, int clients, Wait wait, int64_t spin_us, bool client_copies, bool processes, bool sockets,
           std::span<std::byte> warm = {})
      : wait_(wait), spin_(std::chrono::microseconds(spin_us)), client_copies_(client_copies),
        processes_(processes), sockets_(sockets), nservers_(size_t(servers)), nslots_(size_t(clients)) {
    bytes_ = sizeof(Shared) + nservers_ * sizeof(Server) + nslots_ * sizeof(Slot);
    void* m = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    shared_ = new (m) Shared;
    servers_ = new (shared_ + 1) Server[nservers_];
    slots_ = new (servers_ + nservers_) Slot[nslots_];
    if (sockets_) {
      auto pair = [](int* fds) {
        if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, fds) != 0) std::abort();
      };
      for (size_t i = 0; i < nservers_; ++i) pair(servers_[i].fds);
      for (size_t i = 0; i < nslots_; ++i) pair(slots_[i].fds);
    }
    for (size_t sv = 0; sv < nservers_; ++sv) {
      if (!processes_) {
        threads_.emplace_back([this, sv] { Serve(sv); });
        continue;
      }
      const pid_t pid = ::fork();
      if (pid == 0) {
        for (size_t at = 0; at < warm.size(); at += 4096)
          reinterpret_cast<std::atomic<unsigned char>*>(warm.data() + at)->fetch_add(0);
        shared_->ready.fetch_add(1);
        Serve(sv);
        ::_exit(0);
      }
      if (pid < 0) {
        std::perror("bench: fork (hand-over server)");
        std::abort();  // its clients would wait forever
      }
      children_.push_back(pid);
    }
    while (shared_->ready.load() < int(children_.size())) std::this_thread::sleep_for(1ms);
  }
  ~HandOver() {
    shared_->stop.store(true);
    for (size_t sv = 0; sv < nservers_; ++sv) {
      servers_[sv].bell.fetch_add(1);
      Wake(&servers_[sv].bell, servers_[sv].fds);
    }
    for (std::thread& t : threads_) t.join();
    for (pid_t pid : children_) ::waitpid(pid, nullptr, 0);
    for (size_t i = 0; sockets_ && i < nservers_; ++i) ::close(servers_[i].fds[0]), ::close(servers_[i].fds[1]);
    for (size_t i = 0; sockets_ && i < nslots_; ++i) ::close(slots_[i].fds[0]), ::close(slots_[i].fds[1]);
    ::munmap(shared_, bytes_);
  }
  HandOver(const HandOver&) = delete;
  HandOver& operator=(const HandOver&) = delete;
  // The server processes' CPU seconds so far (0 with server threads: they are this process's).
  double ServerCpuSeconds() const {
    double t = 0;
    for (pid_t pid : children_) t += CpuSeconds(pid);
    return t;
  }

  // Client c's GET: its server copies n bytes from src to dst; returns when they are there.
  void Call(int c, const std::byte* src, std::byte* dst, size_t n) {
    Slot& sl = slots_[c];
    sl.src = src, sl.dst = dst, sl.n = n;
    const uint32_t seq = sl.req.load(std::memory_order_relaxed) + 1;
    sl.req.store(seq);
    Server& sv = servers_[size_t(c) % nservers_];
    sv.bell.fetch_add(1);
    if (sv.sleeping.load()) Wake(&sv.bell, sv.fds);
    const auto spin_end = SteadyClock::now() + spin_;
    while (sl.resp.load(std::memory_order_acquire) != seq) {
      if (wait_ == Wait::kYield) {
        ::sched_yield();
      } else if (SteadyClock::now() >= spin_end) {
        sl.waiting.store(true);
        Sleep(&sl.resp, seq - 1, sl.fds);  // returns at once when the answer is in already
        sl.waiting.store(false);
      }
    }
    if (client_copies_) std::memcpy(dst, src, n);
  }

 private:
  struct alignas(64) Shared {
    std::atomic<bool> stop{false};
    std::atomic<int> ready{0};  // server processes that have warmed `warm`
  };
  struct alignas(64) Slot {
    std::atomic<uint32_t> req{0}, resp{0};  // request and answer sequence numbers (futex words)
    std::atomic<bool> waiting{false};       // the client sleeps (or is about to) on resp
    const std::byte* src = nullptr;
    std::byte* dst = nullptr;
    size_t n = 0;
    int fds[2] = {-1, -1};  // sockets: the sleeper polls fds[0], the waker sends on fds[1]
  };
  struct alignas(64) Server {
    std::atomic<uint32_t> bell{0};       // rung by every request (futex word)
    std::atomic<bool> sleeping{false};   // the server sleeps (or is about to) on bell
    int fds[2] = {-1, -1};  // as Slot::fds
  };
  // Sleeps while *w is `expected`: on the futex *w (of a shared mapping
  // between processes, a private one otherwise), or in poll() on fds[0]
  // (sockets), draining what woke it.
  void Sleep(std::atomic<uint32_t>* w, uint32_t expected, const int* fds) const {
    if (!sockets_) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), processes_ ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected,
                nullptr, nullptr, 0);
      return;
    }
    if (w->load() != expected) return;
    pollfd pf{fds[0], POLLIN, 0};
    ::poll(&pf, 1, 100);  // bounded: a wake-up datagram is never lost, but stop is checked too
    char b[16];
    while (::recv(fds[0], b, sizeof(b), 0) > 0) {
    }
  }
  void Wake(std::atomic<uint32_t>* w, const int* fds) const {
    if (sockets_) {
      (void)::send(fds[1], "w", 1, MSG_DONTWAIT);  // a full socket already holds a wake-up
      return;
    }
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), processes_ ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 1, nullptr,
              nullptr, 0);
  }
  // Copies every pending request of server s's clients; true when there was one.
  bool Drain(size_t s, std::vector<uint32_t>& served) {
    bool any = false;
    for (size_t c = s, i = 0; c < nslots_; c += nservers_, ++i) {
      Slot& sl = slots_[c];
      const uint32_t r = sl.req.load(std::memory_order_acquire);
      if (r == served[i]) continue;
      if (!client_copies_) std::memcpy(sl.dst, sl.src, sl.n);
      served[i] = r;
      sl.resp.store(r);
      if (sl.waiting.load()) Wake(&sl.resp, sl.fds);
      any = true;
    }
    return any;
  }
  void Serve(size_t s) {
    Server& sv = servers_[s];
    std::vector<uint32_t> served(nslots_ / nservers_ + 1, 0);
    auto last = SteadyClock::now();
    while (!shared_->stop.load(std::memory_order_relaxed)) {
      if (Drain(s, served)) {
        last = SteadyClock::now();
        continue;
      }
      if (wait_ == Wait::kYield) {
        ::sched_yield();
        continue;
      }
      if (SteadyClock::now() - last < spin_) continue;
      // Sleep until a client rings: the bell is read before the last look,
      // so a request after that look has changed it (or sees `sleeping`).
      const uint32_t b = sv.bell.load();
      sv.sleeping.store(true);
      if (!Drain(s, served) && !shared_->stop.load()) Sleep(&sv.bell, b, sv.fds);
      sv.sleeping.store(false);
      last = SteadyClock::now();
    }
  }

  const Wait wait_;
  const SteadyClock::duration spin_;
  const bool client_copies_, processes_, sockets_;
  const size_t nservers_, nslots_;
  size_t bytes_ = 0;          // the shared mapping: Shared, then the servers, then the slots
  Shared* shared_ = nullptr;
  Server* servers_ = nullptr;
  Slot* slots_ = nullptr;
  std::vector<std::thread> threads_;
  std::vector<pid_t> children_;
};

// The hand-over ceiling's modes: cell name, label, wait, spin (us), who
// copies, servers in processes of their own, wake-ups by datagram.
struct HandOverMode {
  const char* cell;
  const char* label;
  HandOver::Wait wait;
  int64_t spin_us;
  bool client_copies;
  bool processes;
  bool sockets;
};
constexpr HandOverMode kHandOverModes[] = {
    {"ho_futex", "hand-over, futex", HandOver::Wait::kFutex, 0, false, false, false},
    {"ho_proc", "hand-over, futex, server processes", HandOver::Wait::kFutex, 0, false, true, false},
    {"ho_sock", "hand-over, poll + datagram, server processes", HandOver::Wait::kFutex, 0, false, true, true},
    {"ho_spin", "hand-over, 50 us spin + futex", HandOver::Wait::kFutex, 50, false, false, false},
    {"ho_yield", "hand-over, sched_yield", HandOver::Wait::kYield, 0, false, false, false},
    {"ho_client", "hand-over, futex, client copies", HandOver::Wait::kFutex, 0, true, false, false},
};

#if defined(KVMESH_HAVE_UCX)
constexpr bool KVMESH_UCX_ON = true;
#else
constexpr bool KVMESH_UCX_ON = false;
#endif

struct Cell {
  double gbps = 0, ops = 0, p50_us = 0, p99_us = 0;
  // CPU (user + system) per operation of this process (the clients, and the
  // raw server's threads) plus the server process, when one was given: what
  // an operation costs whatever else the cores are doing.
  double cpu_us = 0;
  double server_cpu_us = 0;  // the server process's part of cpu_us (0 without one)
};

Cell Median(std::vector<Cell> v) {
  if (v.empty()) return Cell{};  // a cell that did not run (--backends)
  auto med = [&](auto f) {
    std::vector<double> x;
    for (auto& c : v) x.push_back(f(c));
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  return Cell{med([](const Cell& c) { return c.gbps; }), med([](const Cell& c) { return c.ops; }),
              med([](const Cell& c) { return c.p50_us; }), med([](const Cell& c) { return c.p99_us; }),
              med([](const Cell& c) { return c.cpu_us; }), med([](const Cell& c) { return c.server_cpu_us; })};
}

uint16_t FreePort();

// One result row of --json.
struct Row {
  std::string backend;  // tcp, ucx, redis, raw, ucx_perftest
  std::string op;       // GET, PUT (ucx_perftest: ucp_am_lat / ucp_am_bw; raw: req/ack)
  size_t block_bytes = 0;
  size_t clients = 0;
  size_t batch = 1;     // blocks per call
  Cell c;
};

// A progress line on stderr (the tables and the JSON go to stdout).
template <typename... A>
void Progress(const char* fmt, A... a) {
  std::fprintf(stderr, "bench_transport: ");
  std::fprintf(stderr, fmt, a...);
  std::fprintf(stderr, "\n");
}

// ucp_am_bw's iterations: about 1.3 GB per run (20000 x 64 KiB), at least 2000 (10% warm-up).
std::string BwIterations(size_t size) {
  const size_t n = std::max<size_t>(2000, 20000 * 65536 / std::max<size_t>(size, 1));
  return " -n " + std::to_string(n) + " -w " + std::to_string(n / 10);
}

// ucx_perftest between two processes on this machine (server and client),
// the same UCX_TLS as the node: ucp_am_lat gives the one-way latency (its
// median; gbps = size / latency, what a request/response moving `size` once
// could reach), ucp_am_bw the streaming bandwidth (MB/s as perftest prints:
// 2^20 bytes). An empty cell when ucx_perftest is missing or fails.
Cell Perftest(const std::string& test, size_t size) {
  static const std::string bin = [] {
    for (const char* p : {"/usr/bin/ucx_perftest", "/usr/local/bin/ucx_perftest"})
      if (::access(p, X_OK) == 0) return std::string(p);
    return std::string();
  }();
  if (bin.empty()) return {};
  const uint16_t port = FreePort();
  testing::Process server;
  if (!server.Start({bin, "-p", std::to_string(port)})) return {};
  std::this_thread::sleep_for(300ms);
  const bool lat = test == "ucp_am_lat";
  const std::string cmd = bin + " 127.0.0.1 -p " + std::to_string(port) + " -t " + test + " -s " + std::to_string(size) +
                          (lat ? " -n 4000 -w 400" : BwIterations(size)) + " 2>&1";
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof(buf), f)) out += buf;
    ::pclose(f);
  }
  server.Kill(SIGKILL);
  server.Wait(2s);
  const size_t at = out.rfind("Final:");
  if (at == std::string::npos) return {};
  double iters = 0, p50 = 0, avg = 0, overall = 0, bw_avg = 0, bw_overall = 0;
  if (std::sscanf(out.c_str() + at, "Final: %lf %lf %lf %lf %lf %lf", &iters, &p50, &avg, &overall, &bw_avg,
                  &bw_overall) != 6)
    return {};
  Cell c;
  if (lat) {
    c.p50_us = p50;
    c.p99_us = 0;
    c.gbps = p50 > 0 ? double(size) / p50 / 1e3 : 0;
    c.ops = p50 > 0 ? 1e6 / p50 : 0;
  } else {
    c.gbps = bw_overall * 1048576.0 / 1e9;
    c.ops = c.gbps * 1e9 / double(size);
  }
  return c;
}

// size / the median call latency: the same measure as ucp_am_lat's figure.
double P50Gbps(const Cell& c, size_t size) { return c.p50_us > 0 ? double(size) / c.p50_us / 1e3 : 0; }

// The 1-, 5- and 15-minute load averages (/proc/loadavg), to print beside the
// figures: on a shared machine they say how many threads competed for the cores.
std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(f >> a >> b >> c)) return "unknown";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f", a, b, c);
  return buf;
}

// Runs `clients` threads of op(thread, iteration) for `seconds`; returns throughput and latency.
double CpuSeconds(pid_t pid);
double ThreadCpuSeconds(pid_t tid);

// server: the process serving the operations (0: none, or this one).
// `server_cpu`: the server's CPU seconds so far (its process, or its threads
// in this one: they are part of this process's time and not added again).
Cell RunClients(int clients, double seconds, size_t bytes_per_op, const std::function<bool(int, uint64_t)>& op,
                const std::function<double()>& server_cpu, bool server_in_process) {
  auto cpu = [&] { return CpuSeconds(::getpid()) + (server_in_process ? 0.0 : server_cpu()); };
  const double cpu0 = cpu(), server0 = server_cpu();
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
  const double cpu_s = cpu() - cpu0, server_s = server_cpu() - server0;
  if (failed) std::fprintf(stderr, "bench: an operation failed\n");
  LatencyHistogram all;
  uint64_t n = 0;
  for (int c = 0; c < clients; ++c) {
    all.Merge(hist[c]);
    n += done[c];
  }
  return Cell{double(n) * double(bytes_per_op) / dt / 1e9, double(n) / dt, all.Percentile(0.5) / 1e3,
              all.Percentile(0.99) / 1e3, n > 0 ? cpu_s * 1e6 / double(n) : 0.0,
              n > 0 ? server_s * 1e6 / double(n) : 0.0};
}

Cell RunClients(int clients, double seconds, size_t bytes_per_op, const std::function<bool(int, uint64_t)>& op,
                pid_t server = 0) {
  return RunClients(clients, seconds, bytes_per_op, op, [server] { return server > 0 ? CpuSeconds(server) : 0.0; },
                    false);
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
  // INFO's text (empty on error).
  std::string Info() {
    const std::string req = "*1\r\n$4\r\nINFO\r\n";
    if (!WriteAll(fd_.get(), req.data(), req.size(), SteadyClock::now() + 5s).ok()) return "";
    std::string line;
    char c;
    while (true) {
      if (!ReadFull(fd_.get(), &c, 1, 5000, {}).ok()) return "";
      if (c == '\n') break;
      line += c;
    }
    if (line.size() < 2 || line[0] != '$') return "";
    std::string body(static_cast<size_t>(std::atol(line.c_str() + 1)) + 2, '\0');
    if (!ReadFull(fd_.get(), body.data(), body.size(), 5000, {}).ok()) return "";
    return body;
  }

 private:
  UniqueFd fd_;
  char crlf_[2] = {'\r', '\n'};
};

// A "name:<integer>" field of INFO text (0 when absent).
uint64_t InfoField(const std::string& info, const std::string& name) {
  const size_t at = info.find(name + ":");
  return at == std::string::npos ? 0 : std::strtoull(info.c_str() + at + name.size() + 1, nullptr, 10);
}

// CPU seconds (user + system) a process has used so far (0 when it is gone).
double StatCpuSeconds(const std::string& path) {
  std::ifstream f(path);
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && in >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  return ticks / double(::sysconf(_SC_CLK_TCK));
}
double CpuSeconds(pid_t pid) { return StatCpuSeconds("/proc/" + std::to_string(pid) + "/stat"); }
// One thread of this process.
double ThreadCpuSeconds(pid_t tid) { return StatCpuSeconds("/proc/self/task/" + std::to_string(tid) + "/stat"); }

// CPU seconds of this process's reaped children (redis-benchmark runs).
double ChildCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// One redis-benchmark run (-q): requests per second of each test, by name ("SET", "GET").
// `cluster`: redis-benchmark --cluster (reads CLUSTER NODES, sends each key to its slot's node).
std::map<std::string, double> RedisBenchmark(const std::string& bin, uint16_t port, size_t size, size_t clients,
                                             size_t pipeline, size_t requests, bool cluster = false) {
  testing::Process p;
  std::map<std::string, double> out;
  std::vector<std::string> argv = {bin, "-h", "127.0.0.1", "-p", std::to_string(port), "-t", "set,get", "-d",
                                   std::to_string(size), "-c", std::to_string(clients), "-n", std::to_string(requests),
                                   "-r", "16", "-P", std::to_string(pipeline), "-q"};
  if (cluster) argv.push_back("--cluster");
  if (!p.Start(argv)) return out;
  const auto end = SteadyClock::now() + 120s;
  while (SteadyClock::now() < end) {
    auto line = p.ReadLine(200ms);
    if (!line) {
      if (p.Wait(0ms)) break;
      continue;
    }
    // Progress updates are separated by '\r'; the last piece is the result.
    const std::string last = line->substr(line->rfind('\r') == std::string::npos ? 0 : line->rfind('\r') + 1);
    const size_t colon = last.find(": ");
    if (colon == std::string::npos || last.find("requests per second") == std::string::npos) continue;
    out[last.substr(0, colon)] = std::atof(last.c_str() + colon + 2);
  }
  p.Wait(5s);
  return out;
}

// ---- raw loopback TCP: a sink that acks each message ----------------------------
class RawServer {
 public:
  // `footprint`: how many msg-sized buffers each connection rotates through
  // in the 'A'/'G' modes (the store's working set per client), against one
  // cache-hot buffer in 'a'/'g'.
  RawServer(size_t msg, size_t footprint) : msg_(msg), footprint_(footprint) {
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
          {
            std::lock_guard<std::mutex> lock(mu_);
            tids_.push_back(::gettid());
          }
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          char mode;
          if (::recv(fd, &mode, 1, MSG_WAITALL) != 1) return (void)::close(fd);
          const bool pooled = mode == 'A' || mode == 'G';
          const size_t n = pooled ? footprint_ : 1;
          std::vector<char> mem(msg_ * n, 'r');  // touched: no page faults in the timed loop
          for (size_t i = 0;; i = (i + 1) % n) {
            char* buf = mem.data() + i * msg_;
            if (mode == 'g' || mode == 'G') {  // GET-shaped: a 1-byte request, msg_ bytes back
              char k;
              if (::recv(fd, &k, 1, MSG_WAITALL) != 1) break;
              if (::send(fd, buf, msg_, MSG_NOSIGNAL) != static_cast<ssize_t>(msg_)) break;
              continue;
            }
            if (::recv(fd, buf, msg_, MSG_WAITALL) != static_cast<ssize_t>(msg_)) break;
            if (::send(fd, "k", 1, MSG_NOSIGNAL) != 1) break;
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
  // How many connection threads have started so far.
  size_t started() {
    std::lock_guard<std::mutex> lock(mu_);
    return tids_.size();
  }
  // CPU seconds of the connection threads started after the first `from`.
  double CpuSince(size_t from) {
    std::lock_guard<std::mutex> lock(mu_);
    double s = 0;
    for (size_t i = from; i < tids_.size(); ++i) s += ThreadCpuSeconds(tids_[i]);
    return s;
  }

 private:
  size_t msg_;
  size_t footprint_;
  std::mutex mu_;
  std::vector<pid_t> tids_;  // guarded by mu_
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
int RespTable(const std::string& kvmesh_bin, const std::string& redis_bin, const std::string& rb_bin, double seconds,
              int reps, const std::vector<size_t>& sizes, const std::vector<size_t>& client_counts,
              const std::vector<size_t>& pipelines) {
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
  const std::string cluster_cfg_path = "/tmp/kvmesh-bench-resp-cluster-" + std::to_string(::getpid()) + ".json";
  testing::Process coord, proxy, redis, cluster_coord;
  std::vector<std::unique_ptr<testing::Process>> nodes, cluster_nodes;
  uint16_t cluster_port = 0;
  auto cleanup = [&] {
    proxy.Kill(SIGTERM), proxy.Wait(5s);
    for (auto& n : nodes) n->Kill(SIGTERM), n->Wait(5s);
    for (auto& n : cluster_nodes) n->Kill(SIGTERM), n->Wait(5s);
    coord.Kill(SIGTERM), coord.Wait(5s);
    cluster_coord.Kill(SIGTERM), cluster_coord.Wait(5s);
    redis.Kill(SIGTERM), redis.Wait(5s);
    ::unlink(cfg_path.c_str());
    ::unlink(cluster_cfg_path.c_str());
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
  // The same three targets driven by the stock redis-benchmark (its own
  // event loop, CLIENTS connections, -P requests in flight on each), and a
  // fourth: two more nodes in Redis Cluster mode ($.resp.cluster, their own
  // coordinator) driven by redis-benchmark --cluster, which sends each key to
  // its slot's node (zero hops, as the node-local front, with placement).
  if (::access(rb_bin.c_str(), X_OK) == 0) {
    RedisClient proxy_info;
    if (!proxy_info.Connect(proxy_port)) return cleanup(), 1;
    {
      std::ifstream in(cfg_path);
      nlohmann::json c = nlohmann::json::parse(in);
      c["resp"] = {{"cluster", true}};
      std::ofstream(cluster_cfg_path) << c.dump();
    }
    if (!cluster_coord.Start({kvmesh_bin, "coordinator", "--config", cluster_cfg_path, "--port", "0"}))
      return cleanup(), 1;
    auto cce = cluster_coord.WaitEvent("listening", 10s);
    if (!cce) return cleanup(), 1;
    const std::string cluster_addr = "127.0.0.1:" + std::to_string((*cce)["ports"]["http"].get<uint16_t>());
    for (const char* id : {"r0", "r1"}) {
      cluster_nodes.push_back(std::make_unique<testing::Process>());
      if (!cluster_nodes.back()->Start({kvmesh_bin, "node", "--config", cluster_cfg_path, "--id", id, "--coordinator",
                                        cluster_addr}))
        return cleanup(), 1;
      auto ne = cluster_nodes.back()->WaitEvent("listening", 10s);
      if (!ne) return cleanup(), 1;
      if (cluster_port == 0) cluster_port = (*ne)["ports"]["resp"].get<uint16_t>();
    }
    // Both nodes serve their slots once each has fetched the map with both (heartbeat 200 ms).
    for (const auto end = SteadyClock::now() + 10s; SteadyClock::now() < end;) {
      RedisClient c;
      if (c.Connect(cluster_port) && c.Info().find("cluster_enabled:1") != std::string::npos) {
        std::this_thread::sleep_for(800ms);
        break;
      }
      std::this_thread::sleep_for(100ms);
    }
    const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    std::printf("\n# RESP with redis-benchmark (-t set,get -r 16 -q; N = %.0f x 30000 x pipeline requests per run) — "
                "%d reps, medians; proxy frames/op = node frames the proxy sent per request; CPU us/req = CPU time "
                "(user + system, /proc) per request of the server side (redis-server; the node; the proxy, then both "
                "nodes; the two cluster-mode nodes) and of redis-benchmark itself, SET and GET together; cores busy = "
                "that CPU over the run's wall time (of %d cores); proxy CPU ceiling = the ops/s the proxy path's CPU "
                "per request allows on %d cores, over redis's ops/s\n",
                seconds, reps, cores, cores);
    std::printf("| op | value | clients | pipeline | redis ops/s | node-local ops/s | proxy ops/s | cluster ops/s | "
                "proxy/redis | cluster/redis | node-local/redis | proxy frames/op | CPU us/req redis + client | "
                "node-local + client | proxy + nodes + client | cluster nodes + client | cores busy redis / proxy | "
                "proxy CPU ceiling |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    auto pids_of = [&](const std::string& name) -> std::vector<pid_t> {
      if (name == "redis") return {redis.pid()};
      if (name == "local") return {nodes[0]->pid()};
      if (name == "cluster") {
        std::vector<pid_t> v;
        for (auto& n : cluster_nodes) v.push_back(n->pid());
        return v;
      }
      std::vector<pid_t> v{proxy.pid()};
      for (auto& n : nodes) v.push_back(n->pid());
      return v;
    };
    for (size_t size : sizes)
      for (size_t clients : client_counts)
        for (size_t pipe : pipelines) {
          const size_t n = static_cast<size_t>(seconds * 30000 * double(pipe));
          std::map<std::string, std::vector<double>> ops;  // "<target>_<OP>"
          std::vector<double> frames_per_op;
          std::map<std::string, std::vector<double>> server_cpu, client_cpu;  // us per request, by target
          std::vector<double> proxy_cpu;  // us per request of the proxy process alone
          std::map<std::string, std::vector<double>> busy;  // cores busy (server + client CPU / wall), by target
          struct Bench {
            std::string name;
            uint16_t port;
            bool cluster;
          };
          std::vector<Bench> benches;
          for (auto& t : targets)
            if (!t.c.empty()) benches.push_back({t.name, t.port, false});
          benches.push_back({"cluster", cluster_port, true});
          for (int r = 0; r < reps; ++r)
            for (const Bench& t : benches) {
              const std::string& name = t.name;
              const uint64_t f0 = name == "proxy" ? InfoField(proxy_info.Info(), "frames_sent") : 0;
              const std::vector<pid_t> pids = pids_of(name);  // the proxy's: the proxy first
              std::vector<double> cpu0;
              for (pid_t p : pids) cpu0.push_back(CpuSeconds(p));
              const double c0 = ChildCpuSeconds();
              const auto w0 = SteadyClock::now();
              auto res = RedisBenchmark(rb_bin, t.port, size, clients, pipe, n, t.cluster);
              const double wall = std::chrono::duration<double>(SteadyClock::now() - w0).count();
              const double c1 = ChildCpuSeconds();
              double server = 0;  // CPU seconds of the server side's processes in this run
              for (size_t i = 0; i < pids.size(); ++i) {
                const double used = CpuSeconds(pids[i]) - cpu0[i];
                if (name == "proxy" && i == 0) proxy_cpu.push_back(used * 1e6 / double(2 * n));
                server += used;
              }
              for (auto& [op, v] : res) ops[name + "_" + op].push_back(v);
              server_cpu[name].push_back(server * 1e6 / double(2 * n));
              client_cpu[name].push_back((c1 - c0) * 1e6 / double(2 * n));
              busy[name].push_back(wall > 0 ? (server + c1 - c0) / wall : 0.0);
              if (name == "proxy")
                frames_per_op.push_back(double(InfoField(proxy_info.Info(), "frames_sent") - f0) / double(2 * n));
            }
          auto med = [](std::vector<double> v) {
            if (v.empty()) return 0.0;
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
          };
          for (const char* op : {"SET", "GET"}) {
            const double rd = med(ops[std::string("redis_") + op]), lo = med(ops[std::string("local_") + op]),
                         px = med(ops[std::string("proxy_") + op]), cl = med(ops[std::string("cluster_") + op]);
            auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
            // The proxy's CPU ceiling: the requests per second its path (proxy, nodes and
            // redis-benchmark) could serve if it had every core of this machine, over redis's.
            const double px_us = med(server_cpu["proxy"]) + med(client_cpu["proxy"]);
            const double ceiling = px_us > 0 ? ratio(double(cores) * 1e6 / px_us, rd) : 0.0;
            std::printf("| %s | %s | %zu | %zu | %.0f | %.0f | %.0f | %.0f | %.2fx | %.2fx | %.2fx | %.2f | %.1f + %.1f | "
                        "%.1f + %.1f | %.1f + %.1f + %.1f | %.1f + %.1f | %.2f / %.2f | %.2fx |\n",
                        op, SizeName(size).c_str(), clients, pipe, rd, lo, px, cl, ratio(px, rd), ratio(cl, rd),
                        ratio(lo, rd), med(frames_per_op), med(server_cpu["redis"]), med(client_cpu["redis"]),
                        med(server_cpu["local"]), med(client_cpu["local"]), med(proxy_cpu),
                        med(server_cpu["proxy"]) - med(proxy_cpu), med(client_cpu["proxy"]), med(server_cpu["cluster"]),
                        med(client_cpu["cluster"]),
                        med(busy["redis"]), med(busy["proxy"]), ceiling);
            std::fflush(stdout);
          }
        }
  }
  cleanup();
  return 0;
}

}  // namespace

// The issue-36 targets for one block size, from this run's medians: UCX GET
// with the most clients against one client, against ucp_am_bw of the size,
// and its p99 against its p50; TCP GET against raw loopback of the same shape
// and against the raw server over the same footprint. The copy+verify
// ceiling's own many/one ratio says how much scaling the cores and memory
// leave at that footprint.
void PrintTargets(size_t size, const std::vector<size_t>& client_counts,
                  std::map<size_t, std::map<std::string, Cell>>& med, const Cell& am_bw,
                  const std::map<size_t, double>& local_share) {
  const size_t many = *std::max_element(client_counts.begin(), client_counts.end());
  if (many < 2) return;
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  const Cell u1 = med[1]["ux_get"], un = med[many]["ux_get"], cv1 = med[1]["copy_verify"], cvn = med[many]["copy_verify"];
  const Cell tn = med[many]["kv_get"], rn = med[many]["raw_get"], rfn = med[many]["raw_get_fp"];
  std::printf("\n# targets, GET %s, %zu clients (load average %s)\n", SizeName(size).c_str(), many, LoadAverage().c_str());
  std::printf("| target | ratio | figures |\n|---|---|---|\n");
  if (un.ops > 0) {
    if (u1.ops > 0)
      std::printf("| UCX %zu clients / 1 client (>= 1.5x) | %.2fx | %.2f / %.2f GB/s; copy+verify ceiling %zu / 1: "
                  "%.2fx (%.2f / %.2f GB/s) |\n",
                  many, ratio(un.gbps, u1.gbps), un.gbps, u1.gbps, many, ratio(cvn.gbps, cv1.gbps), cvn.gbps, cv1.gbps);
    std::printf("| UCX %zu clients / ucp_am_bw (>= 0.5x) | %.2fx | %.2f / %.2f GB/s |\n", many, ratio(un.gbps, am_bw.gbps),
                un.gbps, am_bw.gbps);
    std::printf("| UCX %zu clients p99 / p50 (<= 4x) | %.2fx | %.0f / %.0f us; copy+verify ceiling %.2fx (%.0f / %.0f us) |\n",
                many, ratio(un.p99_us, un.p50_us), un.p99_us, un.p50_us, ratio(cvn.p99_us, cvn.p50_us), cvn.p99_us,
                cvn.p50_us);
    std::printf("| UCX %zu clients: CPU per GET | %.0f us | 1 client %.0f us; copy+verify %.0f / %.0f us |\n", many,
                un.cpu_us, u1.cpu_us, cvn.cpu_us, cv1.cpu_us);
    auto share = [&](size_t n) { auto it = local_share.find(n); return it == local_share.end() ? 0.0 : it->second; };
    std::printf("| UCX GETs served by local reads | %.0f%% | %zu clients; 1 client %.0f%% |\n", 100 * share(many), many,
                100 * share(1));
  }
  // The same GETs as messages (channels without local reads): the path every GET took before.
  const Cell m1 = med[1]["ux_get_msg"], mn = med[many]["ux_get_msg"];
  if (mn.ops > 0 && m1.ops > 0) {
    std::printf("| UCX messages %zu clients / 1 client | %.2fx | %.2f / %.2f GB/s; p99 / p50 %.1fx (%.0f / %.0f us); "
                "CPU per GET %.0f / %.0f us |\n",
                many, ratio(mn.gbps, m1.gbps), mn.gbps, m1.gbps, ratio(mn.p99_us, mn.p50_us), mn.p99_us, mn.p50_us,
                mn.cpu_us, m1.cpu_us);
    if (un.ops > 0)
      std::printf("| UCX %zu clients: local reads / messages | %.2fx | %.2f / %.2f GB/s; 1 client %.2fx |\n", many,
                  ratio(un.gbps, mn.gbps), un.gbps, mn.gbps, ratio(u1.gbps, m1.gbps));
  }
  // The hand-over ceilings: the GET's work and the cheapest hand-overs (HandOver).
  for (const HandOverMode& m : kHandOverModes) {
    const Cell h1 = med[1][m.cell], hn = med[many][m.cell];
    if (hn.ops <= 0 || h1.ops <= 0) continue;
    std::printf("| ceiling: %s, %zu / 1 | %.2fx | %.2f / %.2f GB/s; p99 / p50 %.1fx (%.0f / %.0f us); CPU per GET "
                "%.0f / %.0f us; %zu clients / UCX 1 client %.2fx |\n",
                m.label, many, ratio(hn.gbps, h1.gbps), hn.gbps, h1.gbps, ratio(hn.p99_us, hn.p50_us), hn.p99_us,
                hn.p50_us, hn.cpu_us, h1.cpu_us, many, ratio(hn.gbps, u1.gbps));
  }
  if (tn.ops > 0) {
    std::printf("| TCP %zu clients / raw same shape (>= 0.8x) | %.2fx | %.2f / %.2f GB/s |\n", many,
                ratio(tn.gbps, rn.gbps), tn.gbps, rn.gbps);
    std::printf("| TCP %zu clients / raw same footprint (>= 0.95x) | %.2fx | %.2f / %.2f GB/s |\n", many,
                ratio(tn.gbps, rfn.gbps), tn.gbps, rfn.gbps);
  }
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  double seconds = 1.0;
  int reps = 3;
  std::string sizes_arg = "65536,262144,1048576", clients_arg = "1,8";
  std::string kvmesh_bin = KVMESH_BIN, redis_bin = KVMESH_REDIS_SERVER;
  std::string tables = "transport,resp", resp_sizes_arg = "16384", resp_clients_arg = "1,8", resp_pipeline_arg = "1,16";
  std::string rb_bin = "/usr/bin/redis-benchmark";
  std::string ucx_progress = "adaptive";  // the config's default
  int ucx_workers = 0;                   // the node's $.transport.ucx.workers (0: its default)
  int io_threads = 2;                    // the node's $.transport.io_threads
  size_t keys_arg = 16;                  // blocks per client (the footprint: cache-hot when small)
  std::string ucx_memory = "allocated";  // the clients' registered memory: UcxContext::Allocate, or malloc
  std::string backends = "tcp,ucx,redis,raw,batch";  // which cells run (a profile of one path)
  std::string ops_arg = "GET,PUT";  // which operations of those cells run
  std::string local_reads = "on";   // the UCX clients' local reads (the node offers them either way)
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_transport [--seconds S] [--reps R] [--sizes B,...] [--clients N,...] [--backends tcp,ucx,redis,raw,batch]\n"
          "                       [--ops GET,PUT] [--tables transport,resp] [--resp-sizes B,...] [--resp-clients N,...]\n"
          "                       [--resp-pipeline D,...] [--ucx-progress P] [--ucx-memory allocated|malloc|unregistered] [--ucx-workers N] [--io-threads N]\n"
          "                       [--keys K]   (blocks per client, default 16: the footprint each client reads)\n"
          "                       [--ucx-local-reads on|off]   (UCX GETs read the node's pool on this host; on: a\n"
          "                        second set of channels without them runs the same GETs as messages, in the same run;\n"
          "                        off: the node keeps a private pool and offers none, as before)\n"
          "                       [--kvmesh BIN] [--redis-server BIN] [--redis-benchmark BIN] [--json]\n"
          "Moves blocks through real kvmesh daemons (TCP and UCX) and redis-server, beside raw loopback TCP and\n"
          "ucx_perftest in the same run; prints medians and same-run ratios per cell.\n");
      return 0;
    }
    if (a == "--json") json = true;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--json") {
      --i;
      continue;
    }
    if (k == "--seconds") seconds = std::stod(v);
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--sizes") sizes_arg = v;
    else if (k == "--clients") clients_arg = v;
    else if (k == "--kvmesh") kvmesh_bin = v;
    else if (k == "--redis-server") redis_bin = v;
    else if (k == "--tables") tables = v;
    else if (k == "--resp-sizes") resp_sizes_arg = v;
    else if (k == "--resp-clients") resp_clients_arg = v;
    else if (k == "--ucx-progress") ucx_progress = v;
    else if (k == "--ucx-memory") ucx_memory = v;
    else if (k == "--ucx-workers") ucx_workers = std::stoi(v);
    else if (k == "--io-threads") io_threads = std::stoi(v);
    else if (k == "--keys") keys_arg = std::max(1, std::stoi(v));
    else if (k == "--backends") backends = "," + v + ",";
    else if (k == "--ops") ops_arg = v;
    else if (k == "--ucx-local-reads") local_reads = v;
    else if (k == "--resp-pipeline") resp_pipeline_arg = v;
    else if (k == "--redis-benchmark") rb_bin = v;
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
  if (json && want_resp && want_transport) tables = "transport";  // --json: the transport rows
  if (!want_transport) {
    if (!want_resp) return 0;
    return RespTable(kvmesh_bin, redis_bin, rb_bin, seconds, reps, ParseList(resp_sizes_arg), ParseList(resp_clients_arg),
                     ParseList(resp_pipeline_arg));
  }
  const size_t max_clients = *std::max_element(client_counts.begin(), client_counts.end());
  const size_t keys_per_client = keys_arg;
  constexpr size_t kBatch = 64, kBatchBlock = 65536;  // the batch rows: one GetInto of 64 x 64 KiB

  // The kvmesh node: one standalone daemon with room for every key of the
  // run, with the UCX backend when built. With local reads on, its pool is
  // shared memory (a memfd, no huge pages where shmem's are off), which a TCP
  // cluster's nodes never have: the TCP cells then run against a second node
  // of the TCP backend, as a TCP cluster would.
  const std::string cfg_path = "/tmp/kvmesh-bench-" + std::to_string(::getpid()) + ".json";
  const std::string tcp_cfg_path = "/tmp/kvmesh-bench-tcp-" + std::to_string(::getpid()) + ".json";
  auto write_config = [&](const std::string& path, const char* backend) {
    std::ofstream f(path);
    f << R"({"model": {"model_id": "bench", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64, "block_tokens": 16},
            "nodes": [{"id": "b0", "memory": {"host": ")"
      << (sizes.size() * max_clients * keys_per_client + kBatch * kBatchBlock / (1 << 20) + 160) << R"(MiB"}}],
            "store": {"slot_bytes": "1MiB", "stripes": 8},
            "transport": {"io_threads": )" << io_threads << R"(, "backend": ")" << backend
      << R"(", "ucx": {"progress": ")" << ucx_progress << R"(", "workers": )" << ucx_workers
      << R"(, "local_reads": )" << (local_reads == "off" ? "false" : "true") << R"(}}})";
  };
  write_config(cfg_path, KVMESH_UCX_ON ? "ucx" : "tcp");
  testing::Process node, tcp_node_own;
  if (!node.Start({kvmesh_bin, "node", "--config", cfg_path, "--id", "b0", "--no-resp"})) return 1;
  auto ev = node.WaitEvent("listening", 10s);
  if (!ev) {
    std::fprintf(stderr, "bench: kvmesh node did not start\n");
    return 1;
  }
  testing::Process* tcp_node = &node;  // the node the TCP cells run against
  uint16_t data_port = (*ev)["ports"]["data"].get<uint16_t>();
  if (KVMESH_UCX_ON && local_reads == "on") {
    write_config(tcp_cfg_path, "tcp");
    if (!tcp_node_own.Start({kvmesh_bin, "node", "--config", tcp_cfg_path, "--id", "b0", "--no-resp"})) return 1;
    auto tev = tcp_node_own.WaitEvent("listening", 10s);
    if (!tev) {
      std::fprintf(stderr, "bench: the TCP backend's kvmesh node did not start\n");
      return 1;
    }
    tcp_node = &tcp_node_own;
    data_port = (*tev)["ports"]["data"].get<uint16_t>();
  }

  // Each client's buffers: its payload and a destination per key, one block
  // each, in one allocation per client (what an engine registers: its KV pool).
  const size_t slot = std::max<size_t>(*std::max_element(sizes.begin(), sizes.end()), kBatchBlock);
  const size_t per_client = (1 + std::max(keys_per_client, kBatch)) * slot;
  // Over UCX by default the memory an engine gets from Router::AllocateMemory
  // (UcxContext::Allocate: a shared-memory segment the node maps);
  // --ucx-memory malloc registers plain heap memory instead; unregistered
  // registers nothing (two-sided transfers).
#if defined(KVMESH_HAVE_UCX)
  auto ctx = UcxContext::Create(/*mt_workers=*/true);
#endif
  std::vector<std::shared_ptr<std::byte>> pool(max_clients);
  for (auto& p : pool) {
#if defined(KVMESH_HAVE_UCX)
    if (ucx_memory == "allocated" && ctx.ok()) {
      auto m = (*ctx)->Allocate(per_client);
      if (m.ok()) {
        std::byte* base = (*m)->base();
        p = std::shared_ptr<std::byte>(std::move(*m), base);
      }
    }
#endif
    if (!p) p = std::shared_ptr<std::byte>(new std::byte[per_client], std::default_delete<std::byte[]>());
    std::memset(p.get(), 0, per_client);
  }
  auto src_of = [&](size_t c, size_t size) { return std::span<const std::byte>(pool[c].get(), size); };
  auto dst_of = [&](size_t c, size_t k, size_t size) { return std::span<std::byte>(pool[c].get() + (1 + k) * slot, size); };

  std::vector<std::unique_ptr<ShardChannel>> ux;  // UCX channels, one per client (empty without UCX)
  // The same without local reads (--ucx-local-reads on): GETs as messages.
  std::vector<std::unique_ptr<ShardChannel>> uxm;
  std::function<uint64_t()> local_hits = [] { return uint64_t{0}; };  // GET items ux read locally so far
#if defined(KVMESH_HAVE_UCX)
  for (int set = 0; set < (local_reads == "on" ? 2 : 1); ++set) {
    auto& chans = set == 0 ? ux : uxm;
    auto addr = HexDecode(ev->value("ucx_address", ""));
    for (size_t c = 0; addr.ok() && !addr->empty() && ctx.ok() && c < max_clients; ++c) {
      UcxChannelOptions uo;
      uo.local_reads = set == 0 && local_reads == "on";
      uo.node_address = *addr;
      uo.timeout_ms = 10000;
      uo.limits.max_body_bytes = 64 << 20;
      uo.context = *ctx;
      uo.progress = ParseUcxProgress(ucx_progress).value_or(UcxProgress::kAdaptive);
      auto u = UcxChannel::Connect(uo);
      // --ucx-memory unregistered: heap memory never registered, so every
      // GET and PUT is two-sided (active messages, the answer received by
      // the client), as for an engine that registers nothing.
      Status reg = !u.ok() ? u.status()
                   : ucx_memory == "unregistered"
                       ? Status::Ok()
                       : (*u)->RegisterMemory(MemoryRegion{c + 1, pool[c].get(), per_client, MemoryKind::kHost});
      if (!reg.ok()) {
        std::fprintf(stderr, "bench: UCX channel: %s\n", reg.ToString().c_str());
        chans.clear();
        break;
      }
      if (set == 0 && local_reads == "on" && c == 0 && !(*u)->local_reads_status().ok())
        std::fprintf(stderr, "bench: no local reads: %s\n", (*u)->local_reads_status().ToString().c_str());
      chans.push_back(std::move(*u));
    }
  }
  local_hits = [&ux] {
    uint64_t n = 0;
    for (auto& c : ux) n += static_cast<UcxChannel*>(c.get())->answer_counts().local_hits;
    return n;
  };
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

  std::vector<Row> rows;
  auto add = [&](const char* backend, const char* op, size_t bytes, size_t clients, size_t batch, const Cell& c) {
    if (c.ops > 0) rows.push_back(Row{backend, op, bytes, clients, batch, c});
  };
  const char* tls = std::getenv("UCX_TLS");
  if (!json)
    std::printf("# kvmesh TCP and UCX vs ucx_perftest, redis-server and raw loopback TCP — %d reps x %.1f s per cell, "
                "medians (UCX_TLS=%s, progress %s; UCX: %s; load average %s on %ld cores)\n",
                reps, seconds, tls ? tls : "default", ucx_progress.c_str(),
                ucx_memory == "unregistered" ? "two-sided, unregistered heap memory"
                                             : ("one-sided, into " + ucx_memory + " registered memory").c_str(),
                LoadAverage().c_str(), ::sysconf(_SC_NPROCESSORS_ONLN));
  if (!json) {
    // UCX/am_lat compares medians: ucp_am_lat's figure is size / its median
    // one-way latency, kvmesh's "p50 GB/s" is size / the median of whole calls
    // (request, transfer, answer). GB/s columns are throughput (bytes / time).
    std::printf("| op | block | clients | kvmesh TCP GB/s | TCP p50/p99 us | kvmesh UCX GB/s | UCX p50/p99 us | "
                "UCX p50 GB/s | ucp_am_lat GB/s (one-way us) | redis GB/s | raw req/ack GB/s | UCX/am_lat (p50) | "
                "UCX/TCP | TCP/raw | TCP/redis | raw same-shape GB/s | TCP/raw same-shape | raw same footprint GB/s | "
                "TCP/raw footprint | CPU us/op TCP / UCX / redis / raw / raw footprint | ucp_am_bw GB/s | UCX/am_bw | "
                "copy+verify GB/s | UCX/copy+verify |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (size_t size : sizes) {
    // The same random bytes as every other table, in each client's registered payload.
    const std::vector<std::vector<std::byte>> payload = Payloads(max_clients, size);
    for (size_t c = 0; c < max_clients; ++c) std::memcpy(pool[c].get(), payload[c].data(), size);
    auto key = [&](int c, uint64_t i) {
      uint64_t x = (uint64_t(c) << 32 | (i % keys_per_client)) * 0x9E3779B97F4A7C15ull + size;
      return BlockKey{x ^ (x >> 29), uint64_t(c) << 32 | (i % keys_per_client)};
    };
    std::vector<std::vector<std::byte>> rdst(max_clients, std::vector<std::byte>(size + 2));
    // Every key exists before any timed GET (the timed PUT phase may not reach them all).
    for (size_t c = 0; c < max_clients; ++c) {
      for (size_t k = 0; k < keys_per_client; ++k) {
        PutItem it{key(int(c), k), src_of(c, size), {}};
        if (!ch[c]->Put(std::span<PutItem>(&it, 1), {}).ok() || !it.status.ok()) return 1;
        if (tcp_node != &node && !ux.empty() && (!ux[c]->Put(std::span<PutItem>(&it, 1), {}).ok() || !it.status.ok()))
          return 1;
        if (have_redis && !rc[c].Set("k" + std::to_string(c) + ":" + std::to_string(k) + ":" + std::to_string(size), payload[c]))
          return 1;
      }
    }
    // What one UCX message of this size costs between two processes here (same UCX_TLS).
    std::vector<Cell> lat_cells;
    for (int r = 0; r < reps; ++r) lat_cells.push_back(Perftest("ucp_am_lat", size));
    const Cell am_lat = Median(lat_cells);
    add("ucx_perftest", "ucp_am_lat", size, 1, 1, am_lat);
    // ucp_am_bw of this size (streaming, one sender), the bandwidth the many-client GETs are held to.
    const bool want_ucx = ("," + backends + ",").find(",ucx,") != std::string::npos;
    std::vector<Cell> bw_cells;
    for (int r = 0; want_ucx && r < reps; ++r) bw_cells.push_back(Perftest("ucp_am_bw", size));
    const Cell am_bw = Median(bw_cells);
    add("ucx_perftest", "ucp_am_bw", size, 1, 1, am_bw);
    // The copy+verify ceiling's sources: as many blocks per client as the node holds for it.
    // (each client's payload: the destinations then hold what the GETs are checked against).
    std::vector<std::byte> cv_src(max_clients * keys_per_client * size);
    for (size_t c = 0; c < max_clients; ++c)
      for (size_t k = 0; k < keys_per_client; ++k)
        std::memcpy(cv_src.data() + (c * keys_per_client + k) * size, payload[c].data(), size);
    // The destinations of the hand-over ceiling with server processes: a
    // shared mapping of the GETs' footprint.
    const size_t ho_bytes = max_clients * keys_per_client * size;
    void* ho_map = ::mmap(nullptr, ho_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ho_map == MAP_FAILED) return 1;
    std::byte* const ho_dst = static_cast<std::byte*>(ho_map);
    std::memset(ho_dst, 0, ho_bytes);
    std::vector<uint64_t> expect(max_clients);  // the hand-over ceiling's check: each client's block
    for (size_t c = 0; c < max_clients; ++c) expect[c] = Checksum64(payload[c].data(), size);
    std::map<size_t, std::map<std::string, Cell>> med;  // by client count: the medians the targets compare
    std::map<size_t, double> local_share;  // by client count: UCX GETs local reads served (the last rep)
    RawServer raw(size, keys_per_client);
    // The raw GETs' destinations over the store's footprint (as many blocks per client as dst_of has).
    std::vector<std::byte> raw_fp_dst(max_clients * keys_per_client * size, std::byte{1});
    for (size_t clients : client_counts) {
      std::map<std::string, std::vector<Cell>> cells;
      for (int r = 0; r < reps; ++r) {
        Progress("%s, %zu clients, rep %d/%d", SizeName(size).c_str(), clients, r + 1, reps);
        auto want = [&](const char* b) { return ("," + backends + ",").find("," + std::string(b) + ",") != std::string::npos; };
        const bool get = ("," + ops_arg + ",").find(",GET,") != std::string::npos;
        const bool put = ("," + ops_arg + ",").find(",PUT,") != std::string::npos;
        if (want("tcp") && put) cells["kv_put"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
          PutItem it{key(c, i), src_of(c, size), {}};
          Status s = ch[c]->Put(std::span<PutItem>(&it, 1), {});
          return s.ok() && it.status.ok();
        }, tcp_node->pid()));
        if (want("tcp") && get) cells["kv_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
          GetItem it{key(c, i), dst_of(c, i % keys_per_client, size), 0, {}};
          Status s = ch[c]->Get(std::span<GetItem>(&it, 1), {});
          return s.ok() && it.status.ok() && it.size == size;
        }, tcp_node->pid()));
        if (!ux.empty() && want("ucx")) {
          if (put) cells["ux_put"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            PutItem it{key(c, i), src_of(c, size), {}};
            return ux[c]->Put(std::span<PutItem>(&it, 1), {}).ok() && it.status.ok();
          }, node.pid()));
          if (get) {
            const uint64_t hits0 = local_hits();
            cells["ux_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
              GetItem it{key(c, i), dst_of(c, i % keys_per_client, size), 0, {}};
              return ux[c]->Get(std::span<GetItem>(&it, 1), {}).ok() && it.status.ok() && it.size == size;
            }, node.pid()));
            // What share of those GETs local reads served (the rest went to the node).
            const Cell& last = cells["ux_get"].back();
            if (last.ops > 0) local_share[clients] = std::min(1.0, double(local_hits() - hits0) / (last.ops * seconds));
          }
          if (get && !uxm.empty())
            cells["ux_get_msg"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
              GetItem it{key(c, i), dst_of(c, i % keys_per_client, size), 0, {}};
              return uxm[c]->Get(std::span<GetItem>(&it, 1), {}).ok() && it.status.ok() && it.size == size;
            }, node.pid()));
          // The least a one-sided GET of this footprint costs with no transport at all: each
          // client thread copies a block from its share of a pool-sized source (the node's
          // copy) into the same destination the GET uses and hashes it there (the client's
          // check). What the cores and memory allow this many clients, in this run.
          if (get) {
            std::atomic<uint64_t> sink{0};
            cells["copy_verify"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
              const size_t k = i % keys_per_client;
              auto d = dst_of(c, k, size);
              std::memcpy(d.data(), cv_src.data() + (c * keys_per_client + k) * size, size);
              sink.fetch_add(Checksum64(d.data(), size), std::memory_order_relaxed);
              return true;
            }));
            // The same work handed over to the node workers' count of server
            // threads and back (HandOver): what the cheapest waits allow.
            const int servers = ucx_workers > 0 ? ucx_workers
                                                : int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4));
            for (const HandOverMode& m : kHandOverModes) {
              HandOver ho(servers, int(clients), m.wait, m.spin_us, m.client_copies, m.processes, m.sockets,
                          m.processes ? std::span<std::byte>(ho_dst, ho_bytes) : std::span<std::byte>());
              cells[m.cell].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
                const size_t k = i % keys_per_client;
                // Server processes write where they and this process share the memory.
                auto d = m.processes ? std::span<std::byte>(ho_dst + (c * keys_per_client + k) * size, size)
                                     : dst_of(c, k, size);
                std::memset(d.data(), 0, 64);  // the check below then fails unless this call copied
                ho.Call(c, cv_src.data() + (c * keys_per_client + k) * size, d.data(), size);
                return Checksum64(d.data(), size) == expect[c];
              }, [&] { return ho.ServerCpuSeconds(); }, /*server_in_process=*/!m.processes));
            }
          }
        }
        if (have_redis && want("redis")) {
          if (put) cells["rd_put"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            return rc[c].Set("k" + std::to_string(c) + ":" + std::to_string(i % keys_per_client) + ":" + std::to_string(size), payload[c]);
          }, redis.pid()));
          if (get) cells["rd_get"].push_back(RunClients(int(clients), seconds, size, [&](int c, uint64_t i) {
            return rc[c].Get("k" + std::to_string(c) + ":" + std::to_string(i % keys_per_client) + ":" + std::to_string(size), &rdst[c]);
          }, redis.pid()));
        }
        if (!want("raw")) continue;
        // Opens one raw connection of MODE per client, runs the cell, closes them.
        auto raw_cell = [&](char mode, const char* name, auto&& op) {
          std::vector<int> fds;
          const size_t first = raw.started();
          for (size_t c = 0; c < clients; ++c) fds.push_back(RawClient(raw.port(), mode));
          while (raw.started() < first + clients) std::this_thread::sleep_for(1ms);
          cells[name].push_back(RunClients(
              int(clients), seconds, size, [&](int c, uint64_t i) { return op(fds[c], c, i); },
              [&] { return raw.CpuSince(first); }, /*server_in_process=*/true));
          for (int fd : fds) ::close(fd);
        };
        if (put) raw_cell('a', "raw_req", [&](int fd, int c, uint64_t) {
          char k;
          return ::send(fd, payload[c].data(), size, MSG_NOSIGNAL) == ssize_t(size) && ::recv(fd, &k, 1, MSG_WAITALL) == 1;
        });
        if (get) raw_cell('g', "raw_get", [&](int fd, int c, uint64_t) {
          return ::send(fd, "g", 1, MSG_NOSIGNAL) == 1 && ::recv(fd, rdst[c].data(), size, MSG_WAITALL) == ssize_t(size);
        });
        // The same two shapes over the store's footprint: the server rotates
        // through keys_per_client buffers per connection (as the node holds
        // keys_per_client blocks per client) and GETs land in as many
        // destinations per client as kvmesh's, so neither end is cache-hot.
        if (put) raw_cell('A', "raw_req_fp", [&](int fd, int c, uint64_t) {
          char k;
          return ::send(fd, src_of(c, size).data(), size, MSG_NOSIGNAL) == ssize_t(size) &&
                 ::recv(fd, &k, 1, MSG_WAITALL) == 1;
        });
        if (get) raw_cell('G', "raw_get_fp", [&](int fd, int c, uint64_t i) {
          std::byte* d = raw_fp_dst.data() + (c * keys_per_client + i % keys_per_client) * size;
          return ::send(fd, "g", 1, MSG_NOSIGNAL) == 1 && ::recv(fd, d, size, MSG_WAITALL) == ssize_t(size);
        });
      }
      // Every GET compared against what was put (after timing: the check is not timed).
      for (size_t c = 0; c < clients; ++c)
        for (size_t k = 0; k < keys_per_client; ++k) {
          auto d = dst_of(c, k, size);
          if (std::memcmp(d.data(), payload[c].data(), size) != 0 && d[0] != std::byte{0}) {
            std::fprintf(stderr, "bench: client %zu key %zu read back different bytes\n", c, k);
            return 1;
          }
        }
      const Cell raw_req = Median(cells["raw_req"]);
      add("raw", "req/ack", size, clients, 1, raw_req);
      const Cell raw_get = Median(cells["raw_get"]);
      add("raw", "get", size, clients, 1, raw_get);
      const Cell raw_req_fp = Median(cells["raw_req_fp"]);
      add("raw", "req/ack-footprint", size, clients, 1, raw_req_fp);
      const Cell raw_get_fp = Median(cells["raw_get_fp"]);
      add("raw", "get-footprint", size, clients, 1, raw_get_fp);
      const Cell copy_verify = Median(cells["copy_verify"]);
      add("copy+verify", "GET", size, clients, 1, copy_verify);
      for (const HandOverMode& m : kHandOverModes) add(m.label, "GET", size, clients, 1, Median(cells[m.cell]));
      add("ucx messages", "GET", size, clients, 1, Median(cells["ux_get_msg"]));
      for (const char* name : {"ux_get", "ux_get_msg", "kv_get", "raw_get", "raw_get_fp", "copy_verify"})
        med[clients][name] = Median(cells[name]);
      for (const HandOverMode& m : kHandOverModes) med[clients][m.cell] = Median(cells[m.cell]);
      for (const char* op : {"put", "get"}) {
        const std::string OP = std::string(op) == "put" ? "PUT" : "GET";
        const Cell kv = Median(cells[std::string("kv_") + op]);
        const Cell rd = have_redis ? Median(cells[std::string("rd_") + op]) : Cell{};
        const Cell uc = ux.empty() ? Cell{} : Median(cells[std::string("ux_") + op]);
        add("tcp", OP.c_str(), size, clients, 1, kv);
        add("ucx", OP.c_str(), size, clients, 1, uc);
        add("redis", OP.c_str(), size, clients, 1, rd);
        auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
        if (!json) {
          // The raw baseline of the same shape: req/ack for PUT, a 1-byte request and the block back for GET.
          const Cell& raw_same = OP == "GET" ? raw_get : raw_req;
          const Cell& raw_fp = OP == "GET" ? raw_get_fp : raw_req_fp;
          // copy+verify is the GET's ceiling (no PUT counterpart is measured).
          const Cell cv = OP == "GET" ? copy_verify : Cell{};
          std::printf("| %s | %s | %zu | %.2f | %.0f / %.0f | %.2f | %.0f / %.0f | %.2f | %.2f (%.1f) | %.2f | %.2f | "
                      "%.2fx | %.2fx | %.2fx | %.2fx | %.2f | %.2fx | %.2f | %.2fx | %.0f / %.0f / %.0f / %.0f / %.0f | "
                      "%.2f | %.2fx | %.2f | %.2fx |\n",
                      OP.c_str(), SizeName(size).c_str(), clients, kv.gbps, kv.p50_us, kv.p99_us, uc.gbps, uc.p50_us,
                      uc.p99_us, P50Gbps(uc, size), am_lat.gbps, am_lat.p50_us, rd.gbps, raw_req.gbps,
                      ratio(P50Gbps(uc, size), am_lat.gbps), ratio(uc.gbps, kv.gbps), ratio(kv.gbps, raw_req.gbps),
                      ratio(kv.gbps, rd.gbps), raw_same.gbps, ratio(kv.gbps, raw_same.gbps), raw_fp.gbps,
                      ratio(kv.gbps, raw_fp.gbps), kv.cpu_us, uc.cpu_us, rd.cpu_us, raw_same.cpu_us, raw_fp.cpu_us,
                      am_bw.gbps, ratio(uc.gbps, am_bw.gbps), cv.gbps, ratio(uc.gbps, cv.gbps));
        }
        std::fflush(stdout);
      }
    }
    if (!json) PrintTargets(size, client_counts, med, am_bw, local_share);
    ::munmap(ho_map, ho_bytes);
  }

  // The batch rows: one GetInto (and one PutFrom) of 64 blocks of 64 KiB, one client.
  if (("," + backends + ",").find(",batch,") != std::string::npos) {
    const std::vector<std::vector<std::byte>> payload = Payloads(1, kBatchBlock);
    auto key = [&](size_t k) { return BlockKey{0xBA7C4000ull + k, k * 0x9E3779B97F4A7C15ull}; };
    std::vector<PutItem> puts(kBatch);
    for (size_t k = 0; k < kBatch; ++k) {
      std::memcpy(pool[0].get() + (1 + k) * slot, payload[0].data(), kBatchBlock);
      puts[k] = PutItem{key(k), {pool[0].get() + (1 + k) * slot, kBatchBlock}, {}};
    }
    if (!ch[0]->Put(puts, {}).ok()) return 1;
    if (tcp_node != &node && !ux.empty() && !ux[0]->Put(puts, {}).ok()) return 1;
    std::vector<Cell> bw_cells;
    std::map<std::string, std::vector<Cell>> cells;
    for (int r = 0; r < reps; ++r) {
      Progress("batch of %zu x 64 KiB, rep %d/%d", kBatch, r + 1, reps);
      bw_cells.push_back(Perftest("ucp_am_bw", kBatchBlock));
      auto run = [&](ShardChannel& c, bool get) {
        return RunClients(1, seconds, kBatch * kBatchBlock, [&](int, uint64_t) {
          if (get) {
            std::vector<GetItem> gets(kBatch);
            for (size_t k = 0; k < kBatch; ++k) gets[k] = GetItem{key(k), dst_of(0, k, kBatchBlock), 0, {}};
            if (!c.Get(gets, {}).ok()) return false;
            for (auto& g : gets)
              if (!g.status.ok() || g.size != kBatchBlock) return false;
            return true;
          }
          return c.Put(puts, {}).ok();
        });
      };
      cells["tcp_get"].push_back(run(*ch[0], true));
      cells["tcp_put"].push_back(run(*ch[0], false));
      if (!ux.empty()) {
        cells["ucx_get"].push_back(run(*ux[0], true));
        cells["ucx_put"].push_back(run(*ux[0], false));
      }
    }
    const Cell bw = Median(bw_cells);
    add("ucx_perftest", "ucp_am_bw", kBatchBlock, 1, 1, bw);
    if (!json) {
      std::printf("\n# one batch of %zu x 64 KiB blocks (GetInto / PutFrom into registered memory), 1 client, vs "
                  "ucp_am_bw 64 KiB\n", kBatch);
      std::printf("| op | kvmesh TCP GB/s | kvmesh UCX GB/s | ucp_am_bw GB/s | UCX/am_bw | TCP/am_bw |\n|---|---|---|---|---|---|\n");
    }
    for (const char* op : {"get", "put"}) {
      const Cell t = Median(cells[std::string("tcp_") + op]);
      const Cell u = ux.empty() ? Cell{} : Median(cells[std::string("ucx_") + op]);
      const std::string OP = std::string(op) == "put" ? "PUT" : "GET";
      add("tcp", OP.c_str(), kBatchBlock, 1, kBatch, t);
      add("ucx", OP.c_str(), kBatchBlock, 1, kBatch, u);
      if (!json)
        std::printf("| %s x%zu | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n", OP.c_str(), kBatch, t.gbps, u.gbps, bw.gbps,
                    bw.gbps > 0 ? u.gbps / bw.gbps : 0, bw.gbps > 0 ? t.gbps / bw.gbps : 0);
    }
  }
  node.Kill(SIGTERM);
  node.Wait(5s);
  if (tcp_node != &node) {
    tcp_node_own.Kill(SIGTERM);
    tcp_node_own.Wait(5s);
    ::unlink(tcp_cfg_path.c_str());
  }
  redis.Kill(SIGTERM);
  redis.Wait(5s);
  ::unlink(cfg_path.c_str());
  if (json) {
    nlohmann::json out;
    out["ucx_tls"] = tls ? tls : "default";
    out["ucx_progress"] = ucx_progress;
    out["ucx_memory"] = ucx_memory;
    out["ucx_workers"] = ucx_workers;
    out["io_threads"] = io_threads;
    out["seconds"] = seconds;
    out["reps"] = reps;
    out["rows"] = nlohmann::json::array();
    for (const Row& r : rows)
      out["rows"].push_back({{"backend", r.backend}, {"op", r.op}, {"block_bytes", r.block_bytes}, {"clients", r.clients},
                             {"batch", r.batch}, {"gbps", r.c.gbps}, {"ops", r.c.ops}, {"p50_us", r.c.p50_us},
                             {"p99_us", r.c.p99_us}, {"cpu_us", r.c.cpu_us},
                             {"server_cpu_us", r.c.server_cpu_us}});
    std::printf("%s\n", out.dump().c_str());
  }
  if (want_resp)
    return RespTable(kvmesh_bin, redis_bin, rb_bin, seconds, reps, ParseList(resp_sizes_arg), ParseList(resp_clients_arg),
                     ParseList(resp_pipeline_arg));
  return 0;
}
