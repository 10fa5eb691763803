// The rendezvous of the TCP step group: rank 0 collects the hellos and hands
// out the mesh addresses, every pair of ranks connects, rank 0 confirms (see
// comm_tcp.h "Rendezvous" for the protocol, comm_tcp_rendezvous.h for the
// contract).
#include "coordinator/decode/comm_tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "coordinator/decode/comm_tcp_frame.h"

namespace kvmesh::decode::tcp_step {
namespace {

using std::chrono::milliseconds;

// A rank's mesh listener as the others connect to it (port 0: it has none).
struct PeerAddr {
  uint32_t ip = 0;  // in_addr_t, network byte order
  uint32_t port = 0;
};

uint64_t NewGroupId() {
  uint64_t g = 0;
  if (::getrandom(&g, sizeof g, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof g))
    g = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (uint64_t(::getpid()) << 40);
  return g;
}

Status WriteRendezvousFile(const std::string& path, const std::string& addr) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << addr << "\n";
    f.flush();
    if (!f) return IoError("cannot write rendezvous file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return ErrnoStatus("rename " + tmp + " -> " + path, errno);
  }
  return Status::Ok();
}

// "host:port" from a complete rendezvous file (one that ends in a newline).
bool ReadRendezvousFile(const std::string& path, std::string* addr) {
  std::ifstream f(path);
  if (!f) return false;
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.empty() || s.back() != '\n') return false;
  s.pop_back();
  *addr = s;
  return true;
}

// Rank 0: every rank's ready frame (its links are up). A rank that could not
// link up sends an abort instead, which fails the rendezvous at once.
Status WaitReady(std::vector<UniqueFd>& peers, Clock::time_point deadline, milliseconds timeout) {
  std::vector<pollfd> pf;
  std::vector<int> who;
  std::vector<bool> ready(peers.size(), false);
  ready[0] = true;
  for (;;) {
    pf.clear();
    who.clear();
    for (size_t r = 1; r < peers.size(); ++r) {
      if (ready[r]) continue;
      pf.push_back(pollfd{peers[r].get(), POLLIN, 0});
      who.push_back(static_cast<int>(r));
    }
    if (pf.empty()) return Status::Ok();
    const int n = ::poll(pf.data(), pf.size(), MsLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string missing;
      for (int r : who) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return DeadlineExceeded("tcp step rendezvous: ranks " + missing + " did not connect to their peers within " +
                              std::to_string(timeout.count()) + " ms");
    }
    for (size_t i = 0; i < pf.size(); ++i) {
      if (pf[i].revents == 0) continue;
      std::vector<std::byte> none;
      KVMESH_RETURN_IF_ERROR(RecvFrame(pf[i].fd, Header{Op::kReady, 0, 0, 0, 0}, &none, deadline, RankName(who[i])));
      ready[static_cast<size_t>(who[i])] = true;
    }
  }
}

