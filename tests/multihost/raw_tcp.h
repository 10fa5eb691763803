// tests/multihost/raw_tcp.h — raw TCP between two hosts, the baseline the
// multi-host throughput figures are measured against (docs/multihost.md).
//
// A sink listens on a host; a client on another host opens connections and
// runs one of two exchanges for a fixed time, with no protocol, checksum or
// store in the way:
//   kUpload    send a block, wait for a 1-byte ack       (a PUT's ceiling: one round trip per block)
//   kDownload  send a 4-byte size, read that many bytes  (a GET's ceiling)
//
// Thread-safety: RunSink serves each connection on a thread of its own;
// RawThroughput is called from one thread and makes its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvmesh/status.h"

namespace kvmesh::multihost {

enum class RawMode : char { kUpload = 'U', kDownload = 'D' };

// Listens on host:port (port 0: a free port) and serves connections until
// *stop; prints {"event":"listening","role":"raw_sink","port":P} on stdout
// once bound.
Status RunSink(const std::string& host, uint16_t port, const std::atomic<bool>* stop);

struct RawResult {
  uint64_t bytes = 0;  // payload bytes moved
  uint64_t exchanges = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

// `connections` connections to the sink at host:port, each on its own
// thread, running `mode` with `block` bytes for `seconds`.
Result<RawResult> RawThroughput(const std::string& host, uint16_t port, RawMode mode, size_t block,
                                uint32_t connections, double seconds);

}  // namespace kvmesh::multihost
