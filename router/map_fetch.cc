#include "router/map_fetch.h"

namespace kvmesh {

Result<PublishedMap> FetchPublishedMap(const std::string& host, uint16_t port, int64_t timeout_ms,
                                       const HttpRequestOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(HttpResult r, HttpRequest(host, port, "GET", "/map", "", timeout_ms, options));
  if (r.status == 401 || r.status == 403)
    return PermissionDenied("coordinator refused /map (HTTP " + std::to_string(r.status) + "): " + r.body);
  if (r.status != 200) return Unavailable("coordinator answered HTTP " + std::to_string(r.status) + " for /map");
  return ParsePublishedMap(r.body);
}

}  // namespace kvmesh
