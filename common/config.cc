#include "kvmesh/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/bounded_json.h"
#include "common/config_auth.h"
#include "common/json_reader.h"

namespace kvmesh {
namespace {

using nlohmann::json;

constexpr size_t kMaxConfigDepth = 64;  // the deepest real config is 4 levels

std::string Idx(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

Status ReadModel(const json& j, ModelSpec* m) {
  ObjectReader r(j, "$.model");
  std::string dtype = "fp16";
  r.Required("model_id", &m->model_id)
      .Required("num_layers", &m->num_layers)
      .Required("num_kv_heads", &m->num_kv_heads)
      .Required("head_dim", &m->head_dim)
      .Optional("dtype", &dtype)
      .Required("block_tokens", &m->block_tokens)
      .Optional("num_experts", &m->num_experts);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  Result<DType> dt = ParseDType(dtype);
  if (!dt.ok()) return InvalidArgument("$.model.dtype: " + dt.status().message());
  m->dtype = *dt;
  if (m->model_id.empty()) return InvalidArgument("$.model.model_id: must not be empty");
  if (m->num_layers == 0) return InvalidArgument("$.model.num_layers: must be > 0");
  if (m->num_kv_heads == 0) return InvalidArgument("$.model.num_kv_heads: must be > 0");
  if (m->head_dim == 0) return InvalidArgument("$.model.head_dim: must be > 0");
  if (m->block_tokens == 0) return InvalidArgument("$.model.block_tokens: must be > 0 (got 0)");
  return Status::Ok();
}

Status ReadNode(const json& j, const std::string& path, NodeConfig* n) {
  ObjectReader r(j, path);
  r.Required("id", &n->id).Optional("host", &n->host).Optional("gpu", &n->gpu).Optional("weight", &n->weight);
  if (const json* p = r.Child("ports")) {
    ObjectReader pr(*p, r.PathOf("ports"));
    pr.Optional("data", &n->ports.data).Optional("http", &n->ports.http).Optional("resp", &n->ports.resp);
    KVMESH_RETURN_IF_ERROR(pr.Finish());
  }
  if (const json* m = r.Child("memory", /*required=*/true)) {
    ObjectReader mr(*m, r.PathOf("memory"));
    mr.Size("device", &n->memory.device, false)
        .Size("host", &n->memory.host, false)
        .Size("ssd", &n->memory.ssd, false)
        .Optional("ssd_path", &n->memory.ssd_path);
    KVMESH_RETURN_IF_ERROR(mr.Finish());
    if (n->memory.device == 0 && n->memory.host == 0)
      return InvalidArgument(r.PathOf("memory") + ": needs a device or host budget");
    if (n->memory.ssd != 0 && n->memory.ssd_path.empty())
      return InvalidArgument(r.PathOf("memory.ssd_path") + ": required when memory.ssd is set");
  }
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (n->id.empty()) return InvalidArgument(r.PathOf("id") + ": must not be empty");
  if (!(n->weight > 0)) return InvalidArgument(r.PathOf("weight") + ": must be > 0");
  return Status::Ok();
}

// Parses 3 or "3" or "0-7" (inclusive) into a half-open range.
bool ParseValueRange(const json& v, Range* out) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    uint64_t x = v.get<uint64_t>();
    if (x >= UINT32_MAX) return false;
    *out = {static_cast<uint32_t>(x), static_cast<uint32_t>(x + 1)};
    return true;
  }
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  size_t dash = s.find('-');
  try {
    size_t used = 0;
    unsigned long a = std::stoul(s.substr(0, dash), &used);
    if (used != (dash == std::string::npos ? s.size() : dash)) return false;
    unsigned long b = a;
    if (dash != std::string::npos) {
      std::string tail = s.substr(dash + 1);
      b = std::stoul(tail, &used);
      if (used != tail.size()) return false;
    }
    if (b < a || b >= UINT32_MAX) return false;
    *out = {static_cast<uint32_t>(a), static_cast<uint32_t>(b + 1)};
    return true;
  } catch (...) {
    return false;
  }
}

Status ReadPlacement(const json& j, const std::map<std::string, std::string>& node_paths,
                     PlacementConfig* p) {
  ObjectReader r(j, "$.placement");
  r.Optional("replicas", &p->replicas);
  if (const json* g = r.Child("groups")) {
    const std::string gpath = r.PathOf("groups");
    if (!g->is_object()) return InvalidArgument(gpath + ": expected an object, got " + JsonTypeName(*g));
    for (auto it = g->begin(); it != g->end(); ++it) {
      const std::string path = gpath + "." + it.key();
      if (!it->is_array() || it->empty())
        return InvalidArgument(path + ": expected a non-empty array of node ids");
      std::vector<std::string> ids;
      for (size_t i = 0; i < it->size(); ++i) {
        const json& id = (*it)[i];
        if (!id.is_string()) return InvalidArgument(Idx(path, i) + ": expected a node id string, got " + JsonTypeName(id));
        std::string s = id.get<std::string>();
        if (!node_paths.count(s))
          return InvalidArgument(Idx(path, i) + ": shard group \"" + it.key() + "\" names unknown node \"" + s + "\"");
        ids.push_back(std::move(s));
      }
      p->groups[it.key()] = std::move(ids);
    }
  }
  if (const json* a = r.Child("affinity")) {
    const std::string apath = r.PathOf("affinity");
    if (!a->is_array()) return InvalidArgument(apath + ": expected an array, got " + JsonTypeName(*a));
    for (size_t i = 0; i < a->size(); ++i) {
      const std::string path = Idx(apath, i);
      ObjectReader ar((*a)[i], path);
      AffinityRule rule;
      ar.Required("group", &rule.group);
      int kinds = 0;
      for (auto [name, kind] : {std::pair{"expert", Affinity::Kind::kExpert},
                                std::pair{"layer_group", Affinity::Kind::kLayerGroup},
                                std::pair{"rank", Affinity::Kind::kRank}}) {
        if (const json* v = ar.Child(name)) {
          ++kinds;
          rule.kind = kind;
          if (!ParseValueRange(*v, &rule.values))
            return InvalidArgument(ar.PathOf(name) + ": expected a non-negative integer or \"a-b\" range, got " + v->dump());
        }
      }
      KVMESH_RETURN_IF_ERROR(ar.Finish());
      if (kinds != 1) return InvalidArgument(path + ": needs exactly one of expert, layer_group, rank");
      if (!p->groups.count(rule.group))
        return InvalidArgument(ar.PathOf("group") + ": unknown shard group \"" + rule.group + "\"");
      p->affinity.push_back(std::move(rule));
    }
  }
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (p->replicas == 0) return InvalidArgument("$.placement.replicas: must be >= 1");
  return Status::Ok();
}

Status ReadTransport(const json& j, TransportConfig* t) {
  ObjectReader r(j, "$.transport");
  r.Optional("backend", &t->backend)
      .Optional("io_threads", &t->io_threads)
      .Size("max_frame_bytes", &t->max_frame_bytes, false)
      .Optional("max_batch_items", &t->max_batch_items)
      .Optional("connections_per_node", &t->connections_per_node)
      .Optional("timeout_ms", &t->timeout_ms)
      .Optional("connect_timeout_ms", &t->connect_timeout_ms);
  if (const json* u = r.Child("ucx")) {
    ObjectReader ur(*u, "$.transport.ucx");
    ur.Optional("progress", &t->ucx_progress).Optional("spin_us", &t->ucx_spin_us).Optional("workers", &t->ucx_workers)
        .Optional("local_reads", &t->ucx_local_reads);
    KVMESH_RETURN_IF_ERROR(ur.Finish());
    if (std::find(kUcxProgressModes.begin(), kUcxProgressModes.end(), t->ucx_progress) == kUcxProgressModes.end()) {
      std::string expected;
      for (size_t i = 0; i < kUcxProgressModes.size(); ++i)
        expected += (i == 0 ? "\"" : i + 1 == kUcxProgressModes.size() ? " or \"" : ", \"") +
                    std::string(kUcxProgressModes[i]) + "\"";
      return InvalidArgument("$.transport.ucx.progress: expected " + expected + ", got \"" + t->ucx_progress + "\"");
    }
    if (t->ucx_spin_us < 0 || t->ucx_spin_us > 1000000)
      return InvalidArgument("$.transport.ucx.spin_us: must be in 0..1000000");
    if (t->ucx_workers < 0 || t->ucx_workers > 64)
      return InvalidArgument("$.transport.ucx.workers: must be in 0..64 (0: one per core, up to 4)");
  }
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (t->backend != "tcp" && t->backend != "ucx")
    return InvalidArgument("$.transport.backend: expected \"tcp\" or \"ucx\", got \"" + t->backend + "\"");
  if (t->io_threads == 0 || t->io_threads > 64) return InvalidArgument("$.transport.io_threads: must be in 1..64");
  if (t->max_frame_bytes < 4096 || t->max_frame_bytes > (1ull << 31))
    return InvalidArgument("$.transport.max_frame_bytes: must be in 4KiB..2GiB");
  if (t->max_batch_items == 0 || t->max_batch_items > (1u << 20))
    return InvalidArgument("$.transport.max_batch_items: must be in 1..1048576");
  if (t->connections_per_node == 0 || t->connections_per_node > 64)
    return InvalidArgument("$.transport.connections_per_node: must be in 1..64");
  if (t->timeout_ms <= 0) return InvalidArgument("$.transport.timeout_ms: must be > 0");
  if (t->connect_timeout_ms <= 0) return InvalidArgument("$.transport.connect_timeout_ms: must be > 0");
  return Status::Ok();
}

Status ReadTiers(const json& j, TierConfig* t) {
  ObjectReader r(j, "$.eviction.tiers");
  r.Optional("high_watermark", &t->high_watermark)
      .Optional("low_watermark", &t->low_watermark)
      .Optional("offload_idle_s", &t->offload_idle_s)
      .Optional("promote_on_hit", &t->promote_on_hit)
      .Optional("host_policy", &t->host_policy)
      .Optional("ssd_policy", &t->ssd_policy)
      .Optional("interval_ms", &t->interval_ms);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (!(t->high_watermark > 0 && t->high_watermark <= 1))
    return InvalidArgument("$.eviction.tiers.high_watermark: must be in (0, 1]");
  if (!(t->low_watermark > 0 && t->low_watermark < t->high_watermark))
    return InvalidArgument("$.eviction.tiers.low_watermark: must be in (0, high_watermark)");
  if (t->offload_idle_s < 0) return InvalidArgument("$.eviction.tiers.offload_idle_s: must be >= 0");
  if (t->interval_ms == 0 || t->interval_ms > 60000)
    return InvalidArgument("$.eviction.tiers.interval_ms: must be in 1..60000");
  return Status::Ok();
}

Status ReadPressure(const json& j, PressureConfig* p) {
  ObjectReader r(j, "$.eviction.pressure");
  r.Optional("enabled", &p->enabled)
      .Optional("max_level", &p->max_level)
      .Optional("evict_fraction", &p->evict_fraction)
      .Optional("reencode_codec", &p->reencode_codec);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (p->max_level > 3) return InvalidArgument("$.eviction.pressure.max_level: must be in 0..3");
  if (!(p->evict_fraction > 0 && p->evict_fraction <= 1))
    return InvalidArgument("$.eviction.pressure.evict_fraction: must be in (0, 1]");
  return Status::Ok();
}

// A non-empty array of "host:port" strings (at most 64).
Status ReadAddressList(const json& j, const std::string& path, std::vector<std::string>* out) {
  if (!j.is_array() || j.empty() || j.size() > 64)
    return InvalidArgument(path + ": must be an array of 1 to 64 \"host:port\" strings");
  out->clear();
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) return InvalidArgument(at + ": expected a \"host:port\" string, got " + JsonTypeName(j[i]));
    const std::string a = j[i].get<std::string>();
    const size_t colon = a.rfind(':');
    const std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
    if (colon == 0 || !digits || std::stoul(port) == 0 || std::stoul(port) > 65535)
      return InvalidArgument(at + ": must be \"host:port\" with a port in 1..65535, got \"" + a.substr(0, 80) + "\"");
    out->push_back(a);
  }
  return Status::Ok();
}

