#include "cli/serve/bench_serve.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/serve/daemons.h"
#include "cli/serve/engine_proc.h"
#include "cli/serve/routing.h"
#include "eviction/replay.h"
#include "kvmesh/embedded.h"
#include "kvmesh/network.h"
#include "shard_node/shard_node.h"

namespace kvmesh::serve {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct ConfigKind {
  CacheMode mode;
  LoadPolicy policy;
  bool pressure = false;  // against the pressure cluster (small tiers over an SSD)
  std::string codec;      // against a cluster whose nodes store blocks with this codec (kernels/codec.h)
};

// A configuration's name with a "+procs" suffix runs its engines as child
// processes (as --engine-procs does for every configuration), so that one run
// compares both ways on the same arrivals.
constexpr std::string_view kProcsSuffix = "+procs";
bool AsProcs(const std::string& name) { return name.ends_with(kProcsSuffix); }
std::string WithoutProcs(const std::string& name) {
  return AsProcs(name) ? name.substr(0, name.size() - kProcsSuffix.size()) : name;
}

Result<ConfigKind> KindOf(const std::string& name) {
  if (name == "recompute") return ConfigKind{CacheMode::kRecompute, LoadPolicy::kDecide};
  if (name == "local") return ConfigKind{CacheMode::kLocal, LoadPolicy::kDecide};
  if (name == "kvmesh") return ConfigKind{CacheMode::kKvmesh, LoadPolicy::kDecide};
  if (name == "kvmesh-blind") return ConfigKind{CacheMode::kKvmesh, LoadPolicy::kBlind};
  if (name == "kvmesh-ssd") return ConfigKind{CacheMode::kKvmesh, LoadPolicy::kDecide, true};
  if (name == "kvmesh-ssd-blind") return ConfigKind{CacheMode::kKvmesh, LoadPolicy::kBlind, true};
  if (name == "kvmesh-int4") return ConfigKind{CacheMode::kKvmesh, LoadPolicy::kDecide, false, "int4"};
  if (name == "kvmesh-fp8") return ConfigKind{CacheMode::kKvmesh, LoadPolicy::kDecide, false, "fp8-e4m3"};
  return InvalidArgument("unknown configuration '" + name +
                         "' (recompute, local, kvmesh, kvmesh-blind, kvmesh-ssd, kvmesh-ssd-blind, kvmesh-int4, "
                         "kvmesh-fp8; each also with -kv or -kv-approx: KV-aware routing; then +procs: engines as "
                         "processes)");
}

// The cluster the kvmesh tier runs on: the engine model's KV layout with
// head_dim cut by kv_scale (so a block moves 1/kv_scale of its real bytes).
// Under pressure (ssd_dir set): device and host tiers of pressure_memory each
// over an SSD tier of ssd_memory in ssd_dir; blocks idle 1 s move down, an
// SSD hit is served in place (no promotion: the pressure stays), and pressure
// recovery is off so that a full tier demotes rather than drops.
// With a codec, every node stores blocks encoded by it ($.codec).
Result<json> ClusterJson(const BenchServeOptions& o, const Roofline& model, const std::string& ssd_dir = "",
                         const std::string& codec = "") {
  const ModelShape& m = model.model();
  if (o.kv_scale == 0 || m.head_dim % o.kv_scale != 0)
    return InvalidArgument("--kv-scale must divide the model's head_dim (" + std::to_string(m.head_dim) + ")");
  json c = {
      {"name", "bench-serve"},
      {"model", {{"model_id", m.name}, {"num_layers", m.layers}, {"num_kv_heads", m.kv_heads},
                 {"head_dim", m.head_dim / o.kv_scale}, {"dtype", m.dtype_bytes == 4 ? "fp32" : "bf16"}, {"block_tokens", o.block_tokens}}},
      {"store", {{"stripes", 8}, {"verify_checksums", true}}},
      {"transport", {{"backend", o.transport}, {"io_threads", 2}, {"max_frame_bytes", "512MiB"},
                     {"timeout_ms", 20000}}},
      {"coordinator", {{"host", "127.0.0.1"}, {"port", 0}, {"heartbeat_ms", 200}, {"dead_after_ms", 3000}}},
  };
  for (uint32_t i = 0; i < std::max<uint32_t>(o.nodes, 1); ++i)
    c["nodes"].push_back({{"id", "n" + std::to_string(i)}, {"host", "127.0.0.1"},
                          {"ports", {{"data", 0}, {"http", 0}, {"resp", 0}}},
                          {"memory", {{"host", std::to_string(o.node_memory)}}}});
  if (!ssd_dir.empty()) {
    for (json& n : c["nodes"])
      n["memory"] = {{"device", std::to_string(o.pressure_memory)}, {"host", std::to_string(o.pressure_memory)},
                     {"ssd", std::to_string(o.ssd_memory)}, {"ssd_path", ssd_dir}};
    c["eviction"] = {{"tiers", {{"offload_idle_s", 1}, {"promote_on_hit", false}, {"interval_ms", 50}}},
                     {"pressure", {{"enabled", false}}}};
  }
  if (!codec.empty()) c["codec"] = {{"codec", codec}};
  return c;
}


// One run's kvmesh clients: a router per engine (its own connections), all
// under the run's salt.
struct Tier {
  std::unique_ptr<EmbeddedCluster> embedded;
  std::vector<std::unique_ptr<NetworkClient>> clients;
  Router& router(size_t engine) {
    return embedded ? embedded->router() : clients[engine]->router();
  }
};

Result<Tier> OpenTier(const BenchServeOptions& o, const json& cluster, const LocalDaemons* daemons,
                      const std::string& salt) {
  Tier t;
  if (!daemons) {
    KVMESH_ASSIGN_OR_RETURN(ClusterConfig c, ParseConfig(cluster.dump(), "bench-serve"));
    RouterOptions ro;
    ro.tenant_salt = salt;
    ro.timeout_ms = 20000;
    KVMESH_ASSIGN_OR_RETURN(t.embedded, EmbeddedCluster::Start(c, ro));
    return t;
  }
  for (uint32_t e = 0; e < o.engines; ++e) {
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<NetworkClient> c,
                            ConnectEngineClient(daemons->coordinator(), "bench-serve-engine-" + std::to_string(e),
                                                salt, cluster["nodes"].size()));
    t.clients.push_back(std::move(c));
  }
  return t;
}

