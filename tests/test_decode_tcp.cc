// The TCP step transport of the model-parallel decode: collectives
// between threads over real loopback sockets equal the thread backend bit for
// bit; the decode scenario (fork, truncate, prefix reuse) and `kvmesh decode`
// run as separate processes joined over TCP and produce the same tokens and
// logits as one process; a peer that dies, stalls or sends garbage fails every
// rank with a clear Status within the step timeout.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "coordinator/decode/cluster.h"
#include "coordinator/decode/comm_tcp.h"
#include "kvmesh/embedded.h"
#include "shard_node/shard_node.h"
#include "tests/cluster_process.h"
#include "tests/decode_scenario.h"
#include "tests/test_time.h"

using namespace kvmesh;
using namespace kvmesh::decode;
using namespace kvmesh::decode::testing;
using SClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using kvmesh::testing::TimeBound;

namespace {

// A fresh rendezvous file path for one group (removed by rank 0 once joined).
std::string RendezvousPath() {
  static std::atomic<int> n{0};
  return "/tmp/kvmesh-test-tcp-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".addr";
}

TcpCommOptions Opts(int rank, int size, const std::string& file, milliseconds step = milliseconds(10000)) {
  TcpCommOptions o;
  o.rank = rank;
  o.size = size;
  o.host = "127.0.0.1";
  o.port = 0;  // run-time port, published through the file
  o.rendezvous_file = file;
  o.connect_timeout = milliseconds(10000);
  o.step_timeout = step;
  return o;
}

// n TCP comms joined to each other, one made per thread.
std::vector<std::unique_ptr<StepComm>> TcpGroup(int n, milliseconds step = milliseconds(10000)) {
  const std::string file = RendezvousPath();
  std::vector<Result<std::unique_ptr<StepComm>>> made;
  for (int r = 0; r < n; ++r) made.emplace_back(Unavailable("not made"));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { made[r] = MakeTcpComm(Opts(r, n, file, step)); });
  for (auto& t : ts) t.join();
  std::vector<std::unique_ptr<StepComm>> v;
  for (auto& m : made) {
    REQUIRE(m.ok());
    v.push_back(std::move(m).value());
  }
  return v;
}

// Runs f(rank, comm) on one thread per rank.
template <typename F>
void OnRanks(std::vector<std::unique_ptr<StepComm>>& comms, F f) {
  std::vector<std::thread> ts;
  for (size_t r = 0; r < comms.size(); ++r) ts.emplace_back([&, r] { f(static_cast<int>(r), *comms[r]); });
  for (auto& t : ts) t.join();
}

// Per-rank inputs with magnitudes spread over 1e-3..1e5, so a different
// summation order changes low bits.
std::vector<float> Input(int rank, size_t n) {
  std::mt19937 g(1000 + rank);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = u(g) * std::pow(10.0f, float((i + rank) % 9) - 3);
  return v;
}

struct Results {
  std::vector<std::vector<float>> sum;         // per rank
  std::vector<std::vector<uint64_t>> mn, su;  // per rank
  std::vector<std::vector<std::byte>> bc0, bcl;
};

// The same collectives on every rank; returns what each rank ended with.
// (Catch assertions are not thread-safe: the rank threads only record.)
Results RunCollectives(std::vector<std::unique_ptr<StepComm>>& comms, size_t floats) {
  const int n = static_cast<int>(comms.size());
  Results res;
  res.sum.resize(n), res.mn.resize(n), res.su.resize(n), res.bc0.resize(n), res.bcl.resize(n);
  std::vector<std::string> errors(n);
  OnRanks(comms, [&](int r, StepComm& c) {
    auto must = [&](const Status& s, const char* what) {
      if (!s.ok() && errors[r].empty()) errors[r] = std::string(what) + ": " + s.ToString();
    };
    std::vector<float> x = Input(r, floats);
    std::vector<uint64_t> m(17), s(17);
    for (size_t i = 0; i < m.size(); ++i) m[i] = s[i] = (i * 7919 + r * 104729) % 1000;
    std::vector<std::byte> b0(333, std::byte(r)), bl(4096, std::byte(r + 1));
    for (int rep = 0; rep < 3; ++rep) {  // several rounds: sequence numbers advance
      std::vector<float> y = x;
      must(c.AllReduceSum(y), "AllReduceSum");
      if (rep == 0) res.sum[r] = y;
      else if (std::memcmp(y.data(), res.sum[r].data(), y.size() * sizeof(float)) != 0 && errors[r].empty())
        errors[r] = "AllReduceSum differs between rounds";
    }
    must(c.AllReduceMin(m), "AllReduceMin");
    must(c.AllReduceSumU64(s), "AllReduceSumU64");
    must(c.Broadcast(b0, 0), "Broadcast(0)");
    must(c.Broadcast(bl, n - 1), "Broadcast(n-1)");
    must(c.Barrier(), "Barrier");
    std::vector<float> empty;
    must(c.AllReduceSum(empty), "AllReduceSum(empty)");
    must(c.Broadcast({}, 0), "Broadcast(empty)");
    res.mn[r] = m, res.su[r] = s, res.bc0[r] = b0, res.bcl[r] = bl;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r] == "");
  }
  return res;
}