Status ReadEtcd(const json& j, EtcdConfig* e) {
  ObjectReader r(j, "$.coordinator.etcd");
  if (const json* a = r.Child("endpoints", /*required=*/true))
    KVMESH_RETURN_IF_ERROR(ReadAddressList(*a, "$.coordinator.etcd.endpoints", &e->endpoints));
  r.Optional("prefix", &e->prefix)
      .Optional("lease_ms", &e->lease_ms)
      .Optional("request_timeout_ms", &e->request_timeout_ms)
      .Optional("user", &e->user)
      .Optional("password", &e->password)
      .Optional("tls", &e->tls);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (e->lease_ms < 1000 || e->lease_ms > 600000)
    return InvalidArgument("$.coordinator.etcd.lease_ms: must be in 1000..600000 (etcd leases count whole seconds)");
  if (e->request_timeout_ms <= 0 || e->request_timeout_ms >= e->lease_ms)
    return InvalidArgument("$.coordinator.etcd.request_timeout_ms: must be > 0 and less than lease_ms");
  if (!e->prefix.empty() && e->prefix.back() != '/')
    return InvalidArgument("$.coordinator.etcd.prefix: must end with '/'");
  if (e->user.empty() != e->password.empty())
    return InvalidArgument("$.coordinator.etcd." + std::string(e->user.empty() ? "user" : "password") +
                           ": user and password go together");
  return Status::Ok();
}

