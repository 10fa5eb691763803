#include "router/map_json.h"

#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/json_reader.h"

namespace kvmesh {
namespace {

using nlohmann::json;

const char* KindName(Affinity::Kind k) {
  switch (k) {
    case Affinity::Kind::kExpert: return "expert";
    case Affinity::Kind::kLayerGroup: return "layer_group";
    case Affinity::Kind::kRank: return "rank";
    default: return "none";
  }
}

}  // namespace

std::string PublishedMapToJson(const PublishedMap& m) {
  json model = {{"model_id", m.model.model_id},       {"num_layers", m.model.num_layers},
                {"num_kv_heads", m.model.num_kv_heads}, {"head_dim", m.model.head_dim},
                {"dtype", std::string(DTypeName(m.model.dtype))}, {"block_tokens", m.model.block_tokens},
                {"num_experts", m.model.num_experts}};
  json groups = json::object();
  for (const auto& [name, ids] : m.placement.groups) groups[name] = ids;
  json affinity = json::array();
  for (const AffinityRule& r : m.placement.affinity)
    affinity.push_back({{"kind", KindName(r.kind)}, {"begin", r.values.begin}, {"end", r.values.end}, {"group", r.group}});
  json nodes = json::array();
  for (const ShardInfo& n : m.nodes) {
    json nj = {{"id", n.id}, {"host", n.host}, {"weight", n.weight},
               {"ports", {{"data", n.ports.data}, {"http", n.ports.http}, {"resp", n.ports.resp}}}};
    if (auto it = m.ucx_addresses.find(n.id); it != m.ucx_addresses.end()) nj["ucx"] = it->second;
    nodes.push_back(std::move(nj));
  }
  return json{{"epoch", m.epoch}, {"model", model}, {"replicas", m.placement.replicas}, {"transport", m.backend},
              {"groups", groups}, {"affinity", affinity}, {"nodes", nodes}}
      .dump();
}

Result<PublishedMap> ParsePublishedMap(std::string_view text) {
  // Bounded in depth (common/bounded_json.h): the map comes over the network.
  Result<json> parsed = ParseBoundedJson(text, kMaxNetworkJsonDepth);
  if (!parsed.ok()) return InvalidArgument("shard map: " + parsed.status().message());
  const json j = std::move(parsed).value();
  PublishedMap m;
  ObjectReader r(j, "$");
  r.Required("epoch", &m.epoch).Required("replicas", &m.placement.replicas).Optional("transport", &m.backend);
  if (const json* mj = r.Child("model", true)) {
    ObjectReader mr(*mj, "$.model");
    std::string dtype;
    mr.Required("model_id", &m.model.model_id)
        .Required("num_layers", &m.model.num_layers)
        .Required("num_kv_heads", &m.model.num_kv_heads)
        .Required("head_dim", &m.model.head_dim)
        .Required("dtype", &dtype)
        .Required("block_tokens", &m.model.block_tokens)
        .Optional("num_experts", &m.model.num_experts);
    KVMESH_RETURN_IF_ERROR(mr.Finish());
    KVMESH_ASSIGN_OR_RETURN(m.model.dtype, ParseDType(dtype));
    KVMESH_RETURN_IF_ERROR(m.model.Validate());
  }
  if (const json* g = r.Child("groups", true)) {
    if (!g->is_object()) return InvalidArgument("$.groups: expected an object");
    for (auto it = g->begin(); it != g->end(); ++it) {
      if (!it->is_array()) return InvalidArgument("$.groups." + it.key() + ": expected an array");
      std::vector<std::string> ids;
      for (const json& id : *it) {
        if (!id.is_string()) return InvalidArgument("$.groups." + it.key() + ": expected node id strings");
        ids.push_back(id.get<std::string>());
      }
      m.placement.groups[it.key()] = std::move(ids);
    }
  }
  if (const json* a = r.Child("affinity", true)) {
    if (!a->is_array()) return InvalidArgument("$.affinity: expected an array");
    for (size_t i = 0; i < a->size(); ++i) {
      ObjectReader ar((*a)[i], "$.affinity[" + std::to_string(i) + "]");
      AffinityRule rule;
      std::string kind;
      ar.Required("kind", &kind).Required("begin", &rule.values.begin).Required("end", &rule.values.end).Required("group", &rule.group);
      KVMESH_RETURN_IF_ERROR(ar.Finish());
      if (kind == "expert") rule.kind = Affinity::Kind::kExpert;
      else if (kind == "layer_group") rule.kind = Affinity::Kind::kLayerGroup;
      else if (kind == "rank") rule.kind = Affinity::Kind::kRank;
      else return InvalidArgument("$.affinity[" + std::to_string(i) + "].kind: unknown \"" + kind + "\"");
      m.placement.affinity.push_back(std::move(rule));
    }
  }
  if (const json* n = r.Child("nodes", true)) {
    if (!n->is_array()) return InvalidArgument("$.nodes: expected an array");
    for (size_t i = 0; i < n->size(); ++i) {
      const std::string path = "$.nodes[" + std::to_string(i) + "]";
      ObjectReader nr((*n)[i], path);
      ShardInfo s;
      std::string ucx;
      nr.Required("id", &s.id).Required("host", &s.host).Required("weight", &s.weight).Optional("ucx", &ucx);
      if (const json* p = nr.Child("ports", true)) {
        ObjectReader pr(*p, path + ".ports");
        pr.Required("data", &s.ports.data).Optional("http", &s.ports.http).Optional("resp", &s.ports.resp);
        KVMESH_RETURN_IF_ERROR(pr.Finish());
      }
      KVMESH_RETURN_IF_ERROR(nr.Finish());
      if (!ucx.empty()) m.ucx_addresses[s.id] = ucx;
      m.nodes.push_back(std::move(s));
    }
  }
  KVMESH_RETURN_IF_ERROR(r.Finish());
  return m;
}

Result<std::shared_ptr<const ShardMap>> BuildShardMap(const PublishedMap& m) {
  return ShardMap::Build(m.epoch, m.nodes, m.placement.groups, m.placement.affinity, m.placement.replicas);
}

}  // namespace kvmesh