// What the tier's nodes hold now (bytes as stored, and their raw size): the
// primary tier (`device` when the nodes have one, else `host`), then the host
// and SSD tiers below it.
Result<RunResult::Held> HeldNow(Tier& t, const LocalDaemons* daemons, bool device_primary) {
  std::vector<json> stats;
  if (daemons) {
    KVMESH_ASSIGN_OR_RETURN(stats, daemons->NodeStats());
  } else {
    for (size_t i = 0; i < t.embedded->num_nodes(); ++i) stats.push_back(json::parse(t.embedded->node(i).StatsJson()));
  }
  RunResult::Held h;
  for (const json& s : stats) {
    const double primary = s.value("bytes_stored", 0.0);
    (device_primary ? h.device : h.host) += primary;
    h.logical += s.value("bytes_logical", 0.0);
    if (s.contains("tiers")) {
      const json& tiers = s["tiers"];
      if (tiers.contains("host")) h.host += tiers["host"].value("bytes_stored", 0.0);
      if (tiers.contains("ssd")) h.ssd += tiers["ssd"].value("bytes_stored", 0.0);
    }
  }
  return h;
}

// Seeds the load estimate: the charged time of a 16-block and a 64-block
// get, three each after an untimed warm-up, all Seed()ed into its window, so
// its fixed cost per load and its cost per byte are fitted apart from the
// start (the line through the two sizes' medians until the fit has them);
// its deviation the larger of the slowest 64-block get's excess over their
// median and their mean deviation, as a share of the median (at least 10%),
// so the estimate is above the slowest probe. The first cut took the fastest
// (5-10x optimistic on a loaded machine), the next the slowest with half of
// it as deviation: 2x the slowest, which passed up hits that were 2-4x faster
// than recomputing; the next fitted one cost per byte over a 1-block and a
// 64-block get, and so charged a 64-block get's fixed cost to every byte of a
// bigger load.
Result<std::unique_ptr<LinkEstimate>> ProbeLink(Router& r, const Roofline& model, const BenchServeOptions& o) {
  const uint32_t n = 64;
  std::vector<TokenId> tokens(size_t(n) * o.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = TokenId(7 + i);
  const std::vector<std::byte> payload(r.model().FullBlockBytes(), std::byte{1});
  std::vector<std::span<const std::byte>> blocks(n, std::span<const std::byte>(payload));
  KVMESH_RETURN_IF_ERROR(r.Put(tokens, blocks));
  const std::vector<BlockKey> keys = r.Keys(tokens);
  // Loads land in registered memory, as the engines' do (Engine::LoadLoop).
  KVMESH_ASSIGN_OR_RETURN(const MemoryRegion pool, r.AllocateMemory(payload.size() * n));
  std::fill(pool.base, pool.base + pool.bytes, std::byte{0});
  const std::span<std::byte> dst(pool.base, pool.bytes);
  auto timed_get = [&](size_t count) -> Result<double> {
    std::vector<GetItem> items(count);
    for (size_t i = 0; i < count; ++i) {
      items[i].key = keys[i];
      items[i].dst = std::span<std::byte>(dst.data() + i * payload.size(), payload.size());
    }
    const auto t0 = Clock::now();
    KVMESH_RETURN_IF_ERROR(r.GetBatch(items));
    for (const GetItem& it : items) KVMESH_RETURN_IF_ERROR(it.status);
    return Seconds(Clock::now() - t0) * o.kv_scale;
  };
  // One untimed get of all 64 first: over UCX on one host the first write
  // into each page of freshly registered memory fills this node's page table
  // (10-30 us a page on this VM); the node warms registered memory in the
  // background (PageWarmer), but this probe's pool is fresh. Seeding from
  // such a get made the estimate about 40x pessimistic.
  KVMESH_RETURN_IF_ERROR(timed_get(n).status());
  const uint32_t few = 16;
  std::vector<double> small, many;
  for (int i = 0; i < 3; ++i) {
    KVMESH_ASSIGN_OR_RETURN(double s, timed_get(few));
    small.push_back(s);
    KVMESH_ASSIGN_OR_RETURN(double m, timed_get(n));
    many.push_back(m);
  }
  const double real_block = double(model.model().KvBytesPerToken()) * o.block_tokens;
  const double s50 = Percentile(small, 50), m50 = Percentile(many, 50);
  const double cost = std::max(m50 - s50, 1e-9) / ((n - few) * real_block);
  const double lat = std::max(s50 - few * real_block * cost, 0.0);
  double spread = 0;
  for (double m : many) spread += std::abs(m - m50) / double(many.size());
  const double dev = std::max({Percentile(many, 100) - m50, spread, 0.1 * m50}) / m50;
  auto link = std::make_unique<LinkEstimate>(lat, cost, o.probe_interval_s, dev);
  for (double t : small) link->Seed(few * real_block, t);
  for (double t : many) link->Seed(n * real_block, t);
  return link;
}

// Daemons when the options ask for them (and a kvmesh configuration needs a tier).
std::string WorkDir(const BenchServeOptions& o) {
  return o.work_dir.empty() ? "/tmp/kvmesh-bench-serve-" + std::to_string(::getpid()) : o.work_dir;
}

Result<std::unique_ptr<LocalDaemons>> StartDaemons(const BenchServeOptions& o, const json& cluster,
                                                   const std::string& dir) {
  if (o.cluster == "embedded") return std::unique_ptr<LocalDaemons>();
  if (o.cluster != "daemons") return InvalidArgument("--cluster must be daemons or embedded");
  if (o.kvmesh_bin.empty()) return InvalidArgument("bench-serve: no kvmesh binary to start daemons with");
  return LocalDaemons::Start(o.kvmesh_bin, cluster, dir);
}

RunResult Summarise(const std::string& config, double rate, const std::vector<ServeRequest>& reqs,
                    const std::vector<RequestRecord>& recs, double end_s, const BenchServeOptions& o) {
  RunResult r;
  r.config = config;
  r.rate = rate;
  r.requests = reqs.size();
  if (reqs.empty()) return r;
  r.window_s = std::max(reqs.back().arrival_s - reqs.front().arrival_s, 1e-3);
  r.offered_rps = r.requests / r.window_s;
  std::vector<double> ttft, tpot;
  double prompt = 0, local = 0, loaded = 0, out_tokens = 0, later_prompt = 0, later_hit = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestRecord& x = recs[i];
    const double t = x.first_token >= 0 ? x.first_token - x.arrival : end_s - x.arrival;
    ttft.push_back(t);
    if (x.first_token >= 0) {
      prompt += x.prompt_tokens;
      local += x.local_hit_tokens;
      loaded += x.loaded_tokens;
      if (reqs[i].turn > 0) {
        later_prompt += x.prompt_tokens;
        later_hit += x.local_hit_tokens + x.loaded_tokens;
      }
    }
    if (x.finish < 0) continue;
    ++r.finished;
    out_tokens += x.output_tokens;
    const double per_token = x.output_tokens > 1 ? (x.finish - x.first_token) / (x.output_tokens - 1) : 0;
    if (x.output_tokens > 1) tpot.push_back(per_token);
    if (t <= o.slo_ttft_s && per_token <= o.slo_tpot_s) ++r.met_slo;
  }
  r.ttft = ttft;
  r.ttft_p50 = Percentile(ttft, 50);
  r.ttft_p99 = Percentile(ttft, 99);
  r.tpot_p50 = Percentile(tpot, 50);
  r.tpot_p99 = Percentile(tpot, 99);
  double last_finish = 0;
  for (const RequestRecord& x : recs) last_finish = std::max(last_finish, x.finish);
  const double busy = std::max(last_finish - reqs.front().arrival_s, 1e-3);
  r.req_s = r.finished / busy;
  r.tok_s = out_tokens / busy;
  r.goodput = r.met_slo / r.window_s;
  r.hit_rate = prompt > 0 ? (local + loaded) / prompt : 0;
  r.local_hit_rate = prompt > 0 ? local / prompt : 0;
  r.loaded_rate = prompt > 0 ? loaded / prompt : 0;
  r.later_turn_hit_rate = later_prompt > 0 ? later_hit / later_prompt : 0;
  return r;
}

}  // namespace

