// coordinator/membership.h — the coordinator's state and control API without
// the network: the members, their heartbeats, the shard-map epoch, and the
// HTTP/JSON handlers of every endpoint (coordinator_server.h lists them).
// CoordinatorServer serves one over HTTP and runs its reaper; the fuzz target
// (fuzz/fuzz_coordinator.cc) feeds it requests directly.
//
// Every request is authorised first (transport/http_auth.h): a refused one
// is answered 401/403, changes nothing and is logged as an
// {"event":"auth_refused"} line (at most 20 a second).
//
// Thread-safety: all methods are thread-safe (one mutex over the state);
// the event sink is called with it held and must not call back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvmesh/config.h"
#include "transport/http_server.h"

namespace kvmesh {

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
  // Removes members silent for longer than $.coordinator.dead_after_ms at
  // `now` (each removal advances the epoch).
  void Reap(std::chrono::steady_clock::time_point now);

  uint64_t epoch() const;
  size_t live_nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh
