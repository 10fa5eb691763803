// transport/http_auth.h — who may call the daemons' HTTP endpoints
// (docs/security.md, "Control plane").
//
// With a cluster secret ($.auth.token) every endpoint except /healthz needs
// credentials: `Authorization: Bearer <secret>` for everything, or, where an
// endpoint only reads the shard map, `Authorization: Basic` with a tenant's
// name and token ($.auth.tenants). Without a secret every call is allowed, as
// before there was one. A refusal is decided before the request is looked
// at, so a refused request changes nothing.
//
//   HttpAuthDecision d = AuthorizeHttp(config.auth, request, HttpAccess::kAdmin);
//   if (!d.allowed) { log d; return RefusalResponse(d); }
//
// Thread-safety: AuthorizeHttp is a pure function; EventRateLimiter is
// thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "kvmesh/config.h"
#include "transport/http_server.h"

namespace kvmesh {

enum class HttpAccess {
  kOpen,   // anyone (/healthz)
  kRead,   // the cluster secret or any tenant's credentials (GET /map)
  kAdmin,  // the cluster secret only (membership writes, /nodes, /stats, a node's /metrics)
};

struct HttpAuthDecision {
  bool allowed = true;
  int status = 200;     // 401: no or malformed credentials; 403: wrong ones
  std::string reason;   // for the log: "missing credentials", "wrong secret", ...
  std::string who;      // "cluster", "tenant:<name>", or "" (anonymous)
};

// With admin_needs_client_cert (TLS with $.tls.client_auth "admin" or
// "all"), a kAdmin call must also come with a client certificate the cluster
// CA signed (HttpServerRequest::client_cert): 403 otherwise.
HttpAuthDecision AuthorizeHttp(const AuthConfig& auth, const HttpServerRequest& r, HttpAccess need,
                               bool admin_needs_client_cert = false);

// The 401/403 answer for a refusal (JSON {"error": ...}; a 401 carries
// WWW-Authenticate: Bearer realm="kvmesh").
HttpServerResponse RefusalResponse(const HttpAuthDecision& d);

// Bounds log lines about refusals: at most `per_second` a second; the next
// line allowed reports how many were left out meanwhile.
class EventRateLimiter {
 public:
  explicit EventRateLimiter(uint32_t per_second = 20) : per_second_(per_second) {}
  // True when this event may be logged; *suppressed is the number left out since the last one logged.
  bool Allow(uint64_t* suppressed);

 private:
  std::mutex mu_;
  const uint32_t per_second_;
  int64_t window_ = -1;     // guarded by mu_: the current second
  uint32_t in_window_ = 0;  // guarded by mu_
  uint64_t dropped_ = 0;    // guarded by mu_
};

}  // namespace kvmesh
