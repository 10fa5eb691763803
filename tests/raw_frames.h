// tests/raw_frames.h — a raw TCP connection to a node's data port for tests
// that send hand-made bytes: connect, build a HELLO frame, and see whether
// the server closed the connection.
#pragma once

#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "transport/protocol.h"
#include "transport/socket_util.h"

namespace kvmesh::testing {

// A connection to 127.0.0.1:port (REQUIREs it within 2 s).
inline UniqueFd Raw(uint16_t port) {
  auto fd = ConnectTcp("127.0.0.1", port, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  REQUIRE(fd.ok());
  return std::move(*fd);
}

// True when the server closed the connection (EOF or an error) within 2 s;
// answers that arrive meanwhile are drained.
inline bool ClosedByServer(int fd) {
  char buf[4096];
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < end) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return true;
    if (n < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A HELLO frame from client "raw" with `token`.
inline std::string HelloFrame(const std::string& token = "") {
  proto::Hello h;
  h.client_id = "raw";
  h.token = token;
  proto::FrameHeader fh;
  fh.opcode = proto::Opcode::kHello;
  return proto::BuildFrame(fh, proto::EncodeHelloBody(h));
}

}  // namespace kvmesh::testing
