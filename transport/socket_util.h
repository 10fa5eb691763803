// transport/socket_util.h — small POSIX socket helpers for the blocking-style
// clients (TCP channel, HTTP client, tests, benchmarks). Sockets are
// non-blocking; every wait is a poll() bounded by a deadline or a stall limit.
// errno is converted to Status here, at the edge.
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
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

// A non-blocking TCP connection to host:port (numeric or resolvable), or
// Unavailable / DeadlineExceeded.
Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, std::chrono::steady_clock::time_point deadline);

// Writes every byte of iov (modified in place) before the deadline.
Status WriteAllV(int fd, std::vector<iovec>& iov, std::chrono::steady_clock::time_point deadline);
Status WriteAll(int fd, const void* data, size_t n, std::chrono::steady_clock::time_point deadline);

// Reads exactly n bytes. stall_ms >= 0: fail when no byte arrives for that
// long; < 0: wait indefinitely, polling `stop` every 100 ms.
Status ReadFull(int fd, void* dst, size_t n, int64_t stall_ms, const std::function<bool()>& stop);

void SetNoDelay(int fd);

// "host:port" -> parts. InvalidArgument when malformed.
Status SplitHostPort(const std::string& addr, std::string* host, uint16_t* port);

}  // namespace kvmesh
