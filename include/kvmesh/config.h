// kvmesh/config.h — the JSON cluster config (schema in docs/config.md).
//
// One file describes a cluster: the model, the nodes and their memory budgets,
// the block store, eviction, and expert-aware placement. The loader is strict:
// unknown keys, wrong types, missing required fields, non-positive or
// unparsable sizes, duplicate node ids, groups naming unknown nodes and
// block_tokens of 0 are rejected with the JSON path and the reason, e.g.
//   InvalidArgument: $.nodes[1].id: duplicate node id "n0" (first at $.nodes[0].id)
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

struct NodePorts {
  uint16_t data = 0;  // binary protocol (TCP); 0 = pick a free port
  uint16_t http = 0;  // /metrics, /healthz
  uint16_t resp = 0;  // Redis protocol front
};

struct NodeMemory {
  uint64_t device = 0;  // device tier budget (host memory when there is no GPU)
  uint64_t host = 0;    // host tier budget
  uint64_t ssd = 0;     // SSD tier budget
  std::string ssd_path; // file or directory for the SSD tier
};

struct NodeConfig {
  std::string id;
  std::string host = "127.0.0.1";
  NodePorts ports;
  int32_t gpu = -1;     // CUDA device index, -1 = none
  double weight = 1.0;  // rendezvous weight (> 0): share of keys relative to other nodes
  NodeMemory memory;

  // Bytes of the tier the block store serves from now: device, else host.
  uint64_t primary_budget() const { return memory.device ? memory.device : memory.host; }
};

struct StoreConfig {
  uint32_t stripes = 8;          // lock stripes per node (power of two)
  uint64_t slot_bytes = 0;       // 0: the model's full block bytes
  uint32_t size_classes = 4;     // 1..8; 1: fixed slots (shard_node/block_store.h)
  bool verify_checksums = true;  // verify each payload's checksum on read
};

// Tier movement (shard_node/tiered_store.h). Tiers are on for a node whose
// memory has a host or ssd budget besides its primary (device) budget.
struct TierConfig {
  double high_watermark = 0.80;  // offload from a tier above this share of its budget ...
  double low_watermark = 0.70;   // ... down to this one
  double offload_idle_s = 10.0;  // blocks idle this long are offloaded first
  bool promote_on_hit = true;    // false: serve lower-tier hits in place
  std::string host_policy = "lru";
  std::string ssd_policy = "lru";
  uint32_t interval_ms = 100;    // background maintenance period
};

// Pressure recovery levels (shard_node/pressure.h).
struct PressureConfig {
  bool enabled = true;
  uint32_t max_level = 3;              // highest level a node may reach (0..3)
  double evict_fraction = 0.25;        // level 1: share of the oldest blocks to evict
  std::string reencode_codec = "int8"; // level 2: lower-precision codec ("none": skip)
};

struct EvictionConfig {
  std::string policy = "adaptive";      // = kDefaultEvictionPolicy (eviction/eviction_policy.h)
  uint32_t priority_classes = 4;        // 1..kMaxPriorityClasses
  double aging_s = 60.0;                // an untouched block drops one class per aging_s (0: off)
  uint64_t shadow_sample_floor = 2048;  // adaptive: experts sample keys once c / rate >= this (0: off)
  TierConfig tiers;                     // $.eviction.tiers
  PressureConfig pressure;              // $.eviction.pressure
};

// An affinity rule: requests whose hint falls in [values.begin, values.end)
// are placed in `group`.
struct AffinityRule {
  Affinity::Kind kind = Affinity::Kind::kNone;
  Range values;
  std::string group;
};

struct PlacementConfig {
  uint32_t replicas = 1;
  std::map<std::string, std::vector<std::string>> groups;  // group name -> node ids
  std::vector<AffinityRule> affinity;
};

// Wire transports (docs/protocol.md, docs/launch.md).
// The values of $.transport.ucx.progress, in the order of UcxProgress
// (transport/ucx_worker.h): the config checks names against it, the
// transport maps them.
inline constexpr std::array<std::string_view, 4> kUcxProgressModes = {"poll", "event", "hybrid", "adaptive"};

