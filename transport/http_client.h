// transport/http_client.h — a minimal blocking HTTP/1.1 client for the control
// plane (nodes register and heartbeat with the coordinator; routers fetch the
// shard map). One request per connection (Connection: close), bounded by a
// timeout, body capped at 16 MiB (Content-Length or chunked), over TLS when given a client context
// (transport/fd_tls_client.h). Not for the data plane.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvmesh/status.h"

namespace kvmesh {

struct HttpResult {
  int status = 0;
  std::string body;
};

class TlsClientContext;

struct HttpRequestOptions {
  // The Authorization header's value ("" = none): BearerAuthorization(secret)
  // or BasicAuthorization(tenant, token) from common/credentials.h.
  std::string authorization;
  // HTTPS: the server's certificate is verified with it (nullptr: plain HTTP).
  std::shared_ptr<const TlsClientContext> tls;
};

// method "GET" or "POST"; target like "/map". Unavailable / DeadlineExceeded
// when the server cannot be reached or answer in time; any HTTP status is OK.
Result<HttpResult> HttpRequest(const std::string& host, uint16_t port, const std::string& method,
                               const std::string& target, const std::string& body, int64_t timeout_ms,
                               const HttpRequestOptions& options = {});

}  // namespace kvmesh
