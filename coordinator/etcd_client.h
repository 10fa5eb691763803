// coordinator/etcd_client.h — a small client of etcd's v3 API through its
// JSON gateway (POST /v3/<service>/<call>, keys and values base64 in JSON,
// 64-bit integers as strings), over the control plane's HTTP client
// (transport/http_client.h), for the coordinators of $.coordinator.etcd.
//
// Facts relied on (etcd 3.4.23, Debian 12; gateway paths and base64 from
// https://etcd.io/docs/v3.4/dev-guide/api_grpc_gateway/, checked against a
// running etcd 3.4.23): etcd 3.4 serves the gateway at [CLIENT-URL]/v3/*;
// POST /v3/kv/range {"key","range_end"} -> {"header":{"revision"},"kvs":[{"key",
// "value","create_revision","mod_revision","lease"}]}; /v3/kv/put; /v3/kv/txn
// {"compare":[{"key","target":"CREATE"|"MOD"|"VALUE","result":"EQUAL",...}],
// "success":[{"request_put":{...}}],"failure":[...]} -> {"succeeded"}, with
// "succeeded" left out when false; /v3/kv/deleterange; /v3/lease/grant {"TTL"}
// -> {"ID","TTL"}, TTLs below etcd's minimum (2 s with default election
// settings) raised to it; /v3/lease/keepalive {"ID"} -> a chunked stream
// {"result":{"ID","TTL"}}, "TTL" left out once the lease has expired;
// /v3/lease/revoke {"ID"}; /v3/auth/authenticate {"name","password"} ->
// {"token"}, then sent as the bare `Authorization` header value. A simple
// token is only known to the member that issued it, so each member gets its
// own. Errors come back as a non-200 status with {"error","code"}.
//
// Every call goes to the member that answered last and, when that one cannot
// be reached or answers 5xx (no leader, a timeout inside etcd), to each other
// member in turn. Blocking: never call it from an I/O thread.
//
// Thread-safety: not thread-safe; one owner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "transport/http_client.h"

namespace kvmesh {

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  // `tls`: the cluster's $.tls, used when etcd.tls is set.
  static Result<std::unique_ptr<EtcdClient>> Create(const EtcdConfig& etcd, const TlsConfig& tls);

  // POST /v3/<call> with `body`; the answer's JSON. Unavailable when no
  // member answers 200 (the last error), PermissionDenied on an auth error.
  Result<nlohmann::json> Call(const std::string& call, const nlohmann::json& body);

  Result<std::optional<EtcdKv>> Get(const std::string& key);
  Result<std::vector<EtcdKv>> GetPrefix(const std::string& prefix);
  // A new lease of `ttl_s` seconds (or etcd's minimum): its ID.
  Result<int64_t> Grant(int64_t ttl_s);
  // Renews `lease`: its TTL in seconds, 0 when it has expired.
  Result<int64_t> KeepAlive(int64_t lease);
  Status Revoke(int64_t lease);
  // Runs a transaction ({"compare","success","failure"}); the answer, whose
  // "succeeded" is made explicit.
  Result<nlohmann::json> Txn(const nlohmann::json& txn);

  // Pieces of requests, keys and values as bytes.
  static nlohmann::json PutOp(const std::string& key, const std::string& value, int64_t lease = 0);
  static nlohmann::json DeleteOp(const std::string& key);
  static nlohmann::json RangeOp(const std::string& key);
  // Compares `target` ("CREATE", "MOD", "VALUE") of `key` for equality.
  static nlohmann::json Equal(const std::string& key, const std::string& target, const std::string& value);
  static nlohmann::json Equal(const std::string& key, const std::string& target, int64_t revision);
  // The key-values of a range answer ({"kvs": [...]}).
  static std::vector<EtcdKv> ParseKvs(const nlohmann::json& range_answer);
  // An int64 the gateway sent as a string (or a number); 0 when absent.
  static int64_t Int(const nlohmann::json& j, const char* field);

  // The member that answered last ("host:port").
  const std::string& current() const { return endpoints_[current_]; }

 private:
  EtcdClient() = default;
  Result<HttpResult> Post(size_t member, const std::string& call, const std::string& body);

  EtcdConfig config_;
  std::vector<std::string> endpoints_;
  HttpRequestOptions http_;           // TLS context; Authorization set per member
  std::vector<std::string> tokens_;   // per member: its auth token ("" = none yet)
  size_t current_ = 0;
};

}  // namespace kvmesh
