#include "coordinator/etcd_client.h"

#include "common/bounded_json.h"
#include "common/credentials.h"
#include "transport/fd_tls_client.h"
#include "transport/socket_util.h"

namespace kvmesh {

using nlohmann::json;

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdConfig& etcd, const TlsConfig& tls) {
  if (etcd.endpoints.empty()) return InvalidArgument("$.coordinator.etcd.endpoints: no etcd member");
  std::unique_ptr<EtcdClient> c(new EtcdClient());
  c->config_ = etcd;
  c->endpoints_ = etcd.endpoints;
  c->tokens_.assign(etcd.endpoints.size(), "");
  if (etcd.tls) {
    TlsClientOptions t;  // etcd's --client-cert-auth checks this certificate (docs/security.md)
    t.ca = tls.ca;
    t.cert = tls.cert;
    t.key = tls.key;
    t.verify_hostname = tls.verify_hostname;
    KVMESH_ASSIGN_OR_RETURN(c->http_.tls, TlsClientContext::Create(t));
  }
  return c;
}

Result<HttpResult> EtcdClient::Post(size_t member, const std::string& call, const std::string& body) {
  std::string host;
  uint16_t port = 0;
  KVMESH_RETURN_IF_ERROR(SplitHostPort(endpoints_[member], &host, &port));
  HttpRequestOptions h = http_;
  if (!config_.user.empty()) {
    if (tokens_[member].empty()) {
      const json auth = {{"name", config_.user}, {"password", config_.password}};
      KVMESH_ASSIGN_OR_RETURN(HttpResult a, HttpRequest(host, port, "POST", "/v3/auth/authenticate", auth.dump(),
                                                        config_.request_timeout_ms, http_));
      if (a.status != 200)
        return PermissionDenied("etcd " + endpoints_[member] + " refused user " + config_.user + ": HTTP " +
                                std::to_string(a.status) + " " + a.body.substr(0, 200));
      json t = ParseBoundedJson(a.body).value_or(json());
      if (!t.is_object() || !t.contains("token") || !t["token"].is_string())
        return Unavailable("etcd " + endpoints_[member] + ": authenticate answered no token");
      tokens_[member] = t["token"].get<std::string>();
    }
    h.authorization = tokens_[member];
  }
  return HttpRequest(host, port, "POST", "/v3/" + call, body, config_.request_timeout_ms, h);
}

Result<json> EtcdClient::Call(const std::string& call, const json& body) {
  const std::string text = body.dump();
  Status last = Unavailable("no etcd member");
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t m = (current_ + i) % endpoints_.size();
    Result<HttpResult> r = Post(m, call, text);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kPermissionDenied) return r.status();
      last = r.status().WithContext("etcd " + endpoints_[m]);
      continue;
    }
    json a = ParseBoundedJson(r->body).value_or(json());
    if (r->status == 200 && a.is_object()) {
      current_ = m;
      return a;
    }
    const std::string error = a.is_object() && a.contains("error") && a["error"].is_string()
                                  ? a["error"].get<std::string>()
                                  : r->body.substr(0, 200);
    if (error.find("invalid auth token") != std::string::npos) tokens_[m].clear();  // expired: log in again next time
    if (r->status == 401 || r->status == 403 || error.find("permission denied") != std::string::npos)
      return PermissionDenied("etcd " + endpoints_[m] + " /v3/" + call + ": " + error);
    if (r->status < 500 && error.find("invalid auth token") == std::string::npos)
      return InvalidArgument("etcd " + endpoints_[m] + " /v3/" + call + ": HTTP " + std::to_string(r->status) + " " +
                             error);
    last = Unavailable("etcd " + endpoints_[m] + " /v3/" + call + ": HTTP " + std::to_string(r->status) + " " + error);
  }
  return last;
}

int64_t EtcdClient::Int(const json& j, const char* field) {
  if (!j.is_object()) return 0;
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  try {
    return std::stoll(it->get<std::string>());
  } catch (...) {
    return 0;
  }
}

std::vector<EtcdKv> EtcdClient::ParseKvs(const json& a) {
  std::vector<EtcdKv> out;
  if (!a.is_object() || !a.contains("kvs") || !a["kvs"].is_array()) return out;
  for (const json& k : a["kvs"]) {
    EtcdKv kv;
    kv.key = Base64Decode(k.value("key", "")).value_or("");
    kv.value = Base64Decode(k.value("value", "")).value_or("");
    kv.create_revision = Int(k, "create_revision");
    kv.mod_revision = Int(k, "mod_revision");
    kv.lease = Int(k, "lease");
    out.push_back(std::move(kv));
  }
  return out;
}

Result<std::optional<EtcdKv>> EtcdClient::Get(const std::string& key) {
  KVMESH_ASSIGN_OR_RETURN(json a, Call("kv/range", {{"key", Base64Encode(key)}}));
  std::vector<EtcdKv> kvs = ParseKvs(a);
  if (kvs.empty()) return std::optional<EtcdKv>();
  return std::optional<EtcdKv>(std::move(kvs[0]));
}

Result<std::vector<EtcdKv>> EtcdClient::GetPrefix(const std::string& prefix) {
  // range_end: the prefix with its last byte plus one (every key that starts with it).
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return InvalidArgument("etcd prefix must not be empty");
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  KVMESH_ASSIGN_OR_RETURN(json a, Call("kv/range", {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(end)}}));
  return ParseKvs(a);
}

Result<int64_t> EtcdClient::Grant(int64_t ttl_s) {
  KVMESH_ASSIGN_OR_RETURN(json a, Call("lease/grant", {{"TTL", ttl_s}}));
  const int64_t id = Int(a, "ID");
  if (id == 0) return Unavailable("etcd lease/grant answered no ID: " + a.dump().substr(0, 200));
  return id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  KVMESH_ASSIGN_OR_RETURN(json a, Call("lease/keepalive", {{"ID", std::to_string(lease)}}));
  return Int(a.value("result", json()), "TTL");
}

Status EtcdClient::Revoke(int64_t lease) {
  Result<json> a = Call("lease/revoke", {{"ID", std::to_string(lease)}});
  // An expired lease is gone already.
  if (!a.ok() && a.status().message().find("requested lease not found") == std::string::npos) return a.status();
  return Status::Ok();
}

Result<json> EtcdClient::Txn(const json& txn) {
  KVMESH_ASSIGN_OR_RETURN(json a, Call("kv/txn", txn));
  a["succeeded"] = a.value("succeeded", false);
  return a;
}

json EtcdClient::PutOp(const std::string& key, const std::string& value, int64_t lease) {
  json put = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return {{"request_put", put}};
}

json EtcdClient::DeleteOp(const std::string& key) { return {{"request_delete_range", {{"key", Base64Encode(key)}}}}; }

json EtcdClient::RangeOp(const std::string& key) { return {{"request_range", {{"key", Base64Encode(key)}}}}; }

json EtcdClient::Equal(const std::string& key, const std::string& target, const std::string& value) {
  return {{"key", Base64Encode(key)}, {"target", target}, {"result", "EQUAL"}, {"value", Base64Encode(value)}};
}

json EtcdClient::Equal(const std::string& key, const std::string& target, int64_t revision) {
  const char* field = target == "CREATE" ? "create_revision" : target == "MOD" ? "mod_revision" : "version";
  return {{"key", Base64Encode(key)}, {"target", target}, {"result", "EQUAL"}, {field, std::to_string(revision)}};
}

}  // namespace kvmesh