// ---- A hand-made peer speaking the frame format of comm_tcp.h ----------------

void Put(std::byte* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t Get(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}
std::array<std::byte, 40> Frame(uint8_t op, uint64_t seq, std::span<const std::byte> payload, uint64_t sum) {
  std::array<std::byte, 40> b{};
  Put(&b[0], 0x4353564bu, 4);
  Put(&b[4], 2, 1);  // version 2: the mesh
  Put(&b[5], op, 1);
  Put(&b[8], seq, 8);
  Put(&b[16], payload.size(), 8);
  Put(&b[24], sum, 8);
  Put(&b[32], Checksum64(b.data(), 32), 8);
  return b;
}
void SendFrame(int fd, uint8_t op, std::span<const std::byte> payload) {
  auto h = Frame(op, 0, payload, Checksum64(payload.data(), payload.size()));
  REQUIRE(::send(fd, h.data(), h.size(), MSG_NOSIGNAL) == 40);
  if (!payload.empty()) REQUIRE(::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL) == ssize_t(payload.size()));
}

// A blocking loopback connection to `port`.
int ConnectLoopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  return fd;
}

// Connects as `rank` of `size` to the rank 0 published in `file` and says
// hello, announcing a mesh listener on 127.0.0.1:listen_port (0: none).
int FakeHello(const std::string& file, int rank, int size, uint16_t listen_port = 0) {
  std::string addr;
  for (int i = 0; i < 500 && addr.empty(); ++i) {
    std::ifstream f(file);
    std::getline(f, addr);
    if (addr.empty()) std::this_thread::sleep_for(milliseconds(10));
  }
  REQUIRE(!addr.empty());
  int fd = ConnectLoopback(static_cast<uint16_t>(std::stoul(addr.substr(addr.rfind(':') + 1))));
  std::array<std::byte, 16> hello{};
  Put(&hello[0], rank, 4);
  Put(&hello[4], size, 4);
  Put(&hello[8], listen_port == 0 ? 0 : htonl(INADDR_LOOPBACK), 4);
  Put(&hello[12], listen_port, 4);
  SendFrame(fd, 1, hello);
  return fd;
}

// A hand-made last rank (size - 1, which listens for nobody) fully joined to
// the mesh: fd[k] is its socket to rank k. Closes them at the end.
struct FakeRank {
  std::vector<int> fd;
  ~FakeRank() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};
std::unique_ptr<FakeRank> FakeJoin(const std::string& file, int size) {
  auto me = std::make_unique<FakeRank>();
  me->fd.assign(size, -1);
  me->fd[0] = FakeHello(file, size - 1, size);
  std::array<std::byte, 40> h;
  REQUIRE(::recv(me->fd[0], h.data(), h.size(), MSG_WAITALL) == 40);  // the welcome: group id, addresses
  REQUIRE(Get(&h[5], 1) == 2);
  std::vector<std::byte> welcome(8 + 8 * size);
  REQUIRE(Get(&h[16], 8) == welcome.size());
  REQUIRE(::recv(me->fd[0], welcome.data(), welcome.size(), MSG_WAITALL) == ssize_t(welcome.size()));
  std::array<std::byte, 16> peer_hello;
  Put(&peer_hello[0], Get(&welcome[0], 8), 8);
  Put(&peer_hello[8], size - 1, 4);
  Put(&peer_hello[12], size, 4);
  for (int k = 1; k < size - 1; ++k) {
    me->fd[k] = ConnectLoopback(static_cast<uint16_t>(Get(&welcome[12 + 8 * k], 4)));
    SendFrame(me->fd[k], 9, peer_hello);
  }
  SendFrame(me->fd[0], 10, {});                                       // ready
  REQUIRE(::recv(me->fd[0], h.data(), h.size(), MSG_WAITALL) == 40);  // every rank is
  REQUIRE(Get(&h[5], 1) == 10);
  return me;
}

// ---- Child processes ------------------------------------------------------------

std::string SelfExe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<size_t>(n));
}

// One hash over a transcript's tokens, reuse counts and every logit's bits.
uint64_t Digest(const Transcript& t) {
  std::vector<std::byte> all;
  auto add = [&](const void* p, size_t n) {
    auto b = static_cast<const std::byte*>(p);
    all.insert(all.end(), b, b + n);
  };
  add(t.tokens.data(), t.tokens.size() * sizeof(TokenId));
  add(t.reused.data(), t.reused.size() * sizeof(uint32_t));
  for (const auto& l : t.logits) add(l.data(), l.size() * sizeof(float));
  return Checksum64(all.data(), all.size());
}

