#include "transport/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace kvmesh {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

int MsLeft(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

Result<sockaddr_in> ResolveIpv4(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) return Unavailable("cannot resolve " + host + ": " + gai_strerror(rc));
  sockaddr_in sa{};
  std::memcpy(&sa, res->ai_addr, sizeof sa);
  ::freeaddrinfo(res);
  sa.sin_port = htons(port);
  return sa;
}

std::string Ipv4String(uint32_t ip) {
  in_addr a{};
  a.s_addr = ip;
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, Clock::time_point deadline) {
  KVMESH_ASSIGN_OR_RETURN(sockaddr_in sa, ResolveIpv4(host, port));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
  const std::string addr = host + ":" + std::to_string(port);
  if (rc != 0 && errno != EINPROGRESS) return Unavailable("connect " + addr + ": " + std::strerror(errno));
  if (rc != 0) {
    pollfd p{fd.get(), POLLOUT, 0};
    int n = ::poll(&p, 1, MsLeft(deadline));
    if (n == 0) return DeadlineExceeded("connect " + addr + ": timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (n < 0 || err != 0) return Unavailable("connect " + addr + ": " + std::strerror(n < 0 ? errno : err));
  }
  return fd;
}

Result<UniqueFd> ListenTcp(sockaddr_in* addr, int backlog) {
  UniqueFd ls(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!ls.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const std::string want = Ipv4String(addr->sin_addr.s_addr) + ":" + std::to_string(ntohs(addr->sin_port));
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(addr), sizeof *addr) != 0)
    return Unavailable("bind " + want + ": " + std::strerror(errno));
  if (::listen(ls.get(), backlog) != 0) return ErrnoStatus("listen " + want, errno);
  socklen_t len = sizeof *addr;
  if (::getsockname(ls.get(), reinterpret_cast<sockaddr*>(addr), &len) != 0) return ErrnoStatus("getsockname", errno);
  return ls;
}

Status WriteAllV(int fd, std::vector<iovec>& iov, Clock::time_point deadline) {
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);  // waits in poll, blocking socket or not
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Unavailable(std::string("send: ") + std::strerror(errno));
      pollfd p{fd, POLLOUT, 0};
      int left = MsLeft(deadline);
      if (left == 0 || ::poll(&p, 1, left) == 0) return DeadlineExceeded("send timed out");
      continue;
    }
    size_t done = static_cast<size_t>(n);
    while (done > 0 && first < iov.size()) {
      size_t take = std::min(done, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      done -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return Status::Ok();
}

Status WriteAll(int fd, const void* data, size_t n, Clock::time_point deadline) {
  std::vector<iovec> iov{{const_cast<void*>(data), n}};
  return WriteAllV(fd, iov, deadline);
}

namespace {

// While a large read waits, the socket's SO_RCVLOWAT is what is still
// missing, so the kernel wakes the reader once when the rest has arrived
// instead of once per segment (on loopback a 256 KiB body is several
// wake-ups, each a context switch). The kernel caps the value at half its
// largest receive buffer and grows the buffer to fit, so it cannot stall the
// stream. Restored to 1 when the read ends: the next frame's header wakes at once.
constexpr size_t kLowatFrom = 32 * 1024;

class RcvLowat {
 public:
  explicit RcvLowat(int fd) : fd_(fd) {}
  ~RcvLowat() {
    if (set_) Set(1);
  }
  void Want(size_t missing) {
    if (missing < kLowatFrom) return;
    Set(static_cast<int>(std::min<size_t>(missing, INT32_MAX / 2)));
    set_ = true;
  }

 private:
  void Set(int v) { ::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)); }
  int fd_;
  bool set_ = false;
};

}  // namespace

Status ReadFull(int fd, void* dst, size_t n, int64_t stall_ms, const std::function<bool()>& stop) {
  size_t got = 0;
  return ReadAtLeast(fd, dst, n, n, stall_ms, stop, &got);
}

Status ReadAtLeast(int fd, void* dst, size_t min, size_t cap, int64_t stall_ms, const std::function<bool()>& stop,
                   size_t* got_out) {
  char* p = static_cast<char*>(dst);
  size_t& got = *got_out;
  got = 0;
  int64_t waited = 0;
  RcvLowat lowat(fd);
  while (got < min) {
    ssize_t r = ::recv(fd, p + got, cap - got, MSG_DONTWAIT);  // waits in poll, blocking socket or not
    if (r > 0) {
      got += static_cast<size_t>(r);
      waited = 0;
      continue;
    }
    if (r == 0) return Unavailable("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Unavailable(std::string("recv: ") + std::strerror(errno));
    if (stop && stop()) return Unavailable("connection closed");
    lowat.Want(min - got);
    pollfd pf{fd, POLLIN, 0};
    const int slice = stall_ms >= 0 ? static_cast<int>(std::min<int64_t>(100, std::max<int64_t>(1, stall_ms - waited))) : 100;
    int pr = ::poll(&pf, 1, slice);
    if (pr == 0) {
      waited += slice;
      if (stall_ms >= 0 && waited >= stall_ms) return DeadlineExceeded("peer stalled mid-frame");
    }
  }
  return Status::Ok();
}

Status ReadFullUntil(int fd, void* dst, size_t n, Clock::time_point deadline, std::string_view peer) {
  char* p = static_cast<char*>(dst);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return PeerClosed(peer);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return PeerSocketError("recv from", peer, errno);
    pollfd pf{fd, POLLIN, 0};
    const int left = MsLeft(deadline);
    if (left == 0) return DeadlineExceeded("no data from " + std::string(peer) + " within the timeout");
    ::poll(&pf, 1, left);
  }
  return Status::Ok();
}

Status PeerClosed(std::string_view peer) {
  return Unavailable(std::string(peer) + " closed the connection (process exited or died)");
}

Status PeerSocketError(std::string_view what, std::string_view peer, int err) {
  if (err == EPIPE || err == ECONNRESET) return PeerClosed(peer);
  return Unavailable(std::string(what) + " " + std::string(peer) + ": " + std::strerror(err));
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status SplitHostPort(const std::string& addr, std::string* host, uint16_t* port) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    return InvalidArgument("expected host:port, got \"" + addr + "\"");
  unsigned long p = 0;
  try {
    size_t used = 0;
    p = std::stoul(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1 || p == 0 || p > 65535) throw std::out_of_range("port");
  } catch (...) {
    return InvalidArgument("bad port in \"" + addr + "\"");
  }
  *host = addr.substr(0, colon);
  *port = static_cast<uint16_t>(p);
  return Status::Ok();
}

}  // namespace kvmesh
