// TLS written once (transport/asio_tls.h, transport/openssl_util.h): every
// kvmesh server accepts through ServeAccepted, so each one drops a client
// that connects over TLS and never finishes the handshake, within its
// handshake timeout; and every TLS context loads its files with
// LoadTlsIdentity, so a file that does not load gives one error text naming
// the setting, the path and why. Servers run in process on 127.0.0.1 (ports
// chosen at run time) with certificates tests/make_test_certs.sh makes.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "test_pki.h"
#include "test_time.h"
#include "kvmesh/config.h"
#include "kvmesh/network.h"
#include "router/proxy/resp_proxy.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/server/resp_server.h"
#include "shard_node/shard_node.h"
#include "transport/asio_listener.h"
#include "transport/asio_tls.h"
#include "transport/fd_tls_client.h"
#include "transport/http_server.h"
#include "transport/socket_util.h"

using namespace kvmesh;
using namespace kvmesh::testing;  // Certs, ServerTls, TimeBound
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

// Connects to `port` and sends the first bytes of a TLS ClientHello (a
// handshake record header announcing 512 bytes, and 4 of them), then
// nothing: a client that began the handshake and never finishes it.
// Returns how long the server took to close the connection, or nothing when
// it was still open after `within`.
std::optional<std::chrono::milliseconds> StalledHandshake(uint16_t port, std::chrono::milliseconds within) {
  auto fd = ConnectTcp("127.0.0.1", port, SteadyClock::now() + 2s);
  REQUIRE(fd.ok());
  const auto t0 = SteadyClock::now();
  const unsigned char hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc};
  REQUIRE(::send(fd->get(), hello, sizeof hello, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof hello));
  char b[4096];
  while (SteadyClock::now() - t0 < within) {
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd->get(), b, sizeof b, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0);
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("TLS accept: the data port, the node's RESP front, the proxy and the HTTP server drop a client that never "
          "finishes the handshake, within the handshake timeout",
          "[cluster][security][tls][limits]") {
  const TlsConfig tls = ServerTls();
  auto server_ctx = MakeTlsServerContext(tls, /*require_client_cert=*/false);
  REQUIRE(server_ctx.ok());
  LimitsConfig limits;
  limits.handshake_timeout_ms = 600;

  auto cfg = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16},
    "nodes": [{"id": "n0", "memory": {"host": "16MiB"}}], "store": {"slot_bytes": "64KiB", "stripes": 2}})");
  REQUIRE(cfg.ok());
  auto node = ShardNode::Create(*cfg, "n0");
  REQUIRE(node.ok());
  std::atomic<uint64_t> epoch{0};

  DataServerOptions d;
  d.tls = *server_ctx;
  d.conn_limits = limits;
  auto data = DataServer::Start(node->get(), d, &epoch);
  REQUIRE(data.ok());

  RespServerOptions r;
  r.tls = tls;
  r.limits = limits;
  auto resp = RespServer::Start(node->get(), r);
  REQUIRE(resp.ok());

  ShardInfo info;
  info.id = "n0";
  info.host = "127.0.0.1";
  info.ports.data = (*data)->port();
  auto map = ShardMap::Build(1, {info}, {}, {}, 1);
  REQUIRE(map.ok());
  RespProxyOptions po;
  po.tls = tls;
  po.limits = limits;
  po.map = [m = *map] { return m; };
  auto proxy = RespProxy::Start(po);
  REQUIRE(proxy.ok());

  HttpServerOptions ho;
  ho.tls = *server_ctx;
  ho.handshake_timeout = 600ms;
  auto http = HttpServer::Start("127.0.0.1", 0, [](const HttpServerRequest&) { return HttpServerResponse{}; }, ho);
  REQUIRE(http.ok());

  // The servers count the drop as a failed handshake (and the fronts as a
  // timeout), once the handshake's coroutine has seen the close: wait for it.
  auto counted = [&](const std::string& name) {
    auto eventually = [](auto pred) {
      const auto until = SteadyClock::now() + TimeBound(2s);
      while (!pred() && SteadyClock::now() < until) std::this_thread::sleep_for(10ms);
      return pred();
    };
    if (name == "data port")
      CHECK(eventually([&] {
        return (*data)->MetricsText().find("kvmesh_tls_handshake_failures_total 1\n") != std::string::npos;
      }));
    if (name == "node RESP front") {
      CHECK(eventually([&] { return (*resp)->tls_failures() == 1; }));
      CHECK((*resp)->timeouts().handshake.load() == 1);
    }
    if (name == "proxy") {
      CHECK(eventually([&] { return (*proxy)->tls_failures() == 1; }));
      CHECK((*proxy)->timeouts().handshake.load() == 1);
    }
  };
  struct Port {
    const char* name;
    uint16_t port;
  };
  for (const Port& p : {Port{"data port", (*data)->port()}, Port{"node RESP front", (*resp)->port()},
                        Port{"proxy", (*proxy)->port()}, Port{"HTTP server", (*http)->port()}}) {
    DYNAMIC_SECTION(p.name) {
      const auto took = StalledHandshake(p.port, TimeBound(5s));
      INFO(p.name << ": closed after " << (took ? took->count() : -1) << " ms");
      REQUIRE(took);
      CHECK(*took >= 400ms);  // not before the timeout (less a little for the accept)
      CHECK(*took <= TimeBound(3s));
      counted(p.name);
    }
  }
  (*proxy)->Stop();
  (*resp)->Stop();
  (*data)->Stop();
  (*http)->Stop();
}

TEST_CASE("TLS identity: a file that does not load gives one error text, naming the setting, the path and why",
          "[security][tls]") {
  const std::string missing = "/nonexistent/kvmesh-" + std::to_string(::getpid()) + ".pem";
  const std::string want = "$.tls.cert: cannot load \"" + missing + "\": No such file or directory";
  TlsConfig t = ServerTls();
  t.cert = missing;
  // The Asio server and client contexts.
  auto server = MakeTlsServerContext(t, false);
  REQUIRE_FALSE(server.ok());
  CHECK(server.status().code() == StatusCode::kInvalidArgument);
  CHECK(server.status().message() == want);
  auto asio_client = MakeAsioTlsClientContext(t);
  REQUIRE_FALSE(asio_client.ok());
  CHECK(asio_client.status().message() == want);
  // The fd client, from $.tls (a node calling the coordinator, the proxy's stats).
  TlsClientOptions o;
  o.ca = t.ca;
  o.cert = missing;
  o.key = t.key;
  auto fd_client = TlsClientContext::Create(o);
  REQUIRE_FALSE(fd_client.ok());
  CHECK(fd_client.status().message() == want);
  // A NetworkClient names its own options.
  NetworkClientOptions n;
  n.coordinator = "127.0.0.1:1";
  n.tls_ca = missing;
  auto client = NetworkClient::Connect(n);
  REQUIRE_FALSE(client.ok());
  CHECK(client.status().message() == "tls_ca: cannot load \"" + missing + "\": No such file or directory");
  // A file that is there but is not what it should be: OpenSSL's reason.
  t = ServerTls();
  t.ca = Certs()("node.key");
  server = MakeTlsServerContext(t, false);
  REQUIRE_FALSE(server.ok());
  CHECK_THAT(server.status().message(), Catch::StartsWith("$.tls.ca: cannot load \"" + Certs()("node.key") + "\": "));
  CHECK(server.status().message().size() > ("$.tls.ca: cannot load \"" + Certs()("node.key") + "\": ").size());
}
