// transport/http_server.h — a small HTTP/1.1 server (Boost.Beast) for the
// daemons' control surfaces: /metrics and /healthz on nodes, the control API
// on the coordinator; HTTPS when given a TLS context (transport/tls_server.h).
// Handlers run on the server's own I/O thread and must not block; requests
// bodies are capped at 1 MiB, idle connections (and handshakes) time out.
//
// Thread-safety: Start/Stop from one thread; the handler is called from the
// server thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvmesh/status.h"

namespace boost::asio::ssl {
class context;
}

namespace kvmesh {

struct HttpServerRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/map?x=1"
  std::string body;
  std::string authorization;  // the Authorization header ("" when absent)
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

// HTTPS: the server context ($.tls; MakeTlsServerContext). nullptr: plain HTTP.
using HttpTls = std::shared_ptr<boost::asio::ssl::context>;

class HttpServer {
 public:
  // Binds host:port (0 = a free port) and starts serving on one thread.
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& host, uint16_t port, HttpHandler handler,
                                                   HttpTls tls = nullptr);
  virtual ~HttpServer() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting, closes connections and joins the thread. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace kvmesh