Status ReadCoordinator(const json& j, CoordinatorConfig* c) {
  ObjectReader r(j, "$.coordinator");
  r.Optional("host", &c->host)
      .Optional("port", &c->port)
      .Optional("heartbeat_ms", &c->heartbeat_ms)
      .Optional("dead_after_ms", &c->dead_after_ms);
  if (const json* a = r.Child("addresses"))
    KVMESH_RETURN_IF_ERROR(ReadAddressList(*a, "$.coordinator.addresses", &c->addresses));
  if (const json* e = r.Child("etcd")) KVMESH_RETURN_IF_ERROR(ReadEtcd(*e, &c->etcd));
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (c->host.empty()) return InvalidArgument("$.coordinator.host: must not be empty");
  if (c->heartbeat_ms <= 0) return InvalidArgument("$.coordinator.heartbeat_ms: must be > 0");
  if (c->dead_after_ms <= c->heartbeat_ms)
    return InvalidArgument("$.coordinator.dead_after_ms: must be larger than heartbeat_ms");
  return Status::Ok();
}

// Syntax of a codec string: a known codec name, then :gN, :rN, :kivi,
// :token or :channel options (kernels::ParseCodecSpec checks the semantics
// when a node builds the codec; tests keep the two in step).
bool ValidCodecString(const std::string& s, bool allow_none) {
  static const char* const kNames[] = {"raw", "fp16", "bf16", "int8", "int4", "fp8-e4m3", "fp8-e5m2", "lowrank"};
  const size_t colon = s.find(':');
  const std::string name = s.substr(0, colon);
  if (allow_none && s == "none") return true;
  if (std::find(std::begin(kNames), std::end(kNames), name) == std::end(kNames)) return false;
  for (size_t i = colon; i != std::string::npos && i < s.size();) {
    const size_t next = s.find(':', i + 1);
    const std::string opt = s.substr(i + 1, next == std::string::npos ? std::string::npos : next - i - 1);
    const bool numbered = opt.size() > 1 && (opt[0] == 'g' || opt[0] == 'r') &&
                          opt.find_first_not_of("0123456789", 1) == std::string::npos && opt.size() < 10;
    if (!numbered && opt != "kivi" && opt != "token" && opt != "channel") return false;
    i = next;
  }
  return true;
}

