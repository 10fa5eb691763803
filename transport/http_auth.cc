#include "transport/http_auth.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "common/credentials.h"

namespace kvmesh {

HttpAuthDecision AuthorizeHttp(const AuthConfig& auth, const HttpServerRequest& r, HttpAccess need,
                               bool admin_needs_client_cert) {
  HttpAuthDecision d;
  auto refuse = [&](int status, std::string reason) {
    d.allowed = false;
    d.status = status;
    d.reason = std::move(reason);
    return d;
  };
  if (need == HttpAccess::kAdmin && admin_needs_client_cert && !r.client_cert)
    return refuse(403, "a client certificate signed by the cluster CA is required");
  if (need == HttpAccess::kOpen || auth.token.empty()) return d;
  const HttpCredentials c = ParseAuthorization(r.authorization);
  switch (c.kind) {
    case HttpCredentials::Kind::kNone:
      return refuse(401, "missing credentials");
    case HttpCredentials::Kind::kMalformed:
      return refuse(401, "malformed Authorization header");
    case HttpCredentials::Kind::kBearer:
      if (!ConstantTimeEquals(c.secret, auth.token)) return refuse(403, "wrong cluster secret");
      d.who = "cluster";
      return d;
    case HttpCredentials::Kind::kBasic:
      break;
  }
  // A tenant: the same answer whether the name or the token is wrong, and a
  // comparison either way, so a caller learns nothing about which names exist.
  const TenantConfig* t = auth.FindTenant(c.user);
  const bool match = ConstantTimeEquals(c.secret, t ? t->token : auth.token) && t != nullptr;
  if (!match) return refuse(403, "unknown tenant or wrong token");
  if (need != HttpAccess::kRead) return refuse(403, "tenant \"" + t->name + "\" may only read the map");
  d.who = "tenant:" + t->name;
  return d;
}

HttpServerResponse RefusalResponse(const HttpAuthDecision& d) {
  HttpServerResponse out;
  out.status = d.status;
  out.content_type = "application/json";
  const char* what = d.status == 401 ? "authentication required: " : "forbidden: ";
  out.body = nlohmann::json{{"error", what + d.reason}}.dump() + "\n";
  if (d.status == 401) out.www_authenticate = "Bearer realm=\"kvmesh\"";
  return out;
}

bool EventRateLimiter::Allow(uint64_t* suppressed) {
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(mu_);
  if (now != window_) {
    window_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= per_second_) {
    ++dropped_;
    return false;
  }
  ++in_window_;
  *suppressed = dropped_;
  dropped_ = 0;
  return true;
}

}  // namespace kvmesh
