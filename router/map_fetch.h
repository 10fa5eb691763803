// router/map_fetch.h — reading the shard map a coordinator publishes
// (GET /map, router/map_json.h), for network routers and for nodes in Redis
// Cluster mode, which both follow the coordinator's epoch; and calling the
// first of several coordinators that answers ($.coordinator.addresses, or
// `--coordinator a,b,c`: the coordinators of an etcd-backed control plane,
// docs/launch.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "router/map_json.h"
#include "transport/http_client.h"

namespace kvmesh {

struct CoordinatorAddress {
  std::string host;
  uint16_t port = 0;
};

// The config's coordinators as a list: $.coordinator.addresses joined by
// commas, else host:port when its port is set, else "".
std::string ConfigCoordinators(const CoordinatorConfig& c);

// "host:port[,host:port...]" (at most 64); InvalidArgument naming the bad one.
Result<std::vector<CoordinatorAddress>> ParseCoordinatorList(const std::string& list);

// `method` `target` on the coordinator *preferred names, then on each other in
// turn, until one answers with a status below 500 (a coordinator that cannot
// reach etcd answers 503: the next may). *preferred becomes the one that
// answered, so the next call starts there. Each try is bounded by
// `timeout_ms`. The last error when none answers.
Result<HttpResult> CoordinatorRequest(const std::vector<CoordinatorAddress>& coordinators, size_t* preferred,
                                      const std::string& method, const std::string& target, const std::string& body,
                                      int64_t timeout_ms, const HttpRequestOptions& options);

// A current map. PermissionDenied when a coordinator refuses the credential
// in `options` (HTTP 401/403), Unavailable for any other status or when no
// coordinator can be reached, DeadlineExceeded past `timeout_ms` (per
// coordinator), and the parser's error (naming the JSON path) for a map that
// cannot be trusted.
Result<PublishedMap> FetchPublishedMap(const std::vector<CoordinatorAddress>& coordinators, size_t* preferred,
                                       int64_t timeout_ms, const HttpRequestOptions& options);
Result<PublishedMap> FetchPublishedMap(const std::string& host, uint16_t port, int64_t timeout_ms,
                                       const HttpRequestOptions& options);

}  // namespace kvmesh