Status ReadCodec(const json& j, uint32_t num_layers, CodecConfig* c) {
  ObjectReader r(j, "$.codec");
  r.Optional("codec", &c->codec)
      .Optional("lossless", &c->lossless)
      .Optional("zstd_level", &c->zstd_level)
      .Optional("basis", &c->basis)
      .Optional("threads", &c->threads);
  if (const json* rules = r.Child("layers")) {
    const std::string rpath = r.PathOf("layers");
    if (!rules->is_array()) return InvalidArgument(rpath + ": expected an array, got " + JsonTypeName(*rules));
    for (size_t i = 0; i < rules->size(); ++i) {
      const std::string path = Idx(rpath, i);
      ObjectReader rr((*rules)[i], path);
      CodecLayerRule rule;
      rr.Required("codec", &rule.codec);
      const json* v = rr.Child("layers", /*required=*/true);
      KVMESH_RETURN_IF_ERROR(rr.Finish());
      if (!ParseValueRange(*v, &rule.layers))
        return InvalidArgument(path + ".layers: expected a layer index or \"a-b\" range, got " + v->dump());
      if (rule.layers.end > num_layers)
        return InvalidArgument(path + ".layers: the model has " + std::to_string(num_layers) + " layers");
      if (!ValidCodecString(rule.codec, false))
        return InvalidArgument(path + ".codec: unknown codec \"" + rule.codec + "\"");
      for (size_t k = 0; k < c->layers.size(); ++k)
        if (c->layers[k].layers.begin < rule.layers.end && rule.layers.begin < c->layers[k].layers.end)
          return InvalidArgument(path + ".layers: overlaps " + Idx(rpath, k));
      c->layers.push_back(std::move(rule));
    }
  }
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (!ValidCodecString(c->codec, true)) return InvalidArgument("$.codec.codec: unknown codec \"" + c->codec + "\"");
  if (c->lossless != "none" && c->lossless != "lz4" && c->lossless != "zstd")
    return InvalidArgument("$.codec.lossless: expected none, lz4 or zstd, got \"" + c->lossless + "\"");
  if (c->zstd_level < 1 || c->zstd_level > 22) return InvalidArgument("$.codec.zstd_level: must be in 1..22");
  if (c->threads > 256) return InvalidArgument("$.codec.threads: must be in 0..256");
  const bool lowrank = c->codec.rfind("lowrank", 0) == 0 ||
                       std::any_of(c->layers.begin(), c->layers.end(),
                                   [](const CodecLayerRule& l) { return l.codec.rfind("lowrank", 0) == 0; });
  if (lowrank && c->basis.empty()) return InvalidArgument("$.codec.basis: required by the lowrank codec");
  if (c->codec == "none" && !c->layers.empty())
    return InvalidArgument("$.codec.codec: layer rules need a codec for the other layers (not \"none\")");
  return Status::Ok();
}

