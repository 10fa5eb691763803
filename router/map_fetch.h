// router/map_fetch.h — reading the shard map a coordinator publishes
// (GET /map, router/map_json.h), for network routers and for nodes in Redis
// Cluster mode, which both follow the coordinator's epoch.
#pragma once

#include <cstdint>
#include <string>

#include "router/map_json.h"
#include "transport/http_client.h"

namespace kvmesh {

// The coordinator's current map. PermissionDenied when it refuses the
// credential in `options` (HTTP 401/403), Unavailable for any other status or
// an unreachable coordinator, DeadlineExceeded past `timeout_ms`, and the
// parser's error (naming the JSON path) for a map that cannot be trusted.
Result<PublishedMap> FetchPublishedMap(const std::string& host, uint16_t port, int64_t timeout_ms,
                                       const HttpRequestOptions& options);

}  // namespace kvmesh