// The scenario on `ranks` threads of this process, each rank on its own
// node (the single-process run the TCP ranks must equal).
Transcript ThreadScenario(const ModelConfig& mc, int ranks) {
  auto w = Weights::Generate(mc).value();
  auto cluster = EmbeddedCluster::Start(ClusterFor(mc, ranks)).value();
  auto comms = MakeThreadComms(ranks);
  std::vector<Transcript> per(ranks);
  std::vector<std::thread> ts;
  for (int r = 0; r < ranks; ++r) {
    ts.emplace_back([&, r] {
      RankPlan plan = PlanRank(mc, r, ranks).value();
      auto table = SequenceTable::Create(&cluster->node(r).store(), mc.Spec(), {0, mc.layers}, plan.kv_heads).value();
      RankEngine eng(w, plan, table.get(), comms[r].get());
      RankExec x(&eng);
      RunScenario(x, &per[r]);
    });
  }
  for (auto& t : ts) t.join();
  return per[0];
}

const char* Env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

// Starts `argv` with stderr joined to stdout (so the parent can read errors).
bool StartJoined(kvmesh::testing::Process& p, const std::vector<std::string>& argv) {
  std::string cmd = "exec";
  for (const auto& a : argv) cmd += " '" + a + "'";
  return p.Start({"/bin/sh", "-c", cmd + " 2>&1"});
}

// Every line until EOF or the deadline.
std::string ReadAll(kvmesh::testing::Process& p, milliseconds timeout) {
  const auto end = SClock::now() + timeout;
  std::string all;
  while (SClock::now() < end) {
    auto line = p.ReadLine(std::chrono::duration_cast<milliseconds>(end - SClock::now()));
    if (!line) break;
    all += *line + "\n";
  }
  return all;
}

int ExitCode(kvmesh::testing::Process& p, milliseconds timeout) {
  auto st = p.Wait(timeout);
  if (!st) return -1000;  // still running
  return WIFEXITED(*st) ? WEXITSTATUS(*st) : -WTERMSIG(*st);
}

}  // namespace

TEST_CASE("TCP step comm: collectives between threads equal the thread backend bit for bit", "[decode][tcp]") {
  for (int n : {2, 3, 4}) {
    for (size_t floats : {size_t(1), size_t(1000), size_t(300000)}) {  // 300k floats: 1.2 MB frames
      INFO("ranks " << n << ", floats " << floats);
      auto threads = MakeThreadComms(n);
      Results want = RunCollectives(threads, floats);
      auto tcp = TcpGroup(n);
      REQUIRE(tcp[0]->backend() == "tcp");
      REQUIRE(tcp[n - 1]->rank() == n - 1);
      REQUIRE(tcp[n - 1]->size() == n);
      Results got = RunCollectives(tcp, floats);
      for (int r = 0; r < n; ++r) {
        REQUIRE(got.sum[r].size() == want.sum[r].size());
        CHECK(std::memcmp(got.sum[r].data(), want.sum[r].data(), floats * sizeof(float)) == 0);
        CHECK(got.mn[r] == want.mn[r]);
        CHECK(got.su[r] == want.su[r]);
        CHECK(got.bc0[r] == want.bc0[r]);
        CHECK(got.bcl[r] == want.bcl[r]);
      }
      CHECK(got.bc0[n - 1][0] == std::byte(0));
      CHECK(got.bcl[0][0] == std::byte(n));
      if (n >= 3 && floats == 1000) {  // the inputs are order-sensitive, so equality means rank order
        std::vector<float> rev(floats, 0.0f);
        for (int r = n - 1; r >= 0; --r) {
          auto x = Input(r, floats);
          for (size_t i = 0; i < floats; ++i) rev[i] += x[i];
        }
        CHECK(std::memcmp(rev.data(), want.sum[0].data(), floats * sizeof(float)) != 0);
      }
    }
  }
}