Status ReadResp(const json& j, RespConfig* r) {
  ObjectReader rr(j, "$.resp");
  rr.Size("max_value_bytes", &r->max_value_bytes, false).Optional("hash_tags", &r->hash_tags).Optional("tls", &r->tls);
  rr.Optional("cluster", &r->cluster);
  if (const json* g = rr.Child("group_suffixes")) {
    if (!g->is_array()) return InvalidArgument("$.resp.group_suffixes: expected an array of strings, got " + JsonTypeName(*g));
    if (g->size() > 16) return InvalidArgument("$.resp.group_suffixes: at most 16 suffixes");
    r->group_suffixes.clear();
    for (size_t i = 0; i < g->size(); ++i) {
      const json& e = (*g)[i];
      const std::string path = Idx("$.resp.group_suffixes", i);
      if (!e.is_string()) return InvalidArgument(path + ": expected a string, got " + JsonTypeName(e));
      std::string sfx = e.get<std::string>();
      if (sfx.empty() || sfx.size() > 64) return InvalidArgument(path + ": must be 1..64 bytes");
      r->group_suffixes.push_back(std::move(sfx));
    }
  }
  KVMESH_RETURN_IF_ERROR(rr.Finish());
  if (r->max_value_bytes > (1ull << 30))
    return InvalidArgument("$.resp.max_value_bytes: at most 1GiB, got " + std::to_string(r->max_value_bytes));
  if (r->cluster && !r->hash_tags)
    return InvalidArgument(
        "$.resp.hash_tags: must stay true with $.resp.cluster (Redis Cluster clients place keys by their hash tags)");
  return Status::Ok();
}

Status ReadSequences(const json& j, SequencesConfig* q) {
  ObjectReader r(j, "$.sequences");
  r.Optional("idle_timeout_ms", &q->idle_timeout_ms)
      .Optional("max_sequences", &q->max_sequences)
      .Optional("max_slices", &q->max_slices)
      .Optional("max_sequence_tokens", &q->max_sequence_tokens);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  constexpr int64_t kMaxIdleMs = int64_t{30} * 24 * 3600 * 1000;
  if (q->idle_timeout_ms <= 0 || q->idle_timeout_ms > kMaxIdleMs)
    return InvalidArgument("$.sequences.idle_timeout_ms: must be in 1.." + std::to_string(kMaxIdleMs) + " (30 days), got " +
                           std::to_string(q->idle_timeout_ms));
  if (q->max_sequences == 0 || q->max_sequences > (1u << 24))
    return InvalidArgument("$.sequences.max_sequences: must be in 1..16777216, got " + std::to_string(q->max_sequences));
  if (q->max_slices == 0 || q->max_slices > 65536)
    return InvalidArgument("$.sequences.max_slices: must be in 1..65536, got " + std::to_string(q->max_slices));
  if (q->max_sequence_tokens == 0 || q->max_sequence_tokens > (1u << 30))
    return InvalidArgument("$.sequences.max_sequence_tokens: must be in 1..1073741824, got " +
                           std::to_string(q->max_sequence_tokens));
  return Status::Ok();
}

