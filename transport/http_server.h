// transport/http_server.h — a small HTTP/1.1 server (Boost.Beast) for the
// daemons' control surfaces: /metrics and /healthz on nodes, the control API
// on the coordinator; HTTPS when given a TLS context (transport/asio_tls.h).
// Handlers run on the server's own I/O thread and must not block.
//
// A request is read in two steps (docs/security.md, "Resource limits"):
//  1. its head (request line and fields, at most kHttpMaxHeaderBytes). The
//     framing is checked first: a Transfer-Encoding other than exactly
//     "chunked" (e.g. "chunked, identity", "gzip, chunked", two of them, or
//     one with a Content-Length) is refused (400, 501 for a coding it does
//     not implement) and the connection closed. Then the owner's head check
//     (HttpServerOptions::head_check) decides on the head alone: it refuses
//     (credentials: 401/403) or names the route's body limit. A body larger
//     than that limit is refused at its Content-Length (413), a chunked one
//     at the first chunk past it. Refusing a request that announced a body
//     closes the connection after the answer, without reading that body (at
//     most kHttpDrainBytes are discarded, for at most kHttpDrainTimeout, so
//     the client reads the answer instead of a reset). An admitted request
//     that sent `Expect: 100-continue` gets its 100 then.
//  2. its body, within that limit. Trailer fields of a chunked body are
//     refused (400): a request's meaning, its credentials included, is its
//     head and its body; HttpServerRequest::authorization is always the
//     head's.
// Idle connections, slow heads, slow bodies and handshakes time out; at most
// kHttpMaxConnections connections are served at once (more are closed at
// accept).
//
// Thread-safety: Start/Stop from one thread; the handler and the head check
// are called from the server thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kvmesh/status.h"

namespace boost::asio::ssl {
class context;
}

namespace kvmesh {

// The server's own bounds (per server, i.e. per port).
inline constexpr size_t kHttpMaxHeaderBytes = 8 << 10;       // request line and fields
inline constexpr uint64_t kHttpMaxBodyBytes = 1 << 20;       // any route, and the limit without a head check
inline constexpr size_t kHttpMaxConnections = 512;           // served at once; more are closed at accept
inline constexpr std::chrono::seconds kHttpHeadTimeout{30};  // an idle keep-alive connection, or a slow head
inline constexpr std::chrono::seconds kHttpBodyTimeout{30};  // the whole body, once the head is admitted
inline constexpr uint64_t kHttpDrainBytes = 1 << 20;         // discarded after refusing a request with a body
inline constexpr std::chrono::seconds kHttpDrainTimeout{1};
inline constexpr std::chrono::milliseconds kHttpHandshakeTimeout{10000};  // accept to the end of the TLS handshake

struct HttpServerRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/map?x=1"
  std::string body;    // "" in a head check
  std::string authorization;  // the head's Authorization field ("" when absent); never a trailer's
  std::string peer;           // the client's "address:port"
  bool client_cert = false;   // HTTPS: the client showed a certificate the cluster CA signed
};

struct HttpServerResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string www_authenticate;  // sent as WWW-Authenticate when non-empty (401 answers)
};

using HttpHandler = std::function<HttpServerResponse(const HttpServerRequest&)>;

// What a server's owner decides from a request's head, before its body is read.
struct HttpHeadDecision {
  std::optional<HttpServerResponse> refuse;  // answered at once; the body is never read
  uint64_t max_body_bytes = kHttpMaxBodyBytes;  // this route's limit (capped at kHttpMaxBodyBytes); 0: no body
};
using HttpHeadCheck = std::function<HttpHeadDecision(const HttpServerRequest& head)>;

// HTTPS: the server context ($.tls; MakeTlsServerContext). nullptr: plain HTTP.
using HttpTls = std::shared_ptr<boost::asio::ssl::context>;

struct HttpServerOptions {
  HttpTls tls;                // nullptr: plain HTTP
  HttpHeadCheck head_check;   // nullptr: every head admitted, bodies up to kHttpMaxBodyBytes
  // HTTPS: a client that has not finished the TLS handshake this long after
  // it connected is dropped (ServeAccepted, transport/asio_tls.h).
  std::chrono::milliseconds handshake_timeout = kHttpHandshakeTimeout;
};

class HttpServer {
 public:
  // Binds host:port (0 = a free port) and starts serving on one thread.
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& host, uint16_t port, HttpHandler handler,
                                                   HttpServerOptions options);
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& host, uint16_t port, HttpHandler handler,
                                                   HttpTls tls = nullptr) {
    return Start(host, port, std::move(handler), HttpServerOptions{std::move(tls), nullptr});
  }
  virtual ~HttpServer() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, closes connections and joins the thread. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace kvmesh
