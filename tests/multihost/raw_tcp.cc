#include "raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/socket_util.h"

namespace kvmesh::multihost {
namespace {

using Clock = std::chrono::steady_clock;

// Blocking reads/writes on the sink side (each connection has its thread).
bool ReadAll(int fd, void* dst, size_t n) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool SendAll(int fd, const void* src, size_t n) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void Serve(UniqueFd fd) {
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char mode = 0;
  if (!ReadAll(fd.get(), &mode, 1)) return;
  std::vector<char> buf(1 << 20);
  for (;;) {
    uint32_t n = 0;
    if (!ReadAll(fd.get(), &n, 4) || n > (64u << 20)) return;
    if (n > buf.size()) buf.resize(n);
    if (mode == static_cast<char>(RawMode::kUpload)) {
      const char ack = 1;
      if (!ReadAll(fd.get(), buf.data(), n) || !SendAll(fd.get(), &ack, 1)) return;
    } else {
      if (!SendAll(fd.get(), buf.data(), n)) return;
    }
  }
}

}  // namespace

Status RunSink(const std::string& host, uint16_t port, const std::atomic<bool>* stop) {
  UniqueFd ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!ls.valid()) return IoError(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return InvalidArgument("bad IPv4 address " + host);
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls.get(), 64) != 0)
    return Unavailable("raw sink: listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(errno));
  socklen_t len = sizeof(a);
  ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&a), &len);
  std::printf("{\"event\":\"listening\",\"role\":\"raw_sink\",\"host\":\"%s\",\"port\":%u}\n", host.c_str(),
              ntohs(a.sin_port));
  std::fflush(stdout);
  while (!stop->load()) {
    pollfd p{ls.get(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) continue;
    std::thread(Serve, std::move(c)).detach();  // ends with its connection
  }
  return Status::Ok();
}

Result<RawResult> RawThroughput(const std::string& host, uint16_t port, RawMode mode, size_t block,
                                uint32_t connections, double seconds) {
  std::vector<std::thread> threads;
  std::mutex mu;
  RawResult total;
  Status first_error;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  for (uint32_t t = 0; t < connections; ++t) {
    threads.emplace_back([&] {
      auto fail = [&](const Status& s) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = s;
      };
      const auto deadline = [] { return Clock::now() + std::chrono::seconds(10); };
      auto c = ConnectTcp(host, port, deadline());
      if (!c.ok()) return fail(c.status());
      const int fd = c->get();
      SetNoDelay(fd);
      std::vector<char> buf(block, 'k');
      const char m = static_cast<char>(mode);
      if (Status s = WriteAll(fd, &m, 1, deadline()); !s.ok()) return fail(s);
      uint64_t bytes = 0, n = 0;
      const auto never = [] { return false; };
      const uint32_t size = static_cast<uint32_t>(block);
      while (Clock::now() < end) {
        Status s;
        if (mode == RawMode::kUpload) {  // size and block in one write, as a PUT frame goes
          std::vector<iovec> iov = {{const_cast<uint32_t*>(&size), 4}, {buf.data(), block}};
          char ack = 0;
          s = WriteAllV(fd, iov, deadline());
          if (s.ok()) s = ReadFull(fd, &ack, 1, 10000, never);
        } else {
          s = WriteAll(fd, &size, 4, deadline());
          if (s.ok()) s = ReadFull(fd, buf.data(), block, 10000, never);
        }
        if (!s.ok()) return fail(s);
        bytes += block;
        ++n;
      }
      std::lock_guard<std::mutex> lock(mu);
      total.bytes += bytes;
      total.exchanges += n;
    });
  }
  for (auto& t : threads) t.join();
  total.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!first_error.ok()) return first_error;
  return total;
}

}  // namespace kvmesh::multihost