struct TransportConfig {
  std::string backend = "tcp";          // data plane for routers: "tcp" or "ucx"
  uint32_t io_threads = 2;              // Asio threads per daemon
  uint64_t max_frame_bytes = 64u << 20; // largest frame body accepted (bytes)
  uint32_t max_batch_items = 4096;      // items per batch frame
  uint32_t connections_per_node = 2;    // client connection pool size per node
  int64_t timeout_ms = 2000;            // client call timeout
  int64_t connect_timeout_ms = 1000;
  // $.transport.ucx: how a thread waiting on a UCX worker makes progress:
  // "poll" (spin: lowest latency, a core per waiting thread), "event" (sleep
  // on the worker's wakeup fd), "hybrid" (spin ucx_spin_us after the last
  // event, then sleep) or "adaptive" (spin for a budget of up to ucx_spin_us
  // that grows while waits are short and shrinks to 0 while they are long,
  // then sleep). "adaptive" by default: a lone caller spins as "hybrid" does,
  // callers whose answers queue behind others' sleep as "event" does
  // (bench_transport, docs/config.md).
  std::string ucx_progress = "adaptive";
  int64_t ucx_spin_us = 100;
  // $.transport.ucx.workers: UCX worker threads per node, each with its own
  // worker and client sessions (clients spread over them). 0 = one per
  // core, 1 to 4 (two on a 2-core machine: bench_transport, docs/config.md).
  int64_t ucx_workers = 0;
  // $.transport.ucx.local_reads: with backend "ucx", a node keeps its pool
  // in shared memory and lets UCX clients of its own host (cluster
  // identity) read blocks straight from it, with no message
  // (transport/local_index.h); clients use it when the node offers it.
  // Default on (a "tcp" cluster's nodes keep a private pool either way).
  bool ucx_local_reads = true;
};

// $.coordinator.etcd: the membership store of a highly available control
// plane (docs/launch.md, "etcd-backed launch"). With endpoints set, every
// `kvmesh coordinator` of the cluster keeps the members, the shard map and its
// epoch in etcd, one of them leads by an etcd lease, and any answers GET /map.
// Unset (the default), the coordinator keeps them in its memory, as before.
struct EtcdConfig {
  std::vector<std::string> endpoints;  // "host:port" of etcd members' client URLs; empty: no etcd
  std::string prefix;                  // every key of this cluster; default "/kvmesh/<$.name>/"
  int64_t lease_ms = 2000;             // the leader's lease (etcd counts whole seconds: rounded up)
  int64_t request_timeout_ms = 1000;   // one call to one etcd member
  std::string user;                    // etcd auth (`etcdctl auth enable`): user and password
  std::string password;
  bool tls = false;                    // HTTPS to etcd with $.tls's ca, cert and key (etcd client certificates)

  bool enabled() const { return !endpoints.empty(); }
};

// The coordinator daemon (membership, heartbeats, shard-map epochs).
struct CoordinatorConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 0;              // HTTP control API; 0 = pick a free port
  int64_t heartbeat_ms = 300;     // node heartbeat period
  int64_t dead_after_ms = 1500;   // a node silent this long is removed (epoch advances)
  // Every coordinator's "host:port" (several with $.coordinator.etcd): nodes
  // and clients try them in turn. Empty: host:port alone.
  std::vector<std::string> addresses;
  EtcdConfig etcd;
};

// A tenant ($.auth.tenants[]): an identity of its own on every data port
// (HELLO tenant + token; RESP AUTH user password) and on the coordinator's
// map (HTTP Basic). Its blocks live in its namespace, which the serving node
// derives from the authenticated identity: tenants with different namespaces
// never read, detect or erase each other's blocks, whatever key bytes they
// send (docs/security.md).
struct TenantConfig {
  std::string name;          // 1..64 of [A-Za-z0-9._-]
  std::string token;         // its secret, 1..256 bytes ("token" or "password" in JSON)
  uint64_t quota_bytes = 0;  // what one node holds for it ("quota"): chunk bytes of its blocks, live sequences, pins; 0: no quota
  // Tenants naming the same namespace share their blocks on purpose (e.g.
  // one model's system prompts); default: the tenant's own name.
  std::string ns;
};

