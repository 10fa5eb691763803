// The soak's chaos thread (see soak_workload.h) and the probe it uses to
// decide that the cluster serves again.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <random>
#include <thread>

#include "common/checksum.h"
#include "kvmesh/size.h"
#include "soak_cluster.h"
#include "soak_workload.h"
#include "transport/protocol.h"
#include "transport/socket_util.h"

namespace kvmesh::soak {

using namespace std::chrono_literals;

std::vector<BlockKey> PutProbeBlocks(Context& c, Router& r, uint64_t salt) {
  const size_t bb = r.model().FullBlockBytes();
  std::mt19937_64 rng(Mix(c.o.seed ^ salt));
  std::vector<BlockKey> keys(32);
  std::vector<std::byte> data(keys.size() * bb);
  std::vector<PutItem> puts;
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = BlockKey{rng(), rng()};
    auto d = std::span(data).subspan(i * bb, bb);
    Payload(keys[i], c.o.seed, d);
    puts.push_back(PutItem{keys[i], d, {}});
  }
  RequestOptions ro;
  ro.priority = 3;  // evicted last: the probe wants to see its own blocks
  const auto t0 = SteadyClock::now();
  Status s = r.PutBatch(puts, ro);
  if (!c.Count(kProbe, s, t0, {StatusCode::kBusy, StatusCode::kResourceExhausted, StatusCode::kStaleEpoch}))
    return {};
  for (const PutItem& p : puts)
    if (!p.status.ok()) return {};
  return keys;
}

size_t ReadProbeBlocks(Context& c, Router& r, std::span<const BlockKey> keys, std::map<std::string, uint64_t>* why,
                       std::string_view what) {
  const size_t bb = r.model().FullBlockBytes();
  std::vector<std::byte> back(keys.size() * bb), want(bb);
  std::vector<GetItem> gets;
  for (size_t i = 0; i < keys.size(); ++i) gets.push_back(GetItem{keys[i], std::span(back).subspan(i * bb, bb), 0, {}});
  RequestOptions ro;
  ro.priority = 3;
  const auto t0 = SteadyClock::now();
  Status s = r.GetBatch(gets, ro);
  if (!c.Count(kProbe, s, t0)) {
    if (why) (*why)["call: " + std::string(StatusCodeName(s.code()))] += keys.size();
    return 0;
  }
  size_t served = 0;
  for (size_t i = 0; i < gets.size(); ++i) {
    if (!gets[i].status.ok()) {
      if (why) (*why)[std::string(StatusCodeName(gets[i].status.code()))]++;
      continue;
    }
    Payload(keys[i], c.o.seed, want);
    if (gets[i].size != bb || std::memcmp(back.data() + i * bb, want.data(), bb) != 0) {
      c.st.wrong_bytes++;
      c.inv.Violation("wrong_bytes", std::string(what) + " block " + keys[i].ToHex() + " came back different");
    } else {
      ++served;
      c.st.blocks_verified++;
      c.st.bytes_verified += bb;
    }
  }
  return served;
}

bool Probe(Context& c, Router& r, uint64_t salt) {
  const std::vector<BlockKey> keys = PutProbeBlocks(c, r, salt);
  return !keys.empty() && ReadProbeBlocks(c, r, keys) == keys.size();
}