Result<std::vector<UniqueFd>> Listen(const TcpCommOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  KVMESH_ASSIGN_OR_RETURN(sockaddr_in sa, ResolveIpv4(o.host, o.port));
  Result<UniqueFd> listening = ListenTcp(&sa, o.size + 8);
  if (!listening.ok()) return listening.status().WithContext("tcp step rendezvous");
  UniqueFd ls = std::move(*listening);
  const std::string addr = o.host + ":" + std::to_string(ntohs(sa.sin_port));
  struct FileGuard {  // the file names this run only while it is joining
    std::string path;
    ~FileGuard() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } guard;
  if (!o.rendezvous_file.empty()) {
    KVMESH_RETURN_IF_ERROR(WriteRendezvousFile(o.rendezvous_file, addr));
    guard.path = o.rendezvous_file;
  }

  std::vector<UniqueFd> peers(static_cast<size_t>(o.size));
  std::vector<PeerAddr> addrs(static_cast<size_t>(o.size));
  auto fail = [&](Status s) {  // tell the ranks that did join
    const auto until = Clock::now() + kAbortWait;
    for (int r = 1; r < o.size; ++r)
      if (peers[r].valid()) SendAbort(peers[r].get(), s, 0, until, RankName(r));
    return s;
  };
  int joined = 1;
  while (joined < o.size) {
    pollfd p{ls.get(), POLLIN, 0};
    const int left = MsLeft(deadline);
    if (left == 0 || ::poll(&p, 1, left) == 0) {
      std::string missing;
      for (int r = 1; r < o.size; ++r)
        if (!peers[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return fail(DeadlineExceeded("tcp step rendezvous on " + addr + ": " + std::to_string(joined) + " of " +
                                   std::to_string(o.size) + " ranks joined within " +
                                   std::to_string(o.connect_timeout.count()) + " ms (missing: " + missing + ")"));
    }
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) continue;
    SetNoDelay(c.get());
    // A hello must follow the connect at once; a silent or foreign
    // connection is dropped without failing the rendezvous.
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    std::vector<std::byte> hello;
    Status s = RecvFrame(c.get(), Header{Op::kHello, 0, 0, kHelloBytes, 0}, &hello, hello_deadline, "a joining rank");
    if (!s.ok()) continue;
    const int r = static_cast<int>(GetLe(&hello[0], 4));
    const int n = static_cast<int>(GetLe(&hello[4], 4));
    std::string refuse;
    if (n != o.size) refuse = "world size " + std::to_string(n) + " differs from rank 0's " + std::to_string(o.size);
    else if (r < 1 || r >= o.size) refuse = "rank " + std::to_string(r) + " out of [1, " + std::to_string(o.size) + ")";
    else if (peers[r].valid()) refuse = "rank " + std::to_string(r) + " has already joined";
    if (!refuse.empty()) {
      SendAbort(c.get(), InvalidArgument(refuse), 0, Clock::now() + kAbortWait, "a joining rank");
      continue;
    }
    addrs[r] = PeerAddr{static_cast<uint32_t>(GetLe(&hello[8], 4)), static_cast<uint32_t>(GetLe(&hello[12], 4))};
    peers[r] = std::move(c);
    ++joined;
  }
  // Every rank gets every rank's listener and the group id; rank r connects
  // to ranks 1..r-1 and accepts r+1..N-1, then reports ready.
  std::vector<std::byte> welcome(8 + 8 * static_cast<size_t>(o.size));
  PutLe(&welcome[0], NewGroupId(), 8);
  for (int r = 0; r < o.size; ++r) {
    PutLe(&welcome[8 + 8 * r], addrs[r].ip, 4);
    PutLe(&welcome[12 + 8 * r], addrs[r].port, 4);
  }
  for (int r = 1; r < o.size; ++r) {
    Status s = SendFrame(peers[r].get(), Header{Op::kWelcome, 0, 0, 0, 0}, welcome, deadline, RankName(r));
    if (!s.ok()) return fail(s.WithContext("tcp step rendezvous"));
  }
  if (Status s = WaitReady(peers, deadline, o.connect_timeout); !s.ok())
    return fail(s.WithContext("tcp step rendezvous, rank 0"));
  for (int r = 1; r < o.size; ++r)
    KVMESH_RETURN_IF_ERROR(SendFrame(peers[r].get(), Header{Op::kReady, 0, 0, 0, 0}, {}, deadline, RankName(r)));
  return peers;
}

// Rank r > 0, after the welcome: connects to ranks 1..r-1 (links[0], to rank
// 0, is already up), accepts ranks r+1..N-1 on `ls`, and watches rank 0 for
// an abort meanwhile.
Status LinkUp(const TcpCommOptions& o, uint64_t group, const std::vector<PeerAddr>& addrs, const UniqueFd& ls,
              std::vector<UniqueFd>& links, Clock::time_point deadline) {
  std::array<std::byte, kPeerHelloBytes> hello;
  PutLe(&hello[0], group, 8);
  PutLe(&hello[8], static_cast<uint32_t>(o.rank), 4);
  PutLe(&hello[12], static_cast<uint32_t>(o.size), 4);
  // Connecting never waits for the lower rank to accept (the kernel's backlog
  // completes the handshake), so every rank connects first, then accepts.
  for (int k = 1; k < o.rank; ++k) {
    const std::string at = RankName(k) + " at " + Ipv4String(addrs[k].ip) + ":" + std::to_string(addrs[k].port);
    auto c = ConnectTcp(Ipv4String(addrs[k].ip), static_cast<uint16_t>(addrs[k].port), deadline);
    if (!c.ok()) return c.status().WithContext("connecting to " + at);
    SetNoDelay(c->get());
    KVMESH_RETURN_IF_ERROR(SendFrame(c->get(), Header{Op::kPeerHello, 0, 0, 0, 0}, hello, deadline, at));
    links[k] = std::move(*c);
  }
  int missing = o.size - 1 - o.rank;
  while (missing > 0) {
    std::array<pollfd, 2> pf{pollfd{ls.get(), POLLIN, 0}, pollfd{links[0].get(), POLLIN, 0}};
    const int n = ::poll(pf.data(), pf.size(), MsLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string who;
      for (int k = o.rank + 1; k < o.size; ++k)
        if (!links[k].valid()) who += (who.empty() ? "" : ", ") + std::to_string(k);
      return DeadlineExceeded("ranks " + who + " did not connect to rank " + std::to_string(o.rank) + " within " +
                              std::to_string(o.connect_timeout.count()) + " ms");
    }
    if (pf[1].revents != 0) {  // before our ready, rank 0 sends nothing but an abort
      std::vector<std::byte> none;
      Status s = RecvFrame(links[0].get(), Header{Op::kAbort, 0, 0, 0, 0}, &none, deadline, RankName(0));
      return s.ok() ? Internal("rank 0 sent an unexpected frame during the rendezvous") : s;
    }
    if (pf[0].revents == 0) continue;
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) continue;
    // A silent or foreign connection (another group, a port scanner) is dropped.
    std::vector<std::byte> in;
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    if (!RecvFrame(c.get(), Header{Op::kPeerHello, 0, 0, kPeerHelloBytes, 0}, &in, hello_deadline, "a connecting rank")
             .ok())
      continue;
    const int k = static_cast<int>(GetLe(&in[8], 4));
    if (GetLe(&in[0], 8) != group || GetLe(&in[12], 4) != static_cast<uint64_t>(o.size) || k <= o.rank || k >= o.size ||
        links[k].valid())
      continue;
    SetNoDelay(c.get());
    links[k] = std::move(c);
    --missing;
  }
  return Status::Ok();
}