// Authentication ($.auth). With token set, a data connection's HELLO must
// carry it (or a tenant's name and token) or the node refuses every data
// operation, and the control plane (coordinator, a node's HTTP port) wants it
// as `Authorization: Bearer`.
struct AuthConfig {
  std::string token;                  // the cluster secret (nodes, admin tools, the proxy)
  std::vector<TenantConfig> tenants;  // needs token

  // The tenant called `name`, or nullptr.
  const TenantConfig* FindTenant(std::string_view name) const;
};

// TLS on the TCP data ports and the HTTP ports (the coordinator's API, a
// node's /metrics) when `cert` is set ($.tls; docs/security.md). Every
// process of the cluster presents `cert` and trusts servers and clients whose
// certificates chain to `ca`. The RESP ports speak TLS too unless $.resp.tls
// is false; UCX stays plain.
struct TlsConfig {
  std::string cert;  // PEM certificate (chain) of this process
  std::string key;   // PEM private key of cert
  std::string ca;    // PEM CA bundle every peer's certificate must chain to
  // Which clients must show a certificate signed by `ca` (mutual TLS):
  // "none"; "admin" (default): calls that need the cluster secret on an HTTP
  // port (membership writes, /nodes, /stats, a node's /metrics), so a node's
  // registration takes both its secret and its certificate; "all": every
  // connection to a TLS port (routers then need certificates too).
  std::string client_auth = "admin";
  bool verify_hostname = true;  // a server's certificate must name the host dialled (DNS or IP SAN)

  bool enabled() const { return !cert.empty(); }
};

// The Redis-protocol fronts, node-local and proxy (docs/resp.md).
struct RespConfig {
  uint64_t max_value_bytes = 64u << 20;  // largest value a SET stores (over as many blocks as it needs)
  bool hash_tags = true;                 // keys sharing a Redis Cluster {tag} are placed and evicted together
  // A key ending in one of these is grouped with the keys of the same stem
  // (an LMCache-style "<key>kv_bytes" chunk with its "<key>metadata").
  std::vector<std::string> group_suffixes = {"kv_bytes", "metadata"};
  // Redis Cluster mode: keys are placed by their hash slot, and every node's
  // RESP port answers CLUSTER SLOTS/NODES and redirects (-MOVED) keys of the
  // slots it does not own, so cluster-aware clients reach a key's node in one
  // hop. The suffix rule is then off (hash tags group keys, as in Redis
  // Cluster). Every process of the cluster (nodes, proxies) must agree.
  bool cluster = false;
  // With $.tls set, the RESP ports (a node's, `kvmesh proxy`'s client port)
  // speak TLS only; false keeps them plain for Redis clients without TLS
  // (the proxy's node links speak TLS either way).
  bool tls = true;
};

// Block compression (docs/block-format.md): shard nodes encode each
// full block on put with the codec of its layers and decode it on get.
// Codec strings: none | raw | fp16 | bf16 | int8 | int4 | fp8-e4m3 | fp8-e5m2 |
// lowrank, with options :gN (group), :kivi|token|channel (axes), :rN (rank),
// e.g. "int4:g64:kivi" (see kernels/codec.h ParseCodecSpec).
struct CodecLayerRule {
  Range layers;        // absolute model layers, from 3 or "0-1" (inclusive)
  std::string codec;   // a codec string (not "none")
};
struct CodecConfig {
  std::string codec = "none";      // "none": store blocks as they come
  std::string lossless = "none";   // none | lz4 | zstd, after the codec
  int32_t zstd_level = 3;          // 1..22
  std::string basis;               // lowrank basis file (kvmesh codec fit-basis)
  uint32_t threads = 1;            // codec threads per block (0: all cores)
  std::vector<CodecLayerRule> layers;  // mixed precision: first matching rule wins

  bool enabled() const { return codec != "none" || !layers.empty(); }
};

// Live sequences on every node ($.sequences; shard_node/sequence_service.h).
struct SequencesConfig {
  int64_t idle_timeout_ms = 10 * 60 * 1000;  // a sequence untouched this long is released (1 ms..30 days)
  uint32_t max_sequences = 4096;             // live sequences per node
  uint32_t max_slices = 64;                  // distinct (slice, tenant salt, priority) tables per node
  uint32_t max_sequence_tokens = 1u << 20;   // tokens one sequence may hold
};

