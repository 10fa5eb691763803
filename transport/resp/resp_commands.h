// transport/resp/resp_commands.h — the RESP command table both fronts share:
// each command becomes a RespOp (resp_ops.h) or is answered at once.
//
// Commands: PING [msg], ECHO, GET, SET key value [NX|XX] [EX s|PX ms|EXAT
// s|PXAT ms|KEEPTTL], SETNX, SETEX, PSETEX, MGET, MSET, EXISTS, DEL (UNLINK),
// TTL, PTTL, INFO, DBSIZE, SELECT 0, AUTH [user] password, HELLO [2 [AUTH
// user password] [SETNAME name]], QUIT, and the handshake answers clients ask
// for (COMMAND, CONFIG GET save|appendonly, CLIENT SETINFO|SETNAME|GETNAME|
// ID|...), COMMAND with the key positions cluster clients read; in cluster
// mode CLUSTER SLOTS|SHARDS|NODES|INFO|MYID|KEYSLOT, READONLY, READWRITE, ASKING.
// HELLO 3 is refused with NOPROTO: kvmesh speaks RESP2.
//
// Authentication: when the front has a RespAuth that requires it, every
// command but AUTH, HELLO and QUIT is answered "-NOAUTH Authentication
// required." until AUTH (or HELLO ... AUTH) succeeds on the connection. The
// identity it proves (RespSessionState::identity) decides whose blocks the
// connection's commands reach: 0 is the cluster's own ("default", the
// cluster secret), 1..n the tenants of $.auth.tenants in config order. A
// later AUTH switches the identity from that command on; a failed one keeps
// the identity the connection had.
//
// Thread-safety: RespCommands is immutable after construction and may be
// shared by every connection; a RespSessionState belongs to one connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/config.h"
#include "transport/resp/resp_ops.h"
#include "transport/resp/resp_protocol.h"
#include "transport/resp/resp_value.h"

namespace kvmesh {

// Who may use a front, and as whom. Thread-safe.
class RespAuth {
 public:
  virtual ~RespAuth() = default;
  // True when commands need an AUTH first.
  virtual bool required() const = 0;
  // The identity `user` ("default" for AUTH <password>) logs in as with
  // `password` (0: the cluster's own, 1..n: a tenant), or nullopt. The
  // answer and its time say nothing about which part was wrong.
  virtual std::optional<uint32_t> Login(std::string_view user, std::string_view password) const = 0;
  // The byte quota per node of identity `identity` (0: none), and how many
  // tenant identities there are (1..tenants()): a SET of a value whose blocks
  // hold more than the quota is refused, and INFO counts commands per identity.
  virtual uint64_t QuotaBytes(uint32_t identity) const {
    (void)identity;
    return 0;
  }
  virtual size_t tenants() const { return 0; }
};

// The cluster's shared secret ($.auth.token) as the password of the
// "default" user (identity 0), as Redis's requirepass, and each tenant of
// $.auth.tenants as a user of its name with its token (identity 1..n, config
// order; a tenant called "default" is reached only through the secret's user
// when the password is not the secret). No token: null (no AUTH needed).
// Secrets are compared in constant time, and every tenant's, so the time
// does not say which names exist.
std::shared_ptr<const RespAuth> MakeClusterAuth(const AuthConfig& auth);
// The same with the secret alone (no tenants).
std::shared_ptr<const RespAuth> MakeTokenAuth(std::string token);

// Redis Cluster mode ($.resp.cluster, docs/resp.md "Redis Cluster mode"):
// which front serves each hash slot, as a front last learned it.
struct RespClusterView {
  struct Node {
    std::string id;         // 40 hex characters, as Redis node ids
    std::string host;
    uint16_t port = 0;      // its RESP port
    uint16_t bus_port = 0;  // shown after '@' in CLUSTER NODES (the node's data port)
  };
  uint64_t epoch = 0;          // the shard map's
  std::vector<Node> nodes;
  int self = -1;               // this front's index in nodes; -1: not (yet) in the map
  std::vector<int32_t> owner;  // kRespClusterSlots entries: index into nodes, or -1 (not served)
};

// Where a front in cluster mode reads the current view from. Thread-safe.
class RespCluster {
 public:
  virtual ~RespCluster() = default;
  // Null until the front knows the map.
  virtual std::shared_ptr<const RespClusterView> View() const = 0;
};

// A 40-hex-character Redis node id for a kvmesh node id (a hash of it).
std::string RespClusterNodeId(std::string_view node_id);

// The key rules of $.resp (hash tags, suffixes, cluster mode).
RespKeyRules RespRulesFromConfig(const RespConfig& c);

// One connection's state.
struct RespSessionState {
  bool authenticated = false;
  uint32_t identity = 0;    // RespAuth::Login's answer (0 until then)
  uint64_t id = 0;          // CLIENT ID
  std::string name;         // CLIENT SETNAME
};

struct RespFrontOptions {
  uint64_t block_bytes = 1u << 20;        // the slot size: parts and inline heads
  uint64_t max_value_bytes = 64u << 20;   // larger SETs are answered an error
  RespKeyRules rules;
  std::shared_ptr<const RespAuth> auth;   // null: no authentication
  std::string role = "node";              // INFO role: line
  // What a node holds for a block of n bytes (its quota charge, e.g.
  // ShardNode::HeldBytes), for refusing a SET whose value would not fit a
  // tenant's quota. Empty: a lower bound (the block's bytes, at least 7/8 of
  // the smallest chunk a store can have).
  std::function<uint64_t(uint64_t)> block_charge;
  // Non-null: Redis Cluster mode. Keyed commands whose slot this front does
  // not serve are answered -MOVED (or -CLUSTERDOWN), keys of two slots in one
  // command -CROSSSLOT; CLUSTER SLOTS|SHARDS|NODES|INFO|MYID|KEYSLOT describe the
  // view. rules.cluster_slots must be set with it.
  std::shared_ptr<const RespCluster> cluster;
};

class RespCommands {
 public:
  explicit RespCommands(RespFrontOptions o);