Result<std::vector<UniqueFd>> Join(const TcpCommOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  Status last = DeadlineExceeded("nothing tried");
  UniqueFd c;
  std::string addr;
  while (!c.valid()) {
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("tcp step rendezvous: rank " + std::to_string(o.rank) + " could not reach rank 0 within " +
                              std::to_string(o.connect_timeout.count()) + " ms (" + last.ToString() + ")");
    }
    std::string host = o.host;
    uint16_t port = o.port;
    if (port == 0) {
      if (!ReadRendezvousFile(o.rendezvous_file, &addr)) {
        last = NotFound("rendezvous file " + o.rendezvous_file + " not written yet");
        std::this_thread::sleep_for(milliseconds(20));
        continue;
      }
      Status s = SplitHostPort(addr, &host, &port);
      if (!s.ok()) return s.WithContext("rendezvous file " + o.rendezvous_file);
    }
    auto r = ConnectTcp(host, port, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
    if (!r.ok()) {  // rank 0 not listening yet (or a stale file): retry
      last = r.status();
      std::this_thread::sleep_for(milliseconds(50));
      continue;
    }
    c = std::move(*r);
    addr = host + ":" + std::to_string(port);
  }
  SetNoDelay(c.get());
  const std::string zero = "rank 0 at " + addr;
  const std::string ctx = "tcp step rendezvous, rank " + std::to_string(o.rank);
  // The mesh listener, on this host's address towards rank 0 (the last rank
  // only connects, so it has none).
  UniqueFd ls;
  PeerAddr mine;
  if (o.rank < o.size - 1) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    if (::getsockname(c.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) return ErrnoStatus("getsockname", errno);
    sa.sin_port = 0;
    auto l = ListenTcp(&sa, o.size + 8);
    if (!l.ok()) return l.status().WithContext(ctx);
    ls = std::move(*l);
    mine = PeerAddr{sa.sin_addr.s_addr, ntohs(sa.sin_port)};
  }
  std::array<std::byte, kHelloBytes> hello;
  PutLe(&hello[0], static_cast<uint32_t>(o.rank), 4);
  PutLe(&hello[4], static_cast<uint32_t>(o.size), 4);
  PutLe(&hello[8], mine.ip, 4);
  PutLe(&hello[12], mine.port, 4);
  KVMESH_RETURN_IF_ERROR(SendFrame(c.get(), Header{Op::kHello, 0, 0, 0, 0}, hello, deadline, zero));
  std::vector<std::byte> welcome;
  const Header want{Op::kWelcome, 0, 0, 8 + 8 * static_cast<uint64_t>(o.size), 0};
  if (Status s = RecvFrame(c.get(), want, &welcome, deadline, zero); !s.ok()) return s.WithContext(ctx);
  std::vector<PeerAddr> addrs(static_cast<size_t>(o.size));
  for (int r = 0; r < o.size; ++r)
    addrs[r] = PeerAddr{static_cast<uint32_t>(GetLe(&welcome[8 + 8 * r], 4)),
                        static_cast<uint32_t>(GetLe(&welcome[12 + 8 * r], 4))};
  std::vector<UniqueFd> links(static_cast<size_t>(o.size));
  links[0] = std::move(c);
  if (Status s = LinkUp(o, GetLe(&welcome[0], 8), addrs, ls, links, deadline); !s.ok()) {
    s = s.WithContext(ctx);
    if (s.message().find("rank 0 aborted") == std::string::npos)  // tell rank 0, which tells the others
      SendAbort(links[0].get(), s, 0, Clock::now() + kAbortWait, zero);
    return s;
  }
  KVMESH_RETURN_IF_ERROR(SendFrame(links[0].get(), Header{Op::kReady, 0, 0, 0, 0}, {}, deadline, zero));
  std::vector<std::byte> none;
  if (Status s = RecvFrame(links[0].get(), Header{Op::kReady, 0, 0, 0, 0}, &none, deadline, zero); !s.ok())
    return s.WithContext(ctx);
  return links;
}

}  // namespace

Result<std::vector<UniqueFd>> ConnectMesh(const TcpCommOptions& o) {
  return o.rank == 0 ? Listen(o) : Join(o);
}

}  // namespace kvmesh::decode::tcp_step