// What one connection may hold of a server, on every TCP port that serves
// clients: a node's data port (binary frames), its RESP port and `kvmesh
// proxy`'s RESP port ($.limits; docs/config.md, docs/security.md "Resource
// limits"). Before a connection has authenticated (the TLS handshake, then
// HELLO on the data port, AUTH on a RESP port that wants a password) it gets
// nothing but the handshake: the data port refuses every frame but HELLO at
// its header, a RESP port reads no bulk string longer than
// preauth_max_bytes, and the whole handshake must be over within
// handshake_timeout_ms.
struct LimitsConfig {
  uint32_t max_connections = 4096;           // open connections per listening port; more are closed at accept
  uint32_t max_connections_per_peer = 1024;  // of them from one peer address
  uint64_t preauth_max_bytes = 64u << 10;    // RESP: largest bulk string or buffered command before AUTH (the data port refuses every frame but HELLO at its header)
  int64_t handshake_timeout_ms = 10000;      // accept to authenticated (TLS handshake, HELLO / AUTH)
  int64_t read_timeout_ms = 30000;           // a frame or command begun: no byte of it for this long closes
  int64_t write_timeout_ms = 30000;          // an answer the peer does not take for this long closes (pins released)
  int64_t idle_timeout_ms = 0;               // an authenticated connection with nothing in progress; 0: never
  uint64_t max_pending_answer_bytes = 32u << 20;  // answer bytes a connection holds unwritten before it stops reading
};

// KV events ($.events; docs/kv-events.md): every node publishes the blocks it
// stores, removes and clears, per tier, on a ZMQ PUB socket in vLLM's
// KV-event wire format, with a ROUTER socket for replay and snapshots.
struct EventsConfig {
  bool enabled = false;
  std::string host = "127.0.0.1";  // address both sockets bind ("*": every interface)
  uint16_t port = 0;               // PUB port; 0: chosen at run time (the node's `listening` line)
  uint16_t replay_port = 0;        // ROUTER port for replay and snapshot requests; 0: run time
  uint32_t replay_buffer = 10000;  // published batches kept for replay
  uint32_t queue_events = 65536;   // events the store path may queue before the publisher drops (a gap)
  uint32_t max_batch_events = 512; // events per published batch at most
  std::string topic;               // first frame of every message ("" as vLLM's default)
  std::string hash = "bytes";      // block hash on the wire: "bytes" (16-byte key) or "int" (its low 64 bits)
};

// Similarity-gated reuse of world-model frame KV ($.frames; kvmesh/frame_stream.h,
// docs/worldmodel.md): the defaults of every FrameStream's gate.
struct FramesConfig {
  uint32_t window = 16;            // frames a patch is matched against (1..1024)
  double ssim_threshold = 0.92;    // tau, in [-1, 1]
  double change_threshold = 0.05;  // rho, in [0, 1]
  uint32_t pixel_delta = 16;       // 0..255
  uint32_t recompute_radius = 0;   // CacheBlend-style repair radius in patches (0: off)
  double refresh_deviation = 0;    // CacheBlend-style refresh by measured layer-1 KV deviation (0: off)
  uint32_t max_age = 0;            // a block older than this many frames is not reused (0: no cap)
  uint32_t motion_radius = 0;      // also match blocks of patch positions within this grid distance (0: same position)
};

struct ClusterConfig {
  std::string name = "kvmesh";
  ModelSpec model;
  std::vector<NodeConfig> nodes;
  StoreConfig store;
  EvictionConfig eviction;
  PlacementConfig placement;
  TransportConfig transport;
  CoordinatorConfig coordinator;
  AuthConfig auth;
  RespConfig resp;
  TlsConfig tls;
  CodecConfig codec;
  SequencesConfig sequences;
  LimitsConfig limits;
  EventsConfig events;
  FramesConfig frames;

  std::string source;  // file name or "<string>", for messages

  const NodeConfig* FindNode(std::string_view id) const;
};

// Parses a config from JSON text. `source` names it in messages.
Result<ClusterConfig> ParseConfig(std::string_view json_text, std::string_view source = "<string>");
// Reads and parses a config file.
Result<ClusterConfig> LoadConfigFile(const std::string& path);

}  // namespace kvmesh