Result<std::unique_ptr<NetworkClient>> ConnectEngineClient(const std::string& coordinator, const std::string& client_id,
                                                          const std::string& salt, size_t nodes) {
  NetworkClientOptions no;
  no.coordinator = coordinator;
  no.client_id = client_id;
  no.tenant_salt = salt;
  no.timeout_ms = 20000;
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<NetworkClient> c, NetworkClient::Connect(no));
  // A node prints its listening line before the coordinator lists it: wait
  // for the whole map, or a put meant for a missing node is refused.
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (c->num_nodes() < nodes && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)c->Refresh();
  }
  if (c->num_nodes() < nodes)
    return Unavailable("the coordinator listed " + std::to_string(c->num_nodes()) + " of " + std::to_string(nodes) +
                       " nodes after 10 s");
  return c;
}

Result<EngineModel> LoadEngineModel(const std::string& engine_model, double mfu, double mbu) {
  // The `reference` engine model computes for real (reference.h); its
  // Roofline carries only its shape (KV bytes per token), and its KV (fp32,
  // 2 KiB a token by default) moves at its real size.
  EngineModel m;
  if (IsReferenceModel(engine_model)) {
    KVMESH_ASSIGN_OR_RETURN(m.reference, ReferenceShared::Create(engine_model));
    m.roofline.emplace(m.reference->shape, GpuSpec{"cpu", 1, 1, 0});
  } else {
    KVMESH_ASSIGN_OR_RETURN(Roofline r, Roofline::Parse(engine_model, mfu, mbu));
    m.roofline.emplace(std::move(r));
  }
  return m;
}

