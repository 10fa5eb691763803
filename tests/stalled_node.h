// tests/stalled_node.h — a fake shard node on 127.0.0.1 that answers HELLO and
// then never answers anything, like a stalled (SIGSTOPped) process: for tests
// of call timeouts, fan-out and the RESP proxy. Loopback only, a port chosen
// by the kernel, its thread joined on destruction.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/protocol.h"
#include "transport/socket_util.h"

namespace kvmesh::testing {

// A node that answers HELLO and then never answers anything (a stalled process).
class StalledNode {
 public:
  StalledNode() {
    lfd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(lfd_, 8) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~StalledNode() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) ::close(fd);
    ::close(lfd_);
  }
  uint16_t port() const { return port_; }
  // Connections on which a request arrived after the HELLO.
  size_t ConnectionsWithRequests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

 private:
  void Run() {
    std::vector<char> sink(1 << 16);
    std::vector<bool> used;  // per fds_ entry
    while (!stop_) {
      std::vector<pollfd> pf{{lfd_, POLLIN, 0}};
      for (int fd : fds_) pf.push_back({fd, POLLIN, 0});
      if (::poll(pf.data(), pf.size(), 20) <= 0) continue;
      if (pf[0].revents & POLLIN) {
        int fd = ::accept(lfd_, nullptr, nullptr);
        if (fd >= 0 && Hello(fd)) fds_.push_back(fd), used.push_back(false);
      }
      for (size_t i = 1; i < pf.size(); ++i) {
        if (!pf[i].revents) continue;
        if (::recv(pf[i].fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0 && !used[i - 1]) {  // never answered
          used[i - 1] = true;
          std::lock_guard<std::mutex> lock(mu_);
          ++used_;
        }
      }
    }
  }
  static bool Hello(int fd) {
    proto::HeaderBytes hb;
    if (!ReadFull(fd, hb.data(), hb.size(), 1000, {}).ok()) return false;
    proto::FrameHeader h;
    if (!proto::DecodeHeader(hb, {}, &h).ok()) return false;
    std::vector<std::byte> body(h.body_len);
    if (!ReadFull(fd, body.data(), body.size(), 1000, {}).ok()) return false;
    proto::FrameHeader a;
    a.opcode = proto::Opcode::kHello;
    a.flags = proto::kFlagResponse;
    proto::HelloAnswer ans;
    ans.node_id = "stalled";
    std::string frame = proto::BuildFrame(a, proto::EncodeHelloAnswerBody(ans));
    return ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size());
  }

  int lfd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> fds_;  // used by the thread only (then by the destructor after join)
  mutable std::mutex mu_;
  size_t used_ = 0;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kvmesh::testing
