// libFuzzer target for the coordinator's control API: raw bytes from a
// client go through the HTTP/1.1 request parser the daemons use (Boost.Beast,
// 1 MiB body limit, as transport/http_server.cc), then every parsed request
// reaches the coordinator's handlers (coordinator/membership.cc: auth, the
// JSON bodies of /register, /heartbeat, /leave, the map). The map it then
// publishes must parse back and build (router/map_json.cc), as every router
// does with it; the raw bytes are also tried as a map.
// Half the inputs run against a cluster secret ("fuzz-secret") and tenants,
// half without one, so the handlers behind the auth check are reached too.
// Build and run (clang only): fuzz/build.sh && build-fuzz/bin/fuzz_coordinator -dict=fuzz/coordinator.dict
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "coordinator/membership.h"
#include "router/map_json.h"

using namespace kvmesh;
namespace http = boost::beast::http;

namespace {

ClusterConfig Config(bool secret) {
  auto c = ParseConfig(R"({
    "model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_tokens": 16, "num_experts": 8},
    "nodes": [{"id": "n0", "memory": {"host": "1MiB"}}, {"id": "n1", "memory": {"host": "1MiB"}}],
    "placement": {"replicas": 2, "groups": {"g": ["n0", "n1"]}, "affinity": [{"expert": "0-3", "group": "g"}]},
    "auth": {"token": "fuzz-secret", "tenants": [{"name": "t1", "token": "t1-pass", "quota": "1MiB"}]}
  })");
  if (!c.ok()) __builtin_trap();
  if (!secret) c->auth = AuthConfig{};
  return *c;
}

void CheckMap(Membership& m, const std::string& authorization) {
  HttpServerRequest get{"GET", "/map", "", authorization, "fuzz"};
  HttpServerResponse r = m.Handle(get);
  if (r.status != 200) return;
  Result<PublishedMap> pm = ParsePublishedMap(r.body);
  if (!pm.ok()) __builtin_trap();  // the coordinator published a map its routers refuse
  (void)BuildShardMap(*pm);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const ClusterConfig with_secret = Config(true), without = Config(false);
  const bool secret = data[0] & 1;
  Membership m(secret ? with_secret : without, [](const std::string&) {});
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Requests one after another, as on a keep-alive connection.
  for (int i = 0; i < 64 && !in.empty(); ++i) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(1u << 20);
    parser.eager(true);
    boost::beast::error_code ec;
    const size_t used = parser.put(boost::asio::buffer(in.data(), in.size()), ec);
    if (!ec && !parser.is_done()) {  // the rest of the input is all there is
      parser.put_eof(ec);
    }
    if (ec || !parser.is_done()) break;
    auto& req = parser.get();
    HttpServerRequest r{std::string(req.method_string()), std::string(req.target()), req.body(),
                        std::string(req[http::field::authorization]), "fuzz"};
    HttpServerResponse out = m.Handle(r);
    if (out.status < 200 || out.status > 599) __builtin_trap();
    if (used == 0 || used > in.size()) break;
    in.remove_prefix(used);
  }
  CheckMap(m, secret ? "Bearer fuzz-secret" : "");
  (void)ParsePublishedMap(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
