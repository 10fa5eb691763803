// transport/socket_util.h — small POSIX socket helpers for the blocking-style
// clients (TCP channel, HTTP client, the decode step group's TCP transport,
// tests, benchmarks). Sockets are non-blocking; every wait is a poll()
// bounded by a deadline or a stall limit. errno is converted to Status here,
// at the edge. IPv4 only.
//
// Thread-safety: the functions keep no state; a socket is used by one
// caller at a time.
#pragma once

#include <netinet/in.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"

namespace kvmesh {

// An owned file descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Milliseconds from now until `deadline`, clamped to [0, INT_MAX]: a poll()
// timeout (0 once the deadline has passed).
int MsLeft(std::chrono::steady_clock::time_point deadline);

// `host` (numeric or resolvable, IPv4) with `port`, or Unavailable
// ("cannot resolve ..."). Takes the first address the resolver gives.
Result<sockaddr_in> ResolveIpv4(const std::string& host, uint16_t port);
// An IPv4 address in network byte order, dotted ("127.0.0.1").
std::string Ipv4String(uint32_t ip);

// A non-blocking TCP connection to host:port (numeric or resolvable), or
// Unavailable / DeadlineExceeded.
Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, std::chrono::steady_clock::time_point deadline);

// A non-blocking listening socket (SO_REUSEADDR) bound to *addr; *addr then
// holds the bound port (port 0: one the kernel chose). Errors: Unavailable
// when the address cannot be bound ("bind ip:port: ..."), else the errno of
// socket / listen / getsockname.
Result<UniqueFd> ListenTcp(sockaddr_in* addr, int backlog);

// Writes every byte of iov (modified in place) before the deadline. Like
// ReadFull and ReadAtLeast, it never blocks in the call itself (MSG_DONTWAIT)
// and waits in poll, so it keeps its bounds on a blocking socket too.
Status WriteAllV(int fd, std::vector<iovec>& iov, std::chrono::steady_clock::time_point deadline);
Status WriteAll(int fd, const void* data, size_t n, std::chrono::steady_clock::time_point deadline);

// Reads exactly n bytes. stall_ms >= 0: fail when no byte arrives for that
// long; < 0: wait indefinitely, polling `stop` every 100 ms.
Status ReadFull(int fd, void* dst, size_t n, int64_t stall_ms, const std::function<bool()>& stop);
// Reads at least `min` and at most `cap` bytes into dst (*got: how many),
// with ReadFull's stall and stop rules: one recv of up to `cap` bytes takes
// what a short read needs and whatever follows it in the socket.
Status ReadAtLeast(int fd, void* dst, size_t min, size_t cap, int64_t stall_ms, const std::function<bool()>& stop,
                   size_t* got);

// Reads exactly n bytes before `deadline` (a bound on the whole read, however
// steadily bytes arrive). Errors name `peer` (e.g. "rank 2", "the node"):
// PeerClosed at end of stream, PeerSocketError("recv from", ...) when recv
// fails, DeadlineExceeded ("no data from <peer> within the timeout") when the
// last byte has not arrived by the deadline. On error, part of dst may be
// written.
Status ReadFullUntil(int fd, void* dst, size_t n, std::chrono::steady_clock::time_point deadline,
                     std::string_view peer);

// Unavailable: "<peer> closed the connection (process exited or died)".
Status PeerClosed(std::string_view peer);
// The Status of a send / recv on a connection to `peer` that failed with
// errno `err`: a reset or a broken pipe is PeerClosed, anything else
// Unavailable ("<what> <peer>: <strerror>").
Status PeerSocketError(std::string_view what, std::string_view peer, int err);

void SetNoDelay(int fd);

// "host:port" -> parts. InvalidArgument when malformed.
Status SplitHostPort(const std::string& addr, std::string* host, uint16_t* port);

}  // namespace kvmesh
