// tests/multihost/host_bench.h — throughput from one host to each node host
// over the bridge: kvmesh PUT and GET against raw TCP between the same two
// namespaces, measured in the same run, interleaved (docs/multihost.md).
//
// For every node in the coordinator's map (or only `only_node`), in turn:
//   put      `threads` channels to the node (the map's backend: TCP, or UCX
//            with the node's worker address), one block per PUT, 32 keys
//            per channel stored again and again (replace), so the node's
//            memory never fills and eviction stays out of the figure
//   get      the same channels reading those blocks back, every byte
//            compared with the payload its key names
//   raw_up   raw TCP to a sink on the node's host, `threads` connections:
//            block out, 1-byte ack back (a PUT's ceiling)
//   raw_down raw TCP: 4-byte request out, block back (a GET's ceiling)
// each for `seconds`, `reps` rounds; a cell's figure is its median.
//
// Thread-safety: one call at a time; it makes its own threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "kvmesh/status.h"

namespace kvmesh::multihost {

struct HostBenchOptions {
  std::string coordinator;  // host:port
  std::string token;
  uint16_t sink_port = 7199;  // the raw sink's port on every node host
  std::string only_node;      // "" = every node
  double seconds = 0.5;
  uint32_t reps = 1;
  uint32_t threads = 2;
  size_t block = 256 << 10;
  uint64_t seed = 42;
  int64_t timeout_ms = 5000;
};

struct BenchCounters {
  std::atomic<uint64_t> calls{0}, bytes_compared{0}, wrong_bytes{0}, errors{0};
};

// {"backend", "block", "threads", "seconds", "reps", "hosts": [{"node", "host",
//  "gbps": {"put", "get", "raw_up", "raw_down"}, "ratio": {"put_over_raw_up", "get_over_raw_down"}}]}
Result<nlohmann::json> RunHostBench(const HostBenchOptions& o, BenchCounters* counters);

}  // namespace kvmesh::multihost