  // One command: either its answer is appended to *answer and nullptr is
  // returned, or the op that will answer it. *quit is set by QUIT (nothing
  // after it runs). REQUIRES: cmd is not empty.
  std::unique_ptr<RespOp> Compile(const RespCommand& cmd, RespSessionState* s, bool* quit) const;

  // What a command does to keys, for running several commands side by side:
  // args [first, end) step `step` are keys it reads (writes: false) or
  // writes. Commands without keys have first == end. A blind write (SET
  // without NX/XX/KEEPTTL, SETEX, PSETEX, MSET) reads nothing first: two of
  // them on one key may run side by side, since an executor keeps the order
  // of writes (resp_ops.h) and the later one wins, as in order.
  struct KeyAccess {
    size_t first = 0, end = 0, step = 1;
    bool writes = false;
    bool blind = false;
  };
  static KeyAccess Access(const RespCommand& cmd);

  // The environment of ops started now.
  RespOpEnv Env() const;
  const RespFrontOptions& options() const { return o_; }
  uint64_t commands() const { return commands_.load(std::memory_order_relaxed); }
  // Commands identity `identity` sent (over every connection); what INFO shows a tenant.
  uint64_t commands(uint32_t identity) const;
  // What the blocks of a value of `value_bytes` hold on its node (block_charge
  // over its head and parts).
  uint64_t ValueCharge(uint64_t value_bytes) const;
  uint64_t NextClientId() const { return next_id_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::unique_ptr<RespOp> Set(const RespCommand& a, const RespSessionState& s) const;
  // "" when `identity`'s quota can hold a value of value_bytes, else the error to answer.
  std::string OverQuota(uint32_t identity, uint64_t value_bytes) const;
  std::string Cluster(const RespCommand& a) const;
  // Cluster mode: "" when this front serves the command's keys, else the error to answer.
  std::string Redirect(const RespCommand& a) const;
  std::string Hello(const RespCommand& a, RespSessionState* s) const;
  RespFrontOptions o_;
  mutable std::atomic<uint64_t> commands_{0};
  size_t identities_ = 1;  // 0 and the tenants: by_identity_'s size
  std::unique_ptr<std::atomic<uint64_t>[]> by_identity_;
  mutable std::atomic<uint64_t> next_id_{1};
};

}  // namespace kvmesh