TEST_CASE("TCP step comm: bad options and failed rendezvous are clear errors, quickly", "[decode][tcp]") {
  TcpCommOptions o = Opts(2, 2, RendezvousPath());
  CHECK(MakeTcpComm(o).status().code() == StatusCode::kInvalidArgument);  // rank out of range
  o = Opts(1, 2, "");
  CHECK(MakeTcpComm(o).status().code() == StatusCode::kInvalidArgument);  // port 0 and no file
  o = Opts(0, 1, "");
  auto solo = MakeTcpComm(o);  // a world of one needs no sockets
  REQUIRE(solo.ok());
  std::vector<float> x{1.5f};
  CHECK((*solo)->AllReduceSum(x).ok());
  CHECK(x[0] == 1.5f);

  // Nobody publishes the file: the joining rank gives up at its timeout.
  o = Opts(1, 2, RendezvousPath());
  o.connect_timeout = milliseconds(300);
  auto t0 = SClock::now();
  auto r = MakeTcpComm(o);
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(SClock::now() - t0 < milliseconds(3000));

  // Rank 0 alone: names the missing rank.
  o = Opts(0, 3, RendezvousPath());
  o.connect_timeout = milliseconds(300);
  Result<std::unique_ptr<StepComm>> r1 = Unavailable("not made");
  const std::string file = o.rendezvous_file;
  std::thread joiner([&] {
    TcpCommOptions j = Opts(1, 3, file);
    j.connect_timeout = milliseconds(2000);
    r1 = MakeTcpComm(j);
  });
  r = MakeTcpComm(o);
  joiner.join();
  REQUIRE(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(r.status().message(), Catch::Contains("missing: 2"));
  CHECK(!r1.ok());  // rank 1 joined, then was told why the group failed
  CHECK_THAT(r1.status().message(), Catch::Contains("missing: 2"));

  // A rank with the wrong world size is refused with the reason.
  o = Opts(0, 2, RendezvousPath());
  o.connect_timeout = milliseconds(1500);
  Result<std::unique_ptr<StepComm>> bad = Unavailable("not made");
  const std::string f2 = o.rendezvous_file;
  std::thread wrong([&] { bad = MakeTcpComm(Opts(1, 3, f2)); });
  r = MakeTcpComm(o);
  wrong.join();
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("world size 3 differs"));
}

TEST_CASE("TCP step comm: a rank that leaves fails every other rank with Unavailable", "[decode][tcp]") {
  auto comms = TcpGroup(3);
  comms[1].reset();  // rank 1's process ended
  std::vector<Status> got(3);
  std::vector<std::thread> ts;
  for (int r : {0, 2}) {
    ts.emplace_back([&, r] {
      std::vector<float> x(64, 1.0f);
      got[r] = comms[r]->AllReduceSum(x);
    });
  }
  for (auto& t : ts) t.join();
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << got[r].ToString());
    CHECK(got[r].code() == StatusCode::kUnavailable);
    CHECK_THAT(got[r].message(), Catch::Contains("rank 1 closed the connection"));
  }
  // The error sticks: the group is finished.
  std::vector<float> x(4);
  CHECK(comms[0]->AllReduceSum(x).code() == StatusCode::kUnavailable);
  CHECK(comms[0]->Barrier().code() == StatusCode::kUnavailable);

  // Rank 0 leaves: the others see it at once.
  auto two = TcpGroup(2);
  two[0].reset();
  std::vector<std::byte> b(8);
  Status s = two[1]->Broadcast(b, 0);
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::Contains("rank 0 closed the connection"));
}

TEST_CASE("TCP step comm: a stalled rank fails the others with DeadlineExceeded within the timeout", "[decode][tcp]") {
  auto comms = TcpGroup(3, milliseconds(400));
  std::vector<Status> got(3);
  std::vector<SClock::duration> took(3);
  std::vector<std::thread> ts;
  for (int r : {0, 1}) {
    ts.emplace_back([&, r] {
      auto t0 = SClock::now();
      std::vector<uint64_t> x(3, 7);
      got[r] = comms[r]->AllReduceMin(x);
      took[r] = SClock::now() - t0;
    });
  }
  for (auto& t : ts) t.join();  // rank 2 never joins the collective
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << got[r].ToString());
    CHECK(got[r].code() == StatusCode::kDeadlineExceeded);
    CHECK_THAT(got[r].message(), Catch::Contains("rank 2"));
    CHECK(took[r] < milliseconds(400 + 500 + 1000));
  }
  CHECK_THAT(got[1].message(), Catch::Contains("rank 0 aborted"));
}