namespace {

using proto::FrameHeader;
using proto::Opcode;

std::string Hello() {
  proto::Hello h;
  h.client_id = "kvmesh-soak-chaos";
  FrameHeader fh;
  fh.opcode = Opcode::kHello;
  fh.request_id = 1;
  return proto::BuildFrame(fh, proto::EncodeHelloBody(h));
}

std::string Header(Opcode op, uint32_t count, uint32_t body_len, uint64_t id = 2) {
  FrameHeader h;
  h.opcode = op;
  h.request_id = id;
  h.count = count;
  h.body_len = body_len;
  auto b = proto::EncodeHeader(h);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// True when the node closes the connection (EOF or reset) before the deadline;
// answers before that are read and dropped.
bool ClosedByPeer(int fd, std::chrono::milliseconds within) {
  const auto end = SteadyClock::now() + within;
  char b[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(fd, b, sizeof(b), 0);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
  }
}

struct BadConn {
  const char* kind;
  bool must_close;  // the node must close it; otherwise we hang up ourselves
  std::function<std::string(std::mt19937_64&)> bytes;
};

std::vector<BadConn> BadConns() {
  auto junk = [](std::mt19937_64& rng, size_t n) {
    std::string s(n, '\0');
    for (char& ch : s) ch = static_cast<char>(rng());
    return s;
  };
  return {
      {"garbage", true, [junk](std::mt19937_64& rng) { return junk(rng, 40 + rng() % 4000); }},
      {"oversize_body", true, [](std::mt19937_64&) { return Header(Opcode::kHello, 0, 0x7FFFFFF0u); }},
      {"too_many_items", true, [](std::mt19937_64&) { return Hello() + Header(Opcode::kGet, 1u << 30, 0); }},
      {"bad_header_checksum", true,
       [](std::mt19937_64&) {
         std::string h = Hello();
         h[36] ^= 0x5A;
         return h;
       }},
      {"data_before_hello", true, [](std::mt19937_64&) { return Header(Opcode::kGet, 1, 16) + std::string(16, 'k'); }},
      {"unknown_opcode", true,
       [](std::mt19937_64&) { return Hello() + Header(static_cast<Opcode>(99), 0, 0); }},
      {"second_hello", true, [](std::mt19937_64&) { return Hello() + Hello(); }},
      {"put_sizes_do_not_add_up", true,
       [](std::mt19937_64&) {
         std::byte rec[proto::kPutItemSize];
         proto::PutRecord r;
         r.key = BlockKey{1, 2};
         r.size = 5000;
         proto::EncodePutRecord(r, rec);
         std::string body(reinterpret_cast<const char*>(rec), sizeof(rec));
         body += std::string(100, 'x');
         return Hello() + Header(Opcode::kPut, 1, static_cast<uint32_t>(body.size())) + body;
       }},
      {"seq_append_garbage_body", true,
       [junk](std::mt19937_64& rng) {
         std::string body = junk(rng, 64);
         body[8] = body[9] = body[10] = static_cast<char>(0x7F);  // n: tens of millions of tokens
         return Hello() + Header(Opcode::kSeqAppend, 0, static_cast<uint32_t>(body.size())) + body;
       }},
      {"truncated_put", false,
       [](std::mt19937_64&) { return Hello() + Header(Opcode::kPut, 1, 32 + 1000) + std::string(100, 't'); }},
      {"half_header", false, [](std::mt19937_64&) { return Hello() + Header(Opcode::kGet, 1, 16).substr(0, 17); }},
      {"idle_after_hello", false, [](std::mt19937_64&) { return Hello(); }},
  };
}

class Chaos {
 public:
  Chaos(Context& c, Cluster& cl, NetworkClient& nc, ChaosReport* rep)
      : c_(c), cl_(cl), nc_(nc), rep_(rep), rng_(Mix(c.o.seed ^ 0xC4A05)) {}

  void Run() {
    const std::vector<void (Chaos::*)()> cycle = {&Chaos::KillRestart, &Chaos::Garbage, &Chaos::KillCoordinator,
                                                  &Chaos::Stall, &Chaos::Fill, &Chaos::Garbage};
    for (size_t e = 0; !c_.stop_chaos.load(); ++e) {
      (this->*cycle[e % cycle.size()])();
      Sleep(std::chrono::milliseconds(c_.o.chaos_gap_ms / 2 + rng_() % (c_.o.chaos_gap_ms + 1)));
    }
  }

 private:
  // Sleeps, checking the daemons every 100 ms; false when told to stop.
  bool Sleep(std::chrono::milliseconds d) {
    const auto end = SteadyClock::now() + d;
    while (SteadyClock::now() < end) {
      cl_.CheckExits(c_.st);
      if (c_.stop_chaos.load()) return false;
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
          100ms, std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()) + 1ms));
    }
    return true;
  }

  double RecentHitRate(size_t seconds) const {
    auto h = c_.HitRates();
    if (h.empty()) return 0;
    const size_t n = std::min(seconds, h.size());
    double sum = 0;
    for (size_t i = h.size() - n; i < h.size(); ++i) sum += h[i];
    return sum / static_cast<double>(n);
  }

  // Waits for every node listed and mapped and a probe round trip; records
  // the time since t0 or a violation.
  void AwaitServing(SteadyClock::time_point t0, const std::string& what) {
    const auto end = t0 + std::chrono::milliseconds(c_.o.recover_ms);
    while (SteadyClock::now() < end) {
      cl_.CheckExits(c_.st);
      if (cl_.LiveNodes() == static_cast<int>(cl_.size()) && nc_.num_nodes() == cl_.size() &&
          Probe(c_, nc_.router(), rng_())) {
        rep_->recover_ms.push_back(
            std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count());
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    c_.inv.Violation("recovery", "not serving " + std::to_string(c_.o.recover_ms) + " ms after " + what);
  }

  void KillRestart() {
    // Half the kills hit the node restarted last, while it is young: its
    // sequence ids are still close to those the next run hands out again.
    const size_t i = last_restarted_ >= 0 && rng_() % 2 == 0 ? static_cast<size_t>(last_restarted_)
                                                              : rng_() % cl_.size();
    const double baseline = RecentHitRate(3);
    // With replicas, blocks put while every node is up outlive one node's death.
    std::vector<BlockKey> kept;
    if (c_.o.replicas >= 2) kept = PutProbeBlocks(c_, nc_.router(), rng_());
    cl_.KillNode(i);
    c_.st.kills++;
    if (!kept.empty()) CheckKept(kept, cl_.node(i).id);
    Sleep(std::chrono::milliseconds(300 + rng_() % 1200));  // misses while it is down
    const auto t0 = SteadyClock::now();
    Status s = cl_.StartNode(i);
    if (!s.ok()) {
      c_.inv.Violation("restart", s.ToString());
      return;
    }
    c_.st.restarts++;
    last_restarted_ = static_cast<int>(i);
    AwaitServing(t0, "restarting " + cl_.node(i).id);
    // The hit rate comes back as the workload re-puts what the node lost.
    if (baseline < 0.05) return;
    const auto end = t0 + std::chrono::milliseconds(c_.o.hit_recover_ms);
    std::this_thread::sleep_for(1100ms);  // one fresh second of progress
    while (SteadyClock::now() < end) {
      if (RecentHitRate(1) >= 0.5 * baseline) {
        rep_->hit_recover_ms.push_back(std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count());
        return;
      }
      if (!Sleep(200ms)) return;
    }
    c_.inv.Violation("hit_recovery", "hit rate below half of " + std::to_string(baseline) + " for " +
                                         std::to_string(c_.o.hit_recover_ms) + " ms after restarting " +
                                         cl_.node(i).id);
  }

  // Every kept block must still be served, byte for byte, with `dead` down
  // (the client may first need one call to notice the dead node).
  void CheckKept(const std::vector<BlockKey>& keys, const std::string& dead) {
    size_t served = 0;
    for (int attempt = 0; attempt < 3 && served < keys.size(); ++attempt)
      served = ReadProbeBlocks(c_, nc_.router(), keys);
    c_.st.replica_checked += keys.size();
    c_.st.replica_served += served;
    if (served < keys.size())
      c_.inv.Violation("replica_failover", std::to_string(keys.size() - served) + " of " +
                                               std::to_string(keys.size()) + " blocks put with " +
                                               std::to_string(c_.o.replicas) + " replicas missed with only " +
                                               dead + " down");
  }

  // The data plane does not need the coordinator: while it is dead, clients
  // keep their last map and nodes keep serving (probe round trips must
  // succeed), and a new coordinator on the same address gets every node back.
  void KillCoordinator() {
    cl_.KillCoordinator();
    c_.st.coordinator_kills++;
    const auto down = SteadyClock::now();
    const auto up_at = down + std::chrono::milliseconds(600 + rng_() % 1400);
    uint64_t served = 0;
    while (SteadyClock::now() < up_at && !c_.stop_chaos.load()) {
      if (Probe(c_, nc_.router(), rng_())) ++served;
      if (!Sleep(100ms)) break;
    }
    c_.st.served_without_coordinator += served;
    if (served == 0 && !c_.stop_chaos.load())
      c_.inv.Violation("coordinator_down", "no probe round trip succeeded while the coordinator was down");
    const auto t0 = SteadyClock::now();
    Status s = cl_.RestartCoordinator();
    if (!s.ok()) {
      c_.inv.Violation("restart", s.ToString());
      return;
    }
    AwaitServing(t0, "restarting the coordinator");
  }

  void Stall() {
    const size_t i = rng_() % cl_.size();
    cl_.node(i).proc->Signal(SIGSTOP);
    c_.st.stalls++;
    // Longer than dead_after_ms half the time: the coordinator drops it, it re-registers.
    std::this_thread::sleep_for(std::chrono::milliseconds(400 + rng_() % 1400));
    cl_.node(i).proc->Signal(SIGCONT);
    AwaitServing(SteadyClock::now(), "a stall of " + cl_.node(i).id);
  }

  void Fill() {
    const size_t bb = nc_.router().model().FullBlockBytes();
    uint64_t per_node = ParseSize(c_.o.node_memory).value_or(0);
    if (!c_.o.node_host.empty()) per_node += ParseSize(c_.o.node_host).value_or(0);
    const size_t blocks = 2 * cl_.size() * per_node / bb;  // twice what the cluster holds
    std::vector<std::byte> data(64 * bb);
    RequestOptions ro;
    ro.priority = 0;
    c_.st.fills++;
    for (size_t done = 0; done < blocks && !c_.stop_chaos.load(); done += 64) {
      std::vector<PutItem> items;
      for (size_t i = 0; i < 64; ++i) {
        BlockKey k{rng_(), rng_()};
        auto d = std::span(data).subspan(i * bb, bb);
        Payload(k, c_.o.seed, d);
        items.push_back(PutItem{k, d, {}});
      }
      auto t0 = SteadyClock::now();
      Status s = nc_.router().PutBatch(items, ro);
      c_.Count(kFill, s, t0, {StatusCode::kBusy, StatusCode::kResourceExhausted, StatusCode::kStaleEpoch});
      c_.st.fill_blocks += items.size();
      cl_.CheckExits(c_.st);
    }
  }

  // A PUT whose payload does not match its checksum (a block torn on the
  // way) is refused for that item (DATA_LOSS), the connection stays, and the
  // block is never served.
  void CorruptPut(size_t i) {
    const size_t bb = nc_.router().model().FullBlockBytes();
    auto fd = ConnectTcp("127.0.0.1", cl_.node(i).data_port, SteadyClock::now() + 1s);
    if (!fd.ok()) return;
    c_.st.corrupt_puts++;
    rep_->garbage_by_kind["corrupt_payload"]++;
    const BlockKey key{rng_(), rng_()};
    std::string payload(bb, '\0');
    Payload(key, c_.o.seed, std::as_writable_bytes(std::span(payload)));
    proto::PutRecord rec;
    rec.key = key;
    rec.size = static_cast<uint32_t>(bb);
    rec.checksum = Checksum64(payload.data(), payload.size());
    payload[rng_() % bb] ^= 0x10;  // one bit flipped after the checksum was taken
    std::byte table[proto::kPutItemSize];
    proto::EncodePutRecord(rec, table);
    std::string body(reinterpret_cast<const char*>(table), sizeof(table));
    body += payload;
    const std::string bytes = Hello() + Header(Opcode::kPut, 1, static_cast<uint32_t>(body.size())) + body;
    (void)WriteAll(fd->get(), bytes.data(), bytes.size(), SteadyClock::now() + 1s);
    // Two answers: HELLO, then the PUT's one status byte.
    std::string what;
    for (int n = 0; n < 2 && what.empty(); ++n) {
      std::byte hb[proto::kHeaderSize];
      FrameHeader h;
      std::string answer;
      Status s = ReadFull(fd->get(), hb, sizeof(hb), 2000, {});
      if (s.ok()) s = proto::DecodeHeader(hb, proto::ProtocolLimits{}, &h);
      if (s.ok()) {
        answer.resize(h.body_len);
        if (h.body_len > 0) s = ReadFull(fd->get(), answer.data(), answer.size(), 2000, {});
      }
      if (!s.ok()) {
        what = "no answer: " + s.ToString();
      } else if (h.status != StatusCode::kOk) {
        what = "call answered " + std::string(StatusCodeName(h.status)) + ": " + answer;
      } else if (n == 1 && (answer.size() != 1 || answer[0] != static_cast<char>(StatusCode::kDataLoss))) {
        what = "the item was not refused with DATA_LOSS";
      }
    }
    if (!what.empty()) c_.inv.Violation("corrupt_block", cl_.node(i).id + ", PUT of a torn payload: " + what);
    else c_.st.corrupt_refused++;
    // Whatever the answer, the torn block must never be served.
    std::vector<std::byte> back(bb);
    GetItem it{key, back, 0, {}};
    auto t0 = SteadyClock::now();
    Status s = nc_.router().GetBatch(std::span(&it, 1));
    c_.Count(kProbe, s, t0);
    if (it.status.ok()) {
      c_.st.wrong_bytes++;
      c_.inv.Violation("wrong_bytes", "a torn PUT payload was stored and served by " + cl_.node(i).id);
    }
  }

  void Garbage() {
    const size_t i = rng_() % cl_.size();
    const uint16_t port = cl_.node(i).data_port;
    for (const BadConn& b : BadConns()) {
      auto fd = ConnectTcp("127.0.0.1", port, SteadyClock::now() + 1s);
      if (!fd.ok()) {
        c_.inv.Violation("malformed_frame", std::string("cannot connect to ") + cl_.node(i).id + " for " + b.kind +
                                                ": " + fd.status().ToString());
        continue;
      }
      c_.st.garbage_conns++;
      rep_->garbage_by_kind[b.kind]++;
      const std::string bytes = b.bytes(rng_);
      (void)WriteAll(fd->get(), bytes.data(), bytes.size(), SteadyClock::now() + 1s);
      if (b.must_close) {
        if (ClosedByPeer(fd->get(), 2s)) {
          c_.st.garbage_closed++;
        } else {
          c_.inv.Violation("malformed_frame", cl_.node(i).id + " kept a connection open 2 s after " + b.kind);
        }
      } else {
        std::this_thread::sleep_for(100ms);
      }
    }
    CorruptPut(i);
    cl_.CheckExits(c_.st);
  }

  Context& c_;
  Cluster& cl_;
  NetworkClient& nc_;
  ChaosReport* rep_;
  std::mt19937_64 rng_;
  int last_restarted_ = -1;
};

}  // namespace

void ChaosLoop(Context& c, Cluster& cluster, NetworkClient& client, ChaosReport* report) {
  Chaos(c, cluster, client, report).Run();
}

}  // namespace kvmesh::soak