// The world-model workload (world_serve.h) runs against the same kvmesh tier
// as the token runs: these hand it out.
Result<json> ServeClusterJson(const BenchServeOptions& o, const Roofline& model) { return ClusterJson(o, model); }

Result<std::unique_ptr<LocalDaemons>> StartServeDaemons(const BenchServeOptions& o, const json& cluster) {
  return StartDaemons(o, cluster, WorkDir(o));
}

namespace {
struct OwnedTier : ServeTier {
  explicit OwnedTier(Tier t) : tier(std::move(t)) {}
  Router& router(size_t engine) override { return tier.router(engine); }
  Tier tier;
};
}  // namespace

Result<std::unique_ptr<ServeTier>> OpenServeTier(const BenchServeOptions& o, const json& cluster,
                                                 const LocalDaemons* daemons, const std::string& salt) {
  KVMESH_ASSIGN_OR_RETURN(Tier t, OpenTier(o, cluster, daemons, salt));
  return std::unique_ptr<ServeTier>(std::make_unique<OwnedTier>(std::move(t)));
}

Result<std::vector<PrefixCheckResult>> RunPrefixCheck(const BenchServeOptions& o,
                                                      const std::vector<uint32_t>& prefix_tokens,
                                                      uint32_t suffix_tokens,
                                                      const std::function<void(uint32_t)>& progress) {
  if (IsReferenceModel(o.engine_model)) return InvalidArgument("--prefix-check needs a roofline engine model");
  KVMESH_ASSIGN_OR_RETURN(const Roofline model, Roofline::Parse(o.engine_model, o.mfu, o.mbu));
  KVMESH_ASSIGN_OR_RETURN(const json cluster, ClusterJson(o, model));
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<LocalDaemons> daemons, StartDaemons(o, cluster, WorkDir(o)));
  BenchServeOptions one = o;
  one.engines = 1;
  KVMESH_ASSIGN_OR_RETURN(Tier tier, OpenTier(one, cluster, daemons.get(),
                                              "prefix-check-" + std::to_string(::getpid())));
  Router& r = tier.router(0);
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<LinkEstimate> link, ProbeLink(r, model, o));
  // Every block's bytes come from one block of registered memory (over UCX
  // the node reads it one-sided: PUT_FROM).
  const size_t block_bytes = r.model().FullBlockBytes();
  KVMESH_ASSIGN_OR_RETURN(const MemoryRegion source, r.AllocateMemory(block_bytes));
  std::fill(source.base, source.base + block_bytes, std::byte{0x33});
  const std::span<const std::byte> payload(source.base, block_bytes);
  const double real_block = double(model.model().KvBytesPerToken()) * o.block_tokens;
  std::vector<PrefixCheckResult> out;
  // The destination is the engine's KV pool: memory registered with the
  // router (AllocateMemory), as an engine registers its pool; over UCX on one
  // host a node writes the blocks straight into it (one-sided, shared memory).
  uint32_t most = 0;
  for (uint32_t asked : prefix_tokens) most = std::max(most, asked / o.block_tokens);
  KVMESH_ASSIGN_OR_RETURN(const MemoryRegion pool, r.AllocateMemory(std::max<size_t>(most, 1) * payload.size()));
  std::fill(pool.base, pool.base + pool.bytes, std::byte{0});  // touched before any clock starts
  // Over UCX on one host each node warms its own mapping of the pool after
  // registering it (PageWarmer, shard_node/server/ucx_rma.h), in the
  // background: an engine registers its pool at start, so its loads meet a
  // warmed pool; the check waits for the same.
  double pool_warm_s = 0;
  if (daemons) {
    KVMESH_ASSIGN_OR_RETURN(pool_warm_s, daemons->WaitWarmed(600));
  }
  TokenId next = 500000;
  for (uint32_t asked : prefix_tokens) {
    PrefixCheckResult x;
    x.pool_warm_s = pool_warm_s;
    const uint32_t blocks = asked / o.block_tokens;
    x.prefix_tokens = blocks * o.block_tokens;
    x.suffix_tokens = suffix_tokens;
    std::vector<TokenId> tokens(x.prefix_tokens + suffix_tokens);
    for (TokenId& t : tokens) t = next++;
    const std::vector<TokenId> prefix(tokens.begin(), tokens.begin() + x.prefix_tokens);
    // Stored in calls of at most 256 blocks (each well inside the timeout),
    // deepest first as Router::Put does.
    const uint32_t chunk = 256;
    for (uint32_t end = blocks; end > 0;) {
      const uint32_t first = end > chunk ? end - chunk : 0;
      std::vector<std::span<const std::byte>> spans(end - first, payload);
      KVMESH_RETURN_IF_ERROR(r.Put(prefix, spans, RequestOptions{}, first));
      end = first;
    }
    if (progress) progress(x.prefix_tokens);
    x.bytes = uint64_t(blocks * real_block);
    x.recompute_ttft_s = model.PrefillSeconds(tokens.size(), 0);
    x.est_recompute_s = model.PrefillSeconds(x.prefix_tokens, 0);
    const std::vector<BlockKey> keys = r.Keys(tokens);
    // One request for the prefix: the lookup, then the load into the pool,
    // decided as an engine decides at the request's arrival (the estimate
    // then, with every earlier load learned) and loaded whatever the decision
    // (the hit is measured; a recomputing engine shadow-loads too).
    using Try = PrefixRequest;
    auto request = [&]() -> Result<Try> {
      Try t;
      t.est_load_s = link->Estimate(x.bytes);
      t.decided_load = t.est_load_s < x.est_recompute_s;
      const auto t0 = Clock::now();
      KVMESH_ASSIGN_OR_RETURN(const size_t hit, r.MatchPrefix(tokens));
      t.lookup_s = Seconds(Clock::now() - t0);
      std::vector<GetItem> items(hit);
      for (size_t i = 0; i < hit; ++i) {
        items[i].key = keys[i];
        items[i].dst = std::span<std::byte>(pool.base + i * payload.size(), payload.size());
      }
      KVMESH_RETURN_IF_ERROR(r.GetInto(items));
      t.got = 0;
      while (t.got < hit && items[t.got].status.ok()) ++t.got;
      t.load_s = t.lookup_s + (Seconds(Clock::now() - t0) - t.lookup_s) * o.kv_scale;
      t.hit_ttft_s = t.load_s + model.PrefillSeconds(tokens.size() - t.got * o.block_tokens, t.got * o.block_tokens);
      t.decided_ttft_s = t.decided_load ? t.hit_ttft_s : x.recompute_ttft_s;
      link->Observe(double(t.got) * real_block, t.load_s);
      return t;
    };
    // The first request after the store, apart: over UCX on this VM its load
    // was 5-17x the next ones' (docs/serving.md "The slow first get"), and
    // one such load is not the link's steady cost.
    KVMESH_ASSIGN_OR_RETURN(x.first, request());
    // Then prefix_reps more; the medians of these are reported (the hit's
    // load with the fastest and slowest beside it, the estimate and the
    // decided TTFT each at its own request).
    std::vector<Try> tries;
    std::vector<double> estimates, decided;
    for (uint32_t rep = 0; rep < std::max<uint32_t>(o.prefix_reps, 1); ++rep) {
      KVMESH_ASSIGN_OR_RETURN(const Try t, request());
      tries.push_back(t);
      estimates.push_back(t.est_load_s);
      decided.push_back(t.decided_ttft_s);
      x.decided_loads += t.decided_load ? 1 : 0;
    }
    x.reps = uint32_t(tries.size());
    std::sort(tries.begin(), tries.end(), [](const Try& a, const Try& b) { return a.load_s < b.load_s; });
    const Try& mid = tries[tries.size() / 2];
    x.lookup_s = mid.lookup_s;
    x.load_s = mid.load_s;
    x.load_min_s = tries.front().load_s;
    x.load_max_s = tries.back().load_s;
    x.blocks_got = mid.got;
    x.hit_ttft_s = mid.hit_ttft_s;
    x.est_load_s = Percentile(estimates, 50);
    x.decided_load = 2 * x.decided_loads > x.reps;
    x.decided_ttft_s = Percentile(decided, 50);
    out.push_back(x);
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(rank)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

Result<std::vector<RunResult>> RunBenchServe(const BenchServeOptions& options, const ServeProgress& progress) {
  BenchServeOptions o = options;
  KVMESH_ASSIGN_OR_RETURN(const EngineModel loaded, LoadEngineModel(o.engine_model, o.mfu, o.mbu));
  const std::shared_ptr<const ReferenceShared> reference = loaded.reference;
  if (reference) o.kv_scale = 1;  // its KV is small: real size
  const Roofline& model = *loaded.roofline;
  std::vector<ConfigKind> kinds;
  bool need_tier = false, need_pressure = false;
  for (const std::string& c : o.configs) {
    KVMESH_ASSIGN_OR_RETURN(ConfigKind k, KindOf(RoutingOf(WithoutProcs(c)).base));
    kinds.push_back(k);
    need_tier |= k.mode == CacheMode::kKvmesh && !k.pressure && k.codec.empty();
    need_pressure |= k.pressure;
  }
  if (o.engines == 0) return InvalidArgument("--engines must be at least 1");
  const std::string dir = WorkDir(o);
  KVMESH_ASSIGN_OR_RETURN(const json cluster, ClusterJson(o, model));
  std::unique_ptr<LocalDaemons> daemons, pressured_daemons;
  if (need_tier) {
    KVMESH_ASSIGN_OR_RETURN(daemons, StartDaemons(o, cluster, dir));
  }
  // One cluster per codec the configurations name.
  std::map<std::string, std::pair<json, std::unique_ptr<LocalDaemons>>> coded;
  for (const ConfigKind& k : kinds) {
    if (k.codec.empty() || coded.count(k.codec)) continue;
    ::mkdir(dir.c_str(), 0755);
    KVMESH_ASSIGN_OR_RETURN(json cj, ClusterJson(o, model, "", k.codec));
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<LocalDaemons> d, StartDaemons(o, cj, dir + "/" + k.codec));
    coded[k.codec] = {std::move(cj), std::move(d)};
  }
  json pressured;
  if (need_pressure) {
    const std::string ssd_dir = dir + "/ssd";
    ::mkdir(dir.c_str(), 0755);
    ::mkdir(ssd_dir.c_str(), 0755);
    KVMESH_ASSIGN_OR_RETURN(pressured, ClusterJson(o, model, ssd_dir));
    KVMESH_ASSIGN_OR_RETURN(pressured_daemons, StartDaemons(o, pressured, ssd_dir));
  }

  std::vector<RunResult> results;
  uint32_t run_no = 0;
  std::vector<ServeRequest> traced;
  std::vector<double> rates = o.rates;
  if (!o.trace_path.empty()) {
    KVMESH_ASSIGN_OR_RETURN(const Trace trace, LoadMooncakeTrace(o.trace_path));
    traced = TraceWorkload(trace, o.trace);
    if (traced.empty())
      return InvalidArgument("--trace " + o.trace_path + ": no request in the window [" +
                             std::to_string(o.trace.start_s) + ", +" + std::to_string(o.trace.duration_s) + ") s");
    rates = {traced.size() / std::max(traced.back().arrival_s - traced.front().arrival_s, 1e-3)};
  }
  for (double rate : rates) {
    WorkloadOptions w = o.workload;
    w.rate = rate;
    const std::vector<ServeRequest> reqs = traced.empty() ? MakeWorkload(w) : traced;
    for (size_t c = 0; c < o.configs.size(); ++c, ++run_no) {
      const std::string label = o.configs[c] + " @ " + std::to_string(rate).substr(0, 5) + " req/s";
      std::optional<Tier> tier;
      std::unique_ptr<LinkEstimate> link;
      double probe_latency = 0, probe_bytes_per_s = 0;
      const json* cj = kinds[c].pressure ? &pressured : &cluster;
      const LocalDaemons* cd = kinds[c].pressure ? pressured_daemons.get() : daemons.get();
      if (!kinds[c].codec.empty()) {
        cj = &coded[kinds[c].codec].first;
        cd = coded[kinds[c].codec].second.get();
      }
      RunResult::Held held_before;
      const std::string salt = "bench-serve-" + std::to_string(::getpid()) + "-" + std::to_string(run_no);
      if (kinds[c].mode == CacheMode::kKvmesh) {
        KVMESH_ASSIGN_OR_RETURN(Tier t, OpenTier(o, *cj, cd, salt));
        tier.emplace(std::move(t));
        KVMESH_ASSIGN_OR_RETURN(link, ProbeLink(tier->router(0), model, o));
        KVMESH_ASSIGN_OR_RETURN(held_before, HeldNow(*tier, cd, (*cj)["nodes"][0]["memory"].contains("device")));
        probe_latency = link->latency_s();
        probe_bytes_per_s = link->bytes_per_s();
      }
      std::vector<RequestRecord> recs(reqs.size());
      for (size_t i = 0; i < reqs.size(); ++i) {
        recs[i].arrival = reqs[i].arrival_s;
        recs[i].prompt_tokens = uint32_t(reqs[i].prompt.size());
        recs[i].output_tokens = uint32_t(reqs[i].output.size());
      }
      const auto run_start = Clock::now();
      auto origin = run_start + std::chrono::milliseconds(100);
      RequestRouter routing(RoutingOf(WithoutProcs(o.configs[c])).routing, o.engines, o.block_tokens, o.max_batch,
                            o.approx_ttl_s);
      const bool as_procs = o.engine_procs || AsProcs(o.configs[c]);
      std::vector<std::unique_ptr<Engine>> engines;
      std::vector<std::unique_ptr<EngineProcess>> procs;
      if (as_procs && o.kvmesh_bin.empty()) return InvalidArgument("--engine-procs: no kvmesh binary to start engines with");
      if (as_procs) {
        // Each engine a `kvmesh serve-engine` child: the same options, the
        // schedule's options (it rebuilds the requests), the run's tenant
        // salt and the probe's estimate as its seed.
        ::mkdir(dir.c_str(), 0755);
        for (uint32_t e = 0; e < o.engines; ++e) {
          EngineProcConfig pc;
          pc.index = e;
          pc.engine_model = o.engine_model;
          pc.mfu = o.mfu;
          pc.mbu = o.mbu;
          pc.block_tokens = o.block_tokens;
          pc.max_batch = o.max_batch;
          pc.kv_scale = o.kv_scale;
          pc.local_cache_blocks = o.local_cache_blocks;
          pc.max_prefill_tokens = o.max_prefill_tokens;
          pc.mode = int(kinds[c].mode);
          pc.policy = int(kinds[c].policy);
          if (kinds[c].mode == CacheMode::kKvmesh) {
            if (!cd) return InvalidArgument("--engine-procs: the kvmesh configurations need --cluster daemons");
            pc.coordinator = cd->coordinator();
            pc.salt = salt;
            pc.nodes = (*cj)["nodes"].size();
            pc.link_latency_s = link->latency_s();
            pc.link_seconds_per_byte = 1.0 / link->bytes_per_s();
            pc.link_deviation_share = link->deviation();
            pc.probe_interval_s = o.probe_interval_s;
          }
          pc.workload = o.workload;
          pc.workload.rate = rate;
          if (!traced.empty()) {
            pc.trace_path = o.trace_path;
            pc.trace = o.trace;
          }
          pc.schedule_hash = ScheduleHash(reqs);
          LocalCacheListener listener = routing.Listener(e);
          pc.kv_events = bool(listener);
          KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<EngineProcess> p,
                                  EngineProcess::Start(o.kvmesh_bin, pc,
                                                       dir + "/engine-" + std::to_string(run_no) + "-" +
                                                           std::to_string(e) + ".log",
                                                       std::move(listener), 60));
          procs.push_back(std::move(p));
        }
        origin = Clock::now() + std::chrono::milliseconds(100);
        for (auto& p : procs) KVMESH_RETURN_IF_ERROR(p->Begin(origin));
      }
      for (uint32_t e = 0; e < o.engines && !as_procs; ++e) {
        EngineOptions eo;
        eo.model = &model;
        eo.reference = reference;
        eo.block_tokens = o.block_tokens;
        eo.local_cache_blocks = o.local_cache_blocks;
        eo.max_batch = o.max_batch;
        eo.max_prefill_tokens = o.max_prefill_tokens;
        eo.mode = kinds[c].mode;
        eo.policy = kinds[c].policy;
        eo.router = tier ? &tier->router(e) : nullptr;
        eo.link = link.get();
        eo.kv_scale = o.kv_scale;
        eo.origin = origin;
        eo.on_local_cache = routing.Listener(e);
        engines.push_back(std::make_unique<Engine>(e, eo, &reqs, &recs));
        engines.back()->Start();
      }
      auto finished = [&] {
        uint64_t f = 0;
        for (auto& e : engines) f += e->finished();
        for (auto& p : procs) f += p->finished();
        return f;
      };
      // A child that died ends the run with its report (not a wait for its requests).
      std::string died;
      auto dead = [&] {
        for (auto& p : procs)
          if (died.empty()) died = p->death();
        return !died.empty();
      };
      std::atomic<uint64_t> arrived{0};
      std::atomic<bool> stop_progress{false};
      std::thread ticker([&] {
        while (!stop_progress.load()) {
          if (progress) progress(label, arrived.load(), finished(), reqs.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(250));
        }
      });
      std::vector<uint64_t> submitted(o.engines, 0), in_flight(o.engines, 0);
      for (size_t i = 0; i < reqs.size() && !dead(); ++i) {  // open loop: arrivals never wait for the engines
        std::this_thread::sleep_until(origin + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(reqs[i].arrival_s)));
        for (size_t e = 0; e < o.engines; ++e)
          in_flight[e] = submitted[e] - (procs.empty() ? engines[e]->finished() : procs[e]->finished());
        const uint32_t to = routing.Pick(reqs[i], in_flight);
        ++submitted[to];
        if (procs.empty()) engines[to]->Submit(i);
        else procs[to]->Submit(i);
        arrived.fetch_add(1);
      }
      for (auto& e : engines) e->Finish();
      for (auto& p : procs) p->Finish();
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(o.drain_s));
      while (finished() < reqs.size() && Clock::now() < deadline && !dead())
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const double end_s = Seconds(Clock::now() - origin);
      for (auto& e : engines) e->Abort();
      DecisionCounters d;
      for (auto& e : engines) {
        e->Join();
        d.Add(e->counters());
      }
      for (auto& p : procs) {  // each stops, reports its requests and counters, and exits
        const Status s = p->Collect(&recs, 30);
        if (!s.ok() && died.empty()) died = s.ToString();
        d.Add(p->counters());
      }
      stop_progress.store(true);
      ticker.join();
      if (!died.empty()) return Unavailable(died + " (run " + label + ")");
      if (progress) progress(label, reqs.size(), finished(), reqs.size());
      RunResult r = Summarise(o.configs[c], rate, reqs, recs, end_s, o);
      r.decisions = d;
      r.routing = routing.counters();
      if (link && !procs.empty()) {  // each child learned its own estimate: engine 0's
        r.link_latency_s = procs[0]->link_latency_s;
        r.link_bytes_per_s = procs[0]->link_bytes_per_s;
        r.link_deviation = procs[0]->link_deviation;
      } else if (link) {
        r.link_latency_s = link->latency_s();
        r.link_bytes_per_s = link->bytes_per_s();
        r.link_deviation = link->deviation();
      }
      if (tier) {  // after Join: every put of the run was answered
        KVMESH_ASSIGN_OR_RETURN(const RunResult::Held after,
                                HeldNow(*tier, cd, (*cj)["nodes"][0]["memory"].contains("device")));
        r.held.device = (after.device - held_before.device) * o.kv_scale;
        r.held.host = (after.host - held_before.host) * o.kv_scale;
        r.held.ssd = (after.ssd - held_before.ssd) * o.kv_scale;
        r.held.logical = (after.logical - held_before.logical) * o.kv_scale;
        r.codec = kinds[c].codec.empty() ? "none" : kinds[c].codec;
      }
      r.probe_latency_s = probe_latency;
      r.probe_bytes_per_s = probe_bytes_per_s;
      r.run.resize(recs.size());
      std::vector<double> path;
      for (size_t i = 0; i < recs.size(); ++i) {
        r.run[i] = recs[i].run;
        if (recs[i].recompute_path_s <= 0 || recs[i].first_token < 0) continue;
        const double ratio = recs[i].kvmesh_path_s / recs[i].recompute_path_s;
        ++r.path_lookups;
        r.path_lookups_over += ratio > 1.05;
        if (recs[i].run == 0) continue;
        ++r.path_hits;
        r.path_hits_over += ratio > 1.05;
        path.push_back(ratio);
      }
      r.path_ratio_p50 = Percentile(path, 50);
      r.path_ratio_p99 = Percentile(path, 99);
      r.path_ratio_max = path.empty() ? 0 : *std::max_element(path.begin(), path.end());
      r.seconds = Seconds(Clock::now() - run_start);
      results.push_back(std::move(r));
    }
  }
  return results;
}

}  // namespace kvmesh::serve
