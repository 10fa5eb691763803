// router/map_json.h — the shard map as the coordinator publishes it over its
// HTTP control API (GET /map) and as network routers read it back.
//
//   {"epoch": 7, "model": {...ModelSpec...}, "replicas": 1,
//    "groups": {"g": ["n0", "n1"]}, "affinity": [{"kind": "expert", "begin": 0, "end": 4, "group": "g"}],
//    "transport": "tcp",
//    "nodes": [{"id": "n0", "host": "127.0.0.1", "weight": 1.0,
//               "ports": {"data": 41234, "http": 41235, "resp": 41236}, "ucx": "<hex, optional>"}]}
//
// Parsing is strict (ObjectReader): a map a router cannot trust is an error, not a guess.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "router/shard_map.h"

namespace kvmesh {

struct PublishedMap {
  uint64_t epoch = 0;
  ModelSpec model;
  PlacementConfig placement;
  std::vector<ShardInfo> nodes;  // live nodes only
  std::string backend = "tcp";   // $.transport.backend: what routers should use
  std::map<std::string, std::string> ucx_addresses;  // node id -> hex UCX worker address
};

std::string PublishedMapToJson(const PublishedMap& m);
Result<PublishedMap> ParsePublishedMap(std::string_view json_text);

// The ShardMap a router places keys with.
Result<std::shared_ptr<const ShardMap>> BuildShardMap(const PublishedMap& m);

}  // namespace kvmesh