Status ReadEvents(const json& j, EventsConfig* e) {
  ObjectReader r(j, "$.events");
  r.Optional("enabled", &e->enabled)
      .Optional("host", &e->host)
      .Optional("port", &e->port)
      .Optional("replay_port", &e->replay_port)
      .Optional("replay_buffer", &e->replay_buffer)
      .Optional("queue_events", &e->queue_events)
      .Optional("max_batch_events", &e->max_batch_events)
      .Optional("topic", &e->topic)
      .Optional("hash", &e->hash);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (e->host.empty()) return InvalidArgument("$.events.host: must not be empty");
  if (e->port != 0 && e->port == e->replay_port)
    return InvalidArgument("$.events.replay_port: must differ from $.events.port (" + std::to_string(e->port) + ")");
  if (e->replay_buffer == 0 || e->replay_buffer > (1u << 20))
    return InvalidArgument("$.events.replay_buffer: must be in 1..1048576 batches, got " +
                           std::to_string(e->replay_buffer));
  if (e->queue_events < 16 || e->queue_events > (1u << 24))
    return InvalidArgument("$.events.queue_events: must be in 16..16777216, got " + std::to_string(e->queue_events));
  if (e->max_batch_events == 0 || e->max_batch_events > 65536)
    return InvalidArgument("$.events.max_batch_events: must be in 1..65536, got " +
                           std::to_string(e->max_batch_events));
  if (e->hash != "bytes" && e->hash != "int")
    return InvalidArgument("$.events.hash: must be \"bytes\" or \"int\", got \"" + e->hash + "\"");
  return Status::Ok();
}

Status ReadFrames(const json& j, FramesConfig* f) {
  ObjectReader r(j, "$.frames");
  r.Optional("window", &f->window)
      .Optional("ssim_threshold", &f->ssim_threshold)
      .Optional("change_threshold", &f->change_threshold)
      .Optional("pixel_delta", &f->pixel_delta)
      .Optional("recompute_radius", &f->recompute_radius)
      .Optional("refresh_deviation", &f->refresh_deviation)
      .Optional("max_age", &f->max_age)
      .Optional("motion_radius", &f->motion_radius);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (f->window == 0 || f->window > 1024)
    return InvalidArgument("$.frames.window: must be in 1..1024, got " + std::to_string(f->window));
  if (!(f->ssim_threshold >= -1 && f->ssim_threshold <= 1))
    return InvalidArgument("$.frames.ssim_threshold: must be in [-1, 1], got " + std::to_string(f->ssim_threshold));
  if (!(f->change_threshold >= 0 && f->change_threshold <= 1))
    return InvalidArgument("$.frames.change_threshold: must be in [0, 1], got " + std::to_string(f->change_threshold));
  if (f->pixel_delta > 255)
    return InvalidArgument("$.frames.pixel_delta: must be in 0..255, got " + std::to_string(f->pixel_delta));
  if (f->recompute_radius > 64)
    return InvalidArgument("$.frames.recompute_radius: must be in 0..64, got " + std::to_string(f->recompute_radius));
  if (!(f->refresh_deviation >= 0 && f->refresh_deviation <= 100))
    return InvalidArgument("$.frames.refresh_deviation: must be in [0, 100], got " +
                           std::to_string(f->refresh_deviation));
  if (f->motion_radius > 4)
    return InvalidArgument("$.frames.motion_radius: must be in 0..4, got " + std::to_string(f->motion_radius));
  return Status::Ok();
}

