#include "common/config_auth.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "common/json_reader.h"

namespace kvmesh {
namespace {

using nlohmann::json;

constexpr size_t kMaxSecretBytes = 256;  // a HELLO carries at most 256 bytes of token
constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMaxTenants = 4096;

// Names go into logs, metric labels and `user:password` pairs: a plain alphabet, no ':'.
bool PlainName(const std::string& s) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return false;
  return true;
}

Status ReadTenant(const json& j, const std::string& path, TenantConfig* t) {
  ObjectReader r(j, path);
  std::string token, password;
  r.Required("name", &t->name).Optional("token", &token).Optional("password", &password);
  r.Size("quota", &t->quota_bytes, /*required=*/false).Optional("namespace", &t->ns);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (!PlainName(t->name))
    return InvalidArgument(path + ".name: must be 1.." + std::to_string(kMaxNameBytes) +
                           " characters of A-Z a-z 0-9 . _ -, got \"" + t->name.substr(0, 80) + "\"");
  if (!token.empty() && !password.empty())
    return InvalidArgument(path + ": give \"token\" or \"password\", not both");
  if (j.contains("token") && token.empty()) return InvalidArgument(path + ".token: must not be empty");
  if (j.contains("password") && password.empty()) return InvalidArgument(path + ".password: must not be empty");
  t->token = token.empty() ? password : token;
  if (t->token.empty()) return InvalidArgument(path + ": needs a \"token\" (or \"password\")");
  const std::string secret_path = path + (token.empty() ? ".password" : ".token");
  if (t->token.size() > kMaxSecretBytes)
    return InvalidArgument(secret_path + ": at most " + std::to_string(kMaxSecretBytes) + " bytes");
  if (t->ns.empty() && j.contains("namespace")) return InvalidArgument(path + ".namespace: must not be empty");
  if (t->ns.empty()) t->ns = t->name;
  if (!PlainName(t->ns))
    return InvalidArgument(path + ".namespace: must be 1.." + std::to_string(kMaxNameBytes) +
                           " characters of A-Z a-z 0-9 . _ -");
  return Status::Ok();
}

}  // namespace

Status ReadAuth(const json& j, AuthConfig* a) {
  ObjectReader r(j, "$.auth");
  r.Optional("token", &a->token);
  const json* tenants = r.Child("tenants");
  KVMESH_RETURN_IF_ERROR(r.Finish());
  if (a->token.size() > kMaxSecretBytes)
    return InvalidArgument("$.auth.token: at most " + std::to_string(kMaxSecretBytes) + " bytes");
  if (tenants == nullptr) return Status::Ok();
  if (!tenants->is_array()) return InvalidArgument("$.auth.tenants: expected an array, got " + JsonTypeName(*tenants));
  if (tenants->size() > kMaxTenants)
    return InvalidArgument("$.auth.tenants: at most " + std::to_string(kMaxTenants) + " tenants");
  if (!tenants->empty() && a->token.empty())
    return InvalidArgument(
        "$.auth.tenants: needs $.auth.token, the cluster secret that nodes, the control plane and admin tools use");
  std::map<std::string, std::string> seen;  // name -> path
  for (size_t i = 0; i < tenants->size(); ++i) {
    const std::string path = "$.auth.tenants[" + std::to_string(i) + "]";
    TenantConfig t;
    KVMESH_RETURN_IF_ERROR(ReadTenant((*tenants)[i], path, &t));
    auto [it, inserted] = seen.emplace(t.name, path + ".name");
    if (!inserted)
      return InvalidArgument(path + ".name: duplicate tenant \"" + t.name + "\" (first at " + it->second + ")");
    if (t.token == a->token)
      return InvalidArgument(path + ": its secret must differ from $.auth.token (it would hold the cluster's keys)");
    a->tenants.push_back(std::move(t));
  }
  return Status::Ok();
}

Status ReadTls(const json& j, TlsConfig* t) {
  ObjectReader r(j, "$.tls");
  r.Required("cert", &t->cert).Required("key", &t->key).Required("ca", &t->ca);
  r.Optional("client_auth", &t->client_auth).Optional("verify_hostname", &t->verify_hostname);
  KVMESH_RETURN_IF_ERROR(r.Finish());
  for (const auto& [key, path] : {std::pair<const char*, const std::string*>{"cert", &t->cert},
                                  {"key", &t->key}, {"ca", &t->ca}}) {
    if (path->empty()) return InvalidArgument(r.PathOf(key) + ": must name a PEM file");
    if (::access(path->c_str(), R_OK) != 0)  // access, not open: never blocks on a FIFO
      return InvalidArgument(r.PathOf(key) + ": cannot read \"" + *path + "\": " + std::strerror(errno));
  }
  if (t->client_auth != "none" && t->client_auth != "admin" && t->client_auth != "all")
    return InvalidArgument(r.PathOf("client_auth") + ": must be \"none\", \"admin\" or \"all\", got \"" +
                           t->client_auth.substr(0, 40) + "\"");
  return Status::Ok();
}

const TenantConfig* AuthConfig::FindTenant(std::string_view name) const {
  for (const TenantConfig& t : tenants)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace kvmesh
