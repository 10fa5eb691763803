#include "router/map_fetch.h"

#include "transport/socket_util.h"

namespace kvmesh {

std::string ConfigCoordinators(const CoordinatorConfig& c) {
  std::string out;
  for (const std::string& a : c.addresses) out += (out.empty() ? "" : ",") + a;
  if (out.empty() && c.port != 0) out = c.host + ":" + std::to_string(c.port);
  return out;
}

Result<std::vector<CoordinatorAddress>> ParseCoordinatorList(const std::string& list) {
  std::vector<CoordinatorAddress> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string one = list.substr(pos, comma - pos);
    CoordinatorAddress a;
    if (Status s = SplitHostPort(one, &a.host, &a.port); !s.ok() || a.port == 0)
      return InvalidArgument("coordinator address \"" + one.substr(0, 80) +
                             "\": expected host:port (several separated by commas)");
    out.push_back(std::move(a));
    if (out.size() > 64) return InvalidArgument("more than 64 coordinator addresses");
    pos = comma + 1;
  }
  return out;
}

Result<HttpResult> CoordinatorRequest(const std::vector<CoordinatorAddress>& coordinators, size_t* preferred,
                                      const std::string& method, const std::string& target, const std::string& body,
                                      int64_t timeout_ms, const HttpRequestOptions& options) {
  if (coordinators.empty()) return InvalidArgument("no coordinator address");
  Status last;
  for (size_t i = 0; i < coordinators.size(); ++i) {
    const size_t at = (*preferred + i) % coordinators.size();
    const CoordinatorAddress& c = coordinators[at];
    Result<HttpResult> r = HttpRequest(c.host, c.port, method, target, body, timeout_ms, options);
    const std::string where = "coordinator " + c.host + ":" + std::to_string(c.port);
    if (!r.ok()) {
      last = r.status().WithContext(where);
      continue;
    }
    if (r->status >= 500) {
      last = Unavailable(where + " answered HTTP " + std::to_string(r->status) + " for " + target + ": " +
                         r->body.substr(0, 200));
      continue;
    }
    *preferred = at;
    return r;
  }
  return last;
}

Result<PublishedMap> FetchPublishedMap(const std::vector<CoordinatorAddress>& coordinators, size_t* preferred,
                                       int64_t timeout_ms, const HttpRequestOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(HttpResult r, CoordinatorRequest(coordinators, preferred, "GET", "/map", "", timeout_ms, options));
  if (r.status == 401 || r.status == 403)
    return PermissionDenied("coordinator refused /map (HTTP " + std::to_string(r.status) + "): " + r.body);
  if (r.status != 200) return Unavailable("coordinator answered HTTP " + std::to_string(r.status) + " for /map");
  return ParsePublishedMap(r.body);
}

Result<PublishedMap> FetchPublishedMap(const std::string& host, uint16_t port, int64_t timeout_ms,
                                       const HttpRequestOptions& options) {
  size_t preferred = 0;
  return FetchPublishedMap({CoordinatorAddress{host, port}}, &preferred, timeout_ms, options);
}

}  // namespace kvmesh
