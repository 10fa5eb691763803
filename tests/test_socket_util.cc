// transport/socket_util over real loopback TCP: the listener, address
// resolution and the deadline-bounded read the TCP channel and the decode
// step group share.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "transport/socket_util.h"

using namespace kvmesh;
using namespace std::chrono_literals;
using SClock = std::chrono::steady_clock;

namespace {

// A connected pair over 127.0.0.1: the client end and the accepted end.
struct Pair {
  UniqueFd client, server;
};

Pair Connected() {
  auto sa = ResolveIpv4("127.0.0.1", 0);
  REQUIRE(sa.ok());
  auto ls = ListenTcp(&*sa, 4);
  REQUIRE(ls.ok());
  REQUIRE(ntohs(sa->sin_port) != 0);  // the kernel's port, reported back
  auto c = ConnectTcp("127.0.0.1", ntohs(sa->sin_port), SClock::now() + 2s);
  REQUIRE(c.ok());
  Pair p;
  p.client = std::move(*c);
  const auto until = SClock::now() + 2s;
  while (!p.server.valid() && SClock::now() < until) {
    p.server = UniqueFd(::accept4(ls->get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!p.server.valid()) std::this_thread::sleep_for(1ms);
  }
  REQUIRE(p.server.valid());
  return p;
}

}  // namespace

TEST_CASE("socket_util: ResolveIpv4 gives the address with the port, Ipv4String prints it back", "[socket]") {
  auto sa = ResolveIpv4("127.0.0.1", 7001);
  REQUIRE(sa.ok());
  CHECK(sa->sin_family == AF_INET);
  CHECK(ntohs(sa->sin_port) == 7001);
  CHECK(ntohl(sa->sin_addr.s_addr) == INADDR_LOOPBACK);
  CHECK(Ipv4String(sa->sin_addr.s_addr) == "127.0.0.1");
  auto local = ResolveIpv4("localhost", 80);
  REQUIRE(local.ok());
  CHECK(Ipv4String(local->sin_addr.s_addr).rfind("127.", 0) == 0);
}

TEST_CASE("socket_util: ListenTcp on a port already listened on is Unavailable naming the address", "[socket]") {
  auto sa = ResolveIpv4("127.0.0.1", 0);
  REQUIRE(sa.ok());
  auto first = ListenTcp(&*sa, 4);
  REQUIRE(first.ok());
  sockaddr_in again = *sa;
  auto second = ListenTcp(&again, 4);
  REQUIRE(!second.ok());
  CHECK(second.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(second.status().message(),
             Catch::Contains("bind 127.0.0.1:" + std::to_string(ntohs(sa->sin_port))));
}

TEST_CASE("socket_util: ReadFullUntil reads exactly n bytes that arrive in pieces", "[socket]") {
  Pair p = Connected();
  Status wrote;
  std::thread writer([&] {
    for (const char* piece : {"abc", "defg", "hij"}) {
      std::this_thread::sleep_for(20ms);
      if (wrote.ok()) wrote = WriteAll(p.server.get(), piece, std::strlen(piece), SClock::now() + 1s);
    }
  });
  std::string got(10, '\0');
  Status s = ReadFullUntil(p.client.get(), got.data(), got.size(), SClock::now() + 5s, "the writer");
  writer.join();
  REQUIRE(wrote.ok());
  REQUIRE(s.ok());
  CHECK(got == "abcdefghij");
}

TEST_CASE("socket_util: ReadFullUntil ends at the deadline when the peer sends too little", "[socket]") {
  Pair p = Connected();
  REQUIRE(WriteAll(p.server.get(), "xy", 2, SClock::now() + 1s).ok());
  char buf[8];
  const auto t0 = SClock::now();
  Status s = ReadFullUntil(p.client.get(), buf, sizeof buf, t0 + 200ms, "rank 9");
  const auto took = SClock::now() - t0;
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("no data from rank 9"));
  CHECK(took >= 190ms);
  CHECK(took < 2s);
}

TEST_CASE("socket_util: ReadFullUntil reports a peer that closes as Unavailable naming it", "[socket]") {
  Pair p = Connected();
  REQUIRE(WriteAll(p.server.get(), "xy", 2, SClock::now() + 1s).ok());
  p.server.reset();
  char buf[8];
  Status s = ReadFullUntil(p.client.get(), buf, sizeof buf, SClock::now() + 5s, "rank 3");
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::Contains("rank 3 closed the connection"));
  CHECK(PeerSocketError("send to", "rank 4", ECONNRESET).message() == PeerClosed("rank 4").message());
  CHECK_THAT(PeerSocketError("recv from", "rank 5", EHOSTUNREACH).message(), Catch::StartsWith("recv from rank 5: "));
}