TEST_CASE("TCP step comm: garbage or a corrupt payload from a peer is DataLoss on every rank", "[decode][tcp]") {
  // The hand-made rank 2 sends its bad frame to rank 0 (the rank that decides
  // a stall) or to rank 1 (in the mesh any rank can be the one that sees it).
  for (int victim : {0, 1}) {
    for (bool corrupt_payload : {false, true}) {
      const std::string what = corrupt_payload ? "corrupt payload" : "garbage header";
      INFO(what << " to rank " << victim);
      const std::string file = RendezvousPath();
      Result<std::unique_ptr<StepComm>> c0 = Unavailable("not made"), c1 = Unavailable("not made");
      // The other real rank waits for the hand-made rank's data, which never
      // comes: it reads the victim's abort when its own timer fires.
      std::thread t0([&] { c0 = MakeTcpComm(Opts(0, 3, file, milliseconds(600))); });
      std::thread t1([&] { c1 = MakeTcpComm(Opts(1, 3, file, milliseconds(600))); });
      auto fake = FakeJoin(file, 3);
      t0.join();
      t1.join();
      REQUIRE(c0.ok());
      REQUIRE(c1.ok());
      const int to = fake->fd[victim];
      std::vector<float> payload(16, 2.0f);
      auto bytes = std::as_bytes(std::span(payload));
      if (corrupt_payload) {  // a well-formed AllReduceSum frame #1 whose payload checksum is wrong
        auto h = Frame(3, 1, bytes, Checksum64(bytes.data(), bytes.size()) ^ 1);
        REQUIRE(::send(to, h.data(), h.size(), MSG_NOSIGNAL) == 40);
        REQUIRE(::send(to, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size()));
      } else {
        std::array<char, 40> junk;
        junk.fill('x');
        REQUIRE(::send(to, junk.data(), junk.size(), MSG_NOSIGNAL) == 40);
      }
      Status s[2];
      std::vector<std::thread> ts;
      for (int r : {0, 1}) {
        ts.emplace_back([&, r] {
          std::vector<float> x(16, 1.0f);
          s[r] = (r == 0 ? *c0 : *c1)->AllReduceSum(x);
        });
      }
      for (auto& t : ts) t.join();
      fake.reset();
      const int other = 1 - victim;
      INFO(s[0].ToString() << " / " << s[1].ToString());
      CHECK(s[victim].code() == StatusCode::kDataLoss);
      CHECK(s[other].code() == StatusCode::kDataLoss);  // carried by the victim's abort
      CHECK_THAT(s[victim].message(), Catch::Contains("from rank 2"));
      CHECK_THAT(s[other].message(), Catch::Contains("rank " + std::to_string(victim) + " aborted"));
    }
  }
}

TEST_CASE("TCP step comm: a dead rank other than 0 fails every rank's next collective that needs it",
          "[decode][tcp]") {
  auto comms = TcpGroup(4);
  comms[2].reset();  // rank 2 of 4 exits between collectives
  std::vector<Status> bc(4), sum(4);
  std::vector<std::vector<std::byte>> got(4, std::vector<std::byte>(64, std::byte(0)));
  std::vector<std::thread> ts;
  for (int r : {0, 1, 3}) {
    ts.emplace_back([&, r] {
      if (r == 3) std::fill(got[r].begin(), got[r].end(), std::byte(0x5a));
      bc[r] = comms[r]->Broadcast(got[r], 3);  // rank 2's data is not needed: may succeed
      std::vector<float> x(64, 1.0f);
      sum[r] = comms[r]->AllReduceSum(x);  // needs rank 2: fails everywhere
    });
  }
  for (auto& t : ts) t.join();
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << bc[r].ToString() << " / " << sum[r].ToString());
    if (bc[r].ok()) CHECK(got[r][63] == std::byte(0x5a));
    else CHECK_THAT(bc[r].message(), Catch::Contains("rank 2"));
    CHECK(sum[r].code() == StatusCode::kUnavailable);
    CHECK_THAT(sum[r].message(), Catch::Contains("rank 2"));
  }
}

TEST_CASE("TCP step comm: a stalled rank 0 fails the others within the timeout plus the grace", "[decode][tcp]") {
  auto comms = TcpGroup(3, milliseconds(400));
  std::vector<Status> got(3);
  std::vector<SClock::duration> took(3);
  std::vector<std::thread> ts;
  for (int r : {1, 2}) {
    ts.emplace_back([&, r] {
      auto t0 = SClock::now();
      std::vector<float> x(8, 1.0f);
      got[r] = comms[r]->AllReduceSum(x);
      took[r] = SClock::now() - t0;
    });
  }
  for (auto& t : ts) t.join();  // rank 0 never joins the collective
  for (int r : {1, 2}) {
    INFO("rank " << r << ": " << got[r].ToString());
    CHECK(got[r].code() == StatusCode::kDeadlineExceeded);
    CHECK_THAT(got[r].message(), Catch::Contains("rank 0"));
    CHECK(took[r] >= milliseconds(400));
    CHECK(took[r] < milliseconds(400 + 500 + 1000));
  }
}

TEST_CASE("TCP step comm: ranks in different collectives fail with Internal on every rank", "[decode][tcp]") {
  auto comms = TcpGroup(3);
  std::vector<Status> got(3);
  OnRanks(comms, [&](int r, StepComm& c) {
    std::vector<float> x(16, 1.0f);
    got[r] = r == 0 ? c.Barrier() : c.AllReduceSum(x);  // rank 0 left SPMD order
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << got[r].ToString());
    CHECK(got[r].code() == StatusCode::kInternal);
    CHECK_THAT(got[r].message(), Catch::Contains("collective mismatch"));
  }
}