Status ReadLimits(const json& j, LimitsConfig* l) {
  ObjectReader r(j, "$.limits");
  r.Optional("max_connections", &l->max_connections)
      .Optional("max_connections_per_peer", &l->max_connections_per_peer)
      .Size("preauth_max_bytes", &l->preauth_max_bytes, false)
      .Optional("handshake_timeout_ms", &l->handshake_timeout_ms)
      .Optional("read_timeout_ms", &l->read_timeout_ms)
      .Optional("write_timeout_ms", &l->write_timeout_ms)
      .Optional("idle_timeout_ms", &l->idle_timeout_ms)
      .Size("max_pending_answer_bytes", &l->max_pending_answer_bytes, false);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  constexpr int64_t kDay = int64_t{24} * 3600 * 1000;
  auto range = [](const char* key, int64_t v, int64_t lo, int64_t hi, const char* what) -> Status {
    if (v < lo || v > hi)
      return InvalidArgument(std::string("$.limits.") + key + ": must be in " + std::to_string(lo) + ".." +
                             std::to_string(hi) + what + ", got " + std::to_string(v));
    return Status::Ok();
  };
  KVMESH_RETURN_IF_ERROR(range("max_connections", l->max_connections, 1, 1 << 20, ""));
  KVMESH_RETURN_IF_ERROR(range("max_connections_per_peer", l->max_connections_per_peer, 1, 1 << 20, ""));
  if (l->max_connections_per_peer > l->max_connections)
    return InvalidArgument("$.limits.max_connections_per_peer: must be at most max_connections (" +
                           std::to_string(l->max_connections) + "), got " + std::to_string(l->max_connections_per_peer));
  if (l->preauth_max_bytes < 1024 || l->preauth_max_bytes > (16u << 20))
    return InvalidArgument("$.limits.preauth_max_bytes: must be in 1KiB..16MiB, got " + std::to_string(l->preauth_max_bytes));
  KVMESH_RETURN_IF_ERROR(range("handshake_timeout_ms", l->handshake_timeout_ms, 1, kDay, " (1 day)"));
  KVMESH_RETURN_IF_ERROR(range("read_timeout_ms", l->read_timeout_ms, 1, kDay, " (1 day)"));
  KVMESH_RETURN_IF_ERROR(range("write_timeout_ms", l->write_timeout_ms, 1, kDay, " (1 day)"));
  KVMESH_RETURN_IF_ERROR(range("idle_timeout_ms", l->idle_timeout_ms, 0, 30 * kDay, " (0: never; 30 days)"));
  if (l->max_pending_answer_bytes < (64u << 10) || l->max_pending_answer_bytes > (1ull << 32))
    return InvalidArgument("$.limits.max_pending_answer_bytes: must be in 64KiB..4GiB, got " +
                           std::to_string(l->max_pending_answer_bytes));
  return Status::Ok();
}

}  // namespace

const NodeConfig* ClusterConfig::FindNode(std::string_view id) const {
  for (const auto& n : nodes)
    if (n.id == id) return &n;
  return nullptr;
}

