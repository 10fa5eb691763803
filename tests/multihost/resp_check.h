// tests/multihost/resp_check.h — a Redis-protocol client that checks every
// byte it reads through `kvmesh proxy` (docs/resp.md).
//
// Every value key K ever holds is Payload(KeyOf(K), seed): SET / MSET write
// it, GET / MGET must return it or nil (a miss: evicted, or its node away).
// Anything else read back is a wrong byte; an error reply ("-ERR ...") is a
// refusal, counted, not a violation; a reply later than the proxy's timeout
// plus the margin is a violation.
//
// Thread-safety: RespCounters is atomics; one RespWorker per thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "soak.h"

namespace kvmesh::multihost {

struct RespCounters {
  std::atomic<uint64_t> commands{0}, values_ok{0}, nils{0}, errors{0}, reconnects{0};
  std::atomic<uint64_t> bytes_compared{0}, wrong_bytes{0}, max_us{0};
};

// Runs until c.stop: SET, GET, MSET and MGET of 16 KiB values on the proxy
// at host:port, with skewed reuse over 4096 keys.
void RespWorker(soak::Context& c, const std::string& host, uint16_t port, uint32_t thread, RespCounters* rc);

}  // namespace kvmesh::multihost