TEST_CASE("TCP step comm: every rank sending large frames to every other at once does not deadlock",
          "[decode][tcp]") {
  // 3 x 8 MB in flight per rank, far beyond the loopback socket buffers:
  // each rank must read its peers while its own sends wait for space.
  const size_t floats = size_t(2) << 20;
  auto threads = MakeThreadComms(3);
  auto tcp = TcpGroup(3, milliseconds(20000));
  std::vector<std::vector<float>> want(3), got(3);
  std::vector<Status> st(3);
  OnRanks(threads, [&](int r, StepComm& c) {
    want[r] = Input(r, floats);
    (void)c.AllReduceSum(want[r]);
  });
  const auto t0 = SClock::now();
  OnRanks(tcp, [&](int r, StepComm& c) {
    got[r] = Input(r, floats);
    st[r] = c.AllReduceSum(got[r]);
  });
  INFO("took " << std::chrono::duration_cast<milliseconds>(SClock::now() - t0).count() << " ms");
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << st[r].ToString());
    REQUIRE(st[r].ok());
    CHECK(std::memcmp(got[r].data(), want[r].data(), floats * sizeof(float)) == 0);
  }
}

TEST_CASE("TCP step comm: a rank that cannot reach a peer fails the rendezvous on every rank at once",
          "[decode][tcp]") {
  // Hand-made rank 1 announces a mesh port nobody listens on (bound, not
  // listening: connections are refused), so rank 2 cannot link to it.
  int dead = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(dead, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  socklen_t len = sizeof sa;
  REQUIRE(::getsockname(dead, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  const std::string file = RendezvousPath();
  Result<std::unique_ptr<StepComm>> c0 = Unavailable("not made"), c2 = Unavailable("not made");
  const auto t0 = SClock::now();
  std::thread a([&] { c0 = MakeTcpComm(Opts(0, 3, file)); });  // connect timeout 10 s
  std::thread b([&] { c2 = MakeTcpComm(Opts(2, 3, file)); });
  int fake = FakeHello(file, 1, 3, ntohs(sa.sin_port));
  a.join();
  b.join();
  const auto took = SClock::now() - t0;
  ::close(fake);
  ::close(dead);
  INFO(c0.status().ToString() << " / " << c2.status().ToString());
  REQUIRE(!c0.ok());
  REQUIRE(!c2.ok());
  CHECK(c2.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(c2.status().message(), Catch::Contains("connecting to rank 1"));
  CHECK(c0.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(c0.status().message(), Catch::Contains("rank 2 aborted"));
  CHECK_THAT(c0.status().message(), Catch::Contains("connecting to rank 1"));
  CHECK(took < milliseconds(3000));  // told at once, not at the 10 s connect timeout
}

// Child process body for the next test: one rank of the scenario over TCP.
TEST_CASE("TCP decode child rank (run by the multi-process test)", "[.tcp-child]") {
  const int rank = std::atoi(Env("KVMESH_TCP_RANK")), world = std::atoi(Env("KVMESH_TCP_WORLD"));
  REQUIRE(world > 0);
  auto comm = MakeTcpComm(Opts(rank, world, Env("KVMESH_TCP_FILE")));
  REQUIRE(comm.ok());
  const ModelConfig mc = SmallModel(4);
  auto w = Weights::Generate(mc).value();
  const ClusterConfig cfg = ClusterFor(mc, world);
  Transcript got;
  {
    RankPlan plan = PlanRank(mc, rank, world).value();
    auto node = ShardNode::Create(cfg, cfg.nodes[rank].id).value();
    auto table = SequenceTable::Create(&node->store(), mc.Spec(), {0, mc.layers}, plan.kv_heads).value();
    RankEngine eng(w, plan, table.get(), comm->get());
    RankExec x(&eng);
    RunScenario(x, &got);
  }
  REQUIRE((*comm)->Barrier().ok());
  if (rank == 0) {
    nlohmann::json j = {{"event", "scenario"}, {"digest", Digest(got)}, {"tokens", got.tokens.size()},
                        {"logits", got.logits.size()}, {"reused", got.reused}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

TEST_CASE("Decode over TCP: 2 and 4 rank processes equal the single-process run bit for bit (fork, truncate, reuse)",
          "[decode][tcp]") {
  const ModelConfig mc = SmallModel(4);
  const std::string exe = SelfExe();
  for (int world : {2, 4}) {
    INFO("ranks " << world);
    const Transcript want = ThreadScenario(mc, world);
    {  // the threads run itself matches the reference (test_decode.cc checks the tolerance in detail)
      Transcript ref;
      RefExec x(Weights::Generate(mc).value());
      RunScenario(x, &ref);
      REQUIRE(want.tokens == ref.tokens);
      REQUIRE(WorstRelative(want.logits, ref.logits) < 1e-4f);
    }
    const std::string file = RendezvousPath();
    std::vector<std::unique_ptr<kvmesh::testing::Process>> ps;
    for (int r = 0; r < world; ++r) {
      ps.push_back(std::make_unique<kvmesh::testing::Process>());
      REQUIRE(ps.back()->Start({"/usr/bin/env", "KVMESH_TCP_RANK=" + std::to_string(r),
                                "KVMESH_TCP_WORLD=" + std::to_string(world), "KVMESH_TCP_FILE=" + file, exe,
                                "TCP decode child rank (run by the multi-process test)"}));
    }
    auto ev = ps[0]->WaitEvent("scenario", TimeBound(milliseconds(20000)));
    REQUIRE(ev.has_value());
    CHECK((*ev)["digest"].get<uint64_t>() == Digest(want));
    CHECK((*ev)["tokens"].get<size_t>() == want.tokens.size());
    CHECK((*ev)["logits"].get<size_t>() == want.logits.size());
    CHECK((*ev)["reused"] == nlohmann::json(want.reused));  // [0, 40]: the second request attached 40 tokens
    for (int r = 0; r < world; ++r) CHECK(ExitCode(*ps[r], TimeBound(milliseconds(10000))) == 0);
  }
}

namespace {

// A small `kvmesh decode` run: workload with and without reuse, no sweep, the
// speculative demo (draft rollback by truncate) on fewer tokens.
std::vector<std::string> DecodeArgs(std::vector<std::string> extra) {
  std::vector<std::string> a = {KVMESH_BIN, "decode", "--json", "--conversations", "3", "--agents", "1",
                                "--sweep", "", "--batch", "4", "--reply-max", "10", "--layers", "2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> TcpRankArgs(int r, int world, const std::string& file, std::vector<std::string> extra = {}) {
  std::vector<std::string> e = {"--tcp-rank", std::to_string(r), "--tcp-world", std::to_string(world),
                                "--tcp-rendezvous", "127.0.0.1:0", "--tcp-rendezvous-file", file};
  e.insert(e.end(), extra.begin(), extra.end());
  return e;
}

nlohmann::json RunJson(kvmesh::testing::Process& p, milliseconds timeout) {
  std::string out = ReadAll(p, timeout);
  auto j = nlohmann::json::parse(out, nullptr, false);
  INFO("output: " << out);
  REQUIRE(!j.is_discarded());
  return j;
}

}  // namespace

TEST_CASE("kvmesh decode --tcp-world 2 and 4: same tokens as one process with the same ranks", "[decode][tcp]") {
  for (int world : {2, 4}) {
    INFO("ranks " << world);
    kvmesh::testing::Process single;
    // Generous bounds: under ThreadSanitizer on the loaded 2-core host one
    // 4-rank run alone has taken 35 s.
    REQUIRE(single.Start(DecodeArgs({"--ranks", std::to_string(world)})));
    nlohmann::json want = RunJson(single, TimeBound(milliseconds(90000)));
    REQUIRE(ExitCode(single, TimeBound(milliseconds(5000))) == 0);

    const std::string file = RendezvousPath();
    std::vector<std::unique_ptr<kvmesh::testing::Process>> ps;
    for (int r = 0; r < world; ++r) {
      ps.push_back(std::make_unique<kvmesh::testing::Process>());
      REQUIRE(ps.back()->Start(DecodeArgs(TcpRankArgs(r, world, file))));
    }
    nlohmann::json got = RunJson(*ps[0], TimeBound(milliseconds(90000)));
    for (int r = 0; r < world; ++r) CHECK(ExitCode(*ps[r], TimeBound(milliseconds(10000))) == 0);
    CHECK(got["transport"] == "tcp");
    CHECK(got["ranks"] == world);
    for (const char* run : {"with_reuse", "without_reuse"}) {
      INFO(run);
      CHECK(got[run]["token_digest"] == want[run]["token_digest"]);
      CHECK(got[run]["generated_tokens"] == want[run]["generated_tokens"]);
      CHECK(got[run]["computed_prompt_tokens"] == want[run]["computed_prompt_tokens"]);
      CHECK(got[run]["kv_blocks"] == want[run]["kv_blocks"]);
    }
    CHECK(got["with_reuse"]["prefix_hit_rate"].get<double>() > 0);
    CHECK(got["same_tokens_with_and_without_reuse"] == true);
    CHECK(got["speculative"]["same_tokens_as_plain"] == true);  // drafts rolled back by truncate
    CHECK(got["speculative"]["rolled_back_tokens"] == want["speculative"]["rolled_back_tokens"]);
  }
}

TEST_CASE("kvmesh decode over TCP: a killed or stopped rank fails the others with a clear error in time",
          "[decode][tcp]") {
  for (int sig : {SIGKILL, SIGSTOP}) {
    const std::string what = sig == SIGKILL ? "rank 1 killed" : "rank 2 stopped";
    INFO(what);
    const int world = 3, victim = sig == SIGKILL ? 1 : 2;
    const std::string file = RendezvousPath();
    std::vector<std::unique_ptr<kvmesh::testing::Process>> ps;
    for (int r = 0; r < world; ++r) {
      ps.push_back(std::make_unique<kvmesh::testing::Process>());
      // The default workload runs for seconds, so the signal lands mid-run.
      REQUIRE(StartJoined(*ps.back(), {KVMESH_BIN, "decode", "--sweep", "", "--no-spec", "--tcp-rank",
                                       std::to_string(r), "--tcp-world", "3", "--tcp-rendezvous-file", file,
                                       "--tcp-timeout-ms", "1500"}));
    }
    auto header = ps[0]->ReadLine(TimeBound(milliseconds(15000)));  // printed once every rank has joined
    REQUIRE(header.has_value());
    CHECK_THAT(*header, Catch::Contains("TCP collectives"));
    std::this_thread::sleep_for(milliseconds(300));
    ::kill(ps[victim]->pid(), sig);
    const auto t0 = SClock::now();
    const auto bound = TimeBound(milliseconds(1500 + 500 + 5000));  // the step timeout, slack, exit
    for (int r = 0; r < world; ++r) {
      if (r == victim) continue;
      INFO("rank " << r);
      const std::string out = ReadAll(*ps[r], bound);  // until it exits
      const int code = ExitCode(*ps[r], TimeBound(milliseconds(1000)));
      INFO(out);
      CHECK(code == 1);
      if (sig == SIGKILL) {
        CHECK_THAT(out, Catch::Contains("Unavailable"));
        CHECK_THAT(out, Catch::Contains("rank " + std::to_string(victim)));
      } else {
        // A stopped rank: a survivor times out on it (DeadlineExceeded naming
        // it), or on the other survivor while that one is still blocked on
        // the stopped rank (DeadlineExceeded naming that survivor: a rank
        // cannot tell a stuck peer from a stopped one), or, when the other
        // survivor timed out first and exited, sees it close its connection
        // (Unavailable naming it). Each is a clear error in time; which comes
        // first is the scheduler's (the second was seen under ASan beside a
        // build).
        const bool timed_out = out.find("DeadlineExceeded") != std::string::npos &&
                               out.find("no data from rank ") != std::string::npos;
        const bool peer_left = out.find("Unavailable") != std::string::npos &&
                               out.find("closed the connection") != std::string::npos;
        CHECK((timed_out || peer_left));
      }
    }
    CHECK(SClock::now() - t0 < bound);
    ps[victim]->Kill(SIGKILL);  // a stopped process takes SIGKILL too
  }
}

TEST_CASE("NCCL step comm: is refused cleanly without a build or a device", "[decode][nccl]") {
  if (HaveNccl() && CudaDeviceCount() > 0) return;  // the [gpu] case below runs it
  auto c = MakeNcclComm(Opts(0, 1, ""), 0);
  REQUIRE(!c.ok());
  CHECK((c.status().code() == StatusCode::kUnimplemented || c.status().code() == StatusCode::kUnavailable));
}

TEST_CASE("NCCL step comm: collectives over GPUs match the thread backend (fp32 tolerance)", "[gpu][nccl]") {
  if (!HaveNccl() || CudaDeviceCount() == 0) {
    WARN("SKIP: no GPU");
    return;
  }
  // One rank per device (NCCL refuses two ranks on one device in one comm).
  const int n = std::min(CudaDeviceCount(), 4);
  const std::string file = RendezvousPath();
  std::vector<Result<std::unique_ptr<StepComm>>> made;
  for (int r = 0; r < n; ++r) made.emplace_back(Unavailable("not made"));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { made[r] = MakeNcclComm(Opts(r, n, file), r); });
  for (auto& t : ts) t.join();
  std::vector<std::unique_ptr<StepComm>> nccl;
  for (auto& m : made) {
    INFO(m.status().ToString());
    REQUIRE(m.ok());
    nccl.push_back(std::move(m).value());
  }
  REQUIRE(nccl[0]->backend() == "nccl");
  auto threads = MakeThreadComms(n);
  for (size_t floats : {size_t(1), size_t(1000), size_t(300000)}) {
    INFO("ranks " << n << ", floats " << floats);
    Results want = RunCollectives(threads, floats);
    Results got = RunCollectives(nccl, floats);
    for (int r = 0; r < n; ++r) {
      REQUIRE(got.sum[r].size() == want.sum[r].size());
      float worst = 0;
      for (size_t i = 0; i < floats; ++i)
        worst = std::max(worst, std::abs(got.sum[r][i] - want.sum[r][i]) / (1.0f + std::abs(want.sum[r][i])));
      CHECK(worst < 1e-5f);
      CHECK(got.mn[r] == want.mn[r]);
      CHECK(got.su[r] == want.su[r]);
      CHECK(got.bc0[r] == want.bc0[r]);
      CHECK(got.bcl[r] == want.bcl[r]);
    }
  }
}