Result<ClusterConfig> ParseConfig(std::string_view text, std::string_view source) {
  // No real config is more than a few levels deep; a deeper one is refused
  // before anything copies or dumps its values into a message (both recurse
  // once per level: 200,000 levels overflowed the stack).
  Result<json> bounded = ParseBoundedJson(text, kMaxConfigDepth, /*ignore_comments=*/true);
  if (!bounded.ok() && bounded.status().message() != "not valid JSON")
    return InvalidArgument("$: " + bounded.status().message());
  json j = bounded.ok() ? std::move(bounded).value() : json(json::value_t::discarded);
  if (j.is_discarded()) {
    // Re-parse with exceptions only to get the position of the syntax error.
    try {
      json again = json::parse(text.begin(), text.end(), nullptr, true, true);
      (void)again;
    } catch (const json::exception& e) {  // parse_error, and out_of_range for a number no double holds
      return InvalidArgument("$: not valid JSON (" + std::string(e.what()) + ")");
    }
    return InvalidArgument("$: not valid JSON");
  }
  ClusterConfig c;
  c.source = std::string(source);
  ObjectReader r(j, "$");
  r.Optional("name", &c.name);
  if (const json* m = r.Child("model", /*required=*/true)) KVMESH_RETURN_IF_ERROR(ReadModel(*m, &c.model));
  std::map<std::string, std::string> node_paths;
  if (const json* nodes = r.Child("nodes", /*required=*/true)) {
    if (!nodes->is_array()) return InvalidArgument("$.nodes: expected an array, got " + JsonTypeName(*nodes));
    if (nodes->empty()) return InvalidArgument("$.nodes: needs at least one node");
    for (size_t i = 0; i < nodes->size(); ++i) {
      NodeConfig n;
      const std::string path = Idx("$.nodes", i);
      KVMESH_RETURN_IF_ERROR(ReadNode((*nodes)[i], path, &n));
      auto [it, inserted] = node_paths.emplace(n.id, path + ".id");
      if (!inserted)
        return InvalidArgument(path + ".id: duplicate node id \"" + n.id + "\" (first at " + it->second + ")");
      c.nodes.push_back(std::move(n));
    }
  }
  if (const json* s = r.Child("store")) {
    ObjectReader sr(*s, "$.store");
    sr.Optional("stripes", &c.store.stripes)
        .Size("slot_bytes", &c.store.slot_bytes, false)
        .Optional("size_classes", &c.store.size_classes)
        .Optional("verify_checksums", &c.store.verify_checksums);
    KVMESH_RETURN_IF_ERROR(sr.Finish());
    if (c.store.size_classes == 0 || c.store.size_classes > 8)
      return InvalidArgument("$.store.size_classes: must be in 1..8 (1: fixed slots), got " +
                             std::to_string(c.store.size_classes));
    if (c.store.stripes == 0 || (c.store.stripes & (c.store.stripes - 1)) != 0 || c.store.stripes > 256)
      return InvalidArgument("$.store.stripes: must be a power of two in 1..256");
  }
  if (const json* e = r.Child("eviction")) {
    ObjectReader er(*e, "$.eviction");
    er.Optional("policy", &c.eviction.policy)
        .Optional("priority_classes", &c.eviction.priority_classes)
        .Optional("aging_s", &c.eviction.aging_s)
        .Optional("shadow_sample_floor", &c.eviction.shadow_sample_floor);
    if (const json* t = er.Child("tiers")) KVMESH_RETURN_IF_ERROR(ReadTiers(*t, &c.eviction.tiers));
    if (const json* p = er.Child("pressure")) KVMESH_RETURN_IF_ERROR(ReadPressure(*p, &c.eviction.pressure));
    KVMESH_RETURN_IF_ERROR(er.Finish());
    if (c.eviction.priority_classes == 0 || c.eviction.priority_classes > kMaxPriorityClasses)
      return InvalidArgument("$.eviction.priority_classes: must be in 1.." + std::to_string(kMaxPriorityClasses));
    if (c.eviction.aging_s < 0) return InvalidArgument("$.eviction.aging_s: must be >= 0");
  }
  if (const json* p = r.Child("placement")) KVMESH_RETURN_IF_ERROR(ReadPlacement(*p, node_paths, &c.placement));
  if (const json* t = r.Child("transport")) KVMESH_RETURN_IF_ERROR(ReadTransport(*t, &c.transport));
  if (const json* k = r.Child("coordinator")) KVMESH_RETURN_IF_ERROR(ReadCoordinator(*k, &c.coordinator));
  if (const json* a = r.Child("auth")) KVMESH_RETURN_IF_ERROR(ReadAuth(*a, &c.auth));
  if (const json* t = r.Child("tls")) KVMESH_RETURN_IF_ERROR(ReadTls(*t, &c.tls));
  if (const json* k = r.Child("resp")) KVMESH_RETURN_IF_ERROR(ReadResp(*k, &c.resp));
  if (const json* k = r.Child("codec")) KVMESH_RETURN_IF_ERROR(ReadCodec(*k, c.model.num_layers, &c.codec));
  if (const json* q = r.Child("sequences")) KVMESH_RETURN_IF_ERROR(ReadSequences(*q, &c.sequences));
  if (const json* l = r.Child("limits")) KVMESH_RETURN_IF_ERROR(ReadLimits(*l, &c.limits));
  if (const json* e = r.Child("events")) KVMESH_RETURN_IF_ERROR(ReadEvents(*e, &c.events));
  if (const json* f = r.Child("frames")) KVMESH_RETURN_IF_ERROR(ReadFrames(*f, &c.frames));
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (c.coordinator.etcd.tls && !c.tls.enabled())
    return InvalidArgument("$.coordinator.etcd.tls: needs $.tls (its ca, cert and key are what etcd sees)");
  if (c.coordinator.etcd.enabled() && c.coordinator.etcd.prefix.empty())
    c.coordinator.etcd.prefix = "/kvmesh/" + c.name + "/";
  if (c.store.slot_bytes != 0 && c.store.slot_bytes < 64)
    return InvalidArgument("$.store.slot_bytes: must be at least 64 bytes");
  return c;
}

Result<ClusterConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus("cannot open config " + path, errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  Result<ClusterConfig> c = ParseConfig(ss.str(), path);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

}  // namespace kvmesh
