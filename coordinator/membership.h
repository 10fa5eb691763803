// coordinator/membership.h — the coordinator's state and control API without
// the network: the members, their heartbeats, the shard-map epoch, and the
// HTTP/JSON handlers of every endpoint (coordinator_server.h lists them).
// CoordinatorServer serves one over HTTP and runs its reaper; the fuzz target
// (fuzz/fuzz_coordinator.cc) feeds it requests directly.
//
// Every request is authorised first (transport/http_auth.h): a refused one
// is answered 401/403, changes nothing and is logged as an
// {"event":"auth_refused"} line (at most 20 a second). Served over HTTP, that
// happens on the request's head (Admit, the server's head check), before its
// body is read; Handle checks again for callers that have the whole request.
//
// Limits (docs/security.md, "Resource limits"): each route's body size
// (below; larger: 413), JSON nesting (kMaxNetworkJsonDepth levels; deeper:
// 400 before anything is built from it), ids, hosts and UCX addresses
// (400 naming the path), the number of members (503 past kMaxMembers). A
// heartbeat's "stats" keep only the counters the coordinator sums
// (kHeartbeatCounters, non-negative integers); other keys are dropped.
//
// Thread-safety: all methods are thread-safe (one mutex over the state);
// the event sink is called with it held and must not call back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvmesh/config.h"
#include "router/shard_map.h"
#include "transport/http_server.h"

namespace kvmesh {

// Body limits per route (larger: refused at the request's head, 413).
inline constexpr uint64_t kMaxHeartbeatBodyBytes = 256 << 10;  // stats + up to 64 eviction groups' scores
inline constexpr uint64_t kMaxRegisterBodyBytes = 64 << 10;    // a registration with its UCX address
inline constexpr uint64_t kMaxSmallBodyBytes = 4 << 10;        // /leave and any other POST; GETs take none
// Fields a member keeps.
inline constexpr size_t kMaxNodeIdBytes = 256;
inline constexpr size_t kMaxHostBytes = 255;                   // a DNS name's limit
inline constexpr size_t kMaxUcxAddressBytes = 16 << 10;        // hex digits of the UCX worker address
inline constexpr size_t kMaxMembers = 16384;
// The node counters a heartbeat's "stats" may carry, summed in /stats "totals".
inline constexpr const char* kHeartbeatCounters[] = {"blocks", "bytes_stored", "hits", "misses", "puts", "evictions"};

class Membership {
 public:
  // Receives each structured event as one JSON line (no newline).
  using EventSink = std::function<void(const std::string&)>;

  // `sink` nullptr: events go to stderr.
  explicit Membership(const ClusterConfig& config, EventSink sink = nullptr);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  HttpServerResponse Handle(const HttpServerRequest& r);
  // The HTTP server's head check (transport/http_server.h): credentials
  // (refused: 401/403, counted and logged as by Handle) and the route's body
  // limit, from the request's head alone.
  HttpHeadDecision Admit(const HttpServerRequest& head);
  // Removes members silent for longer than $.coordinator.dead_after_ms at
  // `now` (each removal advances the epoch).
  void Reap(std::chrono::steady_clock::time_point now);

  uint64_t epoch() const;
  size_t live_nodes() const;

  // With $.coordinator.etcd the members, the shard map and its epoch live in
  // etcd (coordinator/etcd_control.h keeps them there). This Membership then
  // holds only the nodes that talk to this coordinator, whose leases its
  // owner keeps alive; a registration, heartbeat or leave changes no epoch
  // here; GET /map, /nodes and the epoch in answers are what Publish last
  // gave; and while SetStoreReachable(false), or once the time given to
  // SetStoreReachableUntil has passed (etcd out of reach), it answers
  // /register, /heartbeat and /map 503, so nodes and clients move on to
  // another coordinator.
  struct LocalMember {
    ShardInfo info;
    std::string ucx;
  };
  // The nodes heard from within dead_after_ms.
  std::vector<LocalMember> LocalMembers() const;
  // The ids that left (/leave) since the last call.
  std::vector<std::string> TakeLeft();
  // The map read from etcd (router/map_json.h); its epoch is the answers' (never a lower one).
  void Publish(const std::string& map_json);
  void SetStoreReachable(bool reachable);
  // Reachable until `until` by the steady clock, checked at each request: a
  // round of calls to an etcd that went silent can last several request
  // timeouts, and the nodes that talk here must move on by `until` all the
  // same (their registrations expire dead_after_ms after their last renewal).
  void SetStoreReachableUntil(std::chrono::steady_clock::time_point until);
  // A JSON object /stats shows as "etcd" (leadership, leader changes).
  void SetStoreStatus(const std::string& json_object);
  // Logs a JSON object as one event line, as this Membership's own (the sink, or stderr).
  void LogEvent(const std::string& json_object);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh
