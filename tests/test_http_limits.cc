// The control plane's HTTP limits against real daemons (issue 39, findings 9
// and 10): a `kvmesh coordinator` and a `kvmesh node` (its HTTP port runs the
// same server code) on 127.0.0.1, ports chosen at run time, with a cluster
// secret. Requests are written byte by byte on raw sockets, so a test can send
// a request's head and no body, and see whether the answer comes before it.
//
//  * a heartbeat nested 100,000 levels deep is refused (400) and the
//    coordinator keeps serving /stats; a heartbeat's stats keep only the
//    counters the coordinator sums;
//  * bad credentials with a large body are answered 401/403 at the header,
//    without the body (the client sends only the head);
//  * an Authorization only in a chunked trailer is refused;
//  * `Transfer-Encoding: chunked, identity` and other ambiguous framings are
//    refused;
//  * a body larger than the route's limit is refused at its header (413);
//  * existing clients (the nodes' heartbeats, GET /map, curl) keep working.
//
// KVMESH_BIN_UNDER_TEST=/path/to/kvmesh runs the same checks against another
// build of the daemons (how these tests were shown to fail before the fix).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "cluster_process.h"
#include "test_time.h"
#include "common/credentials.h"
#include "transport/http_client.h"

using namespace kvmesh;
using kvmesh::testing::Process;
using kvmesh::testing::TimeBound;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "limits-s3cret";

std::string Bin() {
  const char* e = std::getenv("KVMESH_BIN_UNDER_TEST");
  return e != nullptr && *e != '\0' ? std::string(e) : std::string(KVMESH_BIN);
}

// daemons-local.json plus $.auth, in a temporary file removed on destruction.
struct SecretConfig {
  std::string path;
  SecretConfig() {
    static int n = 0;
    auto j = nlohmann::json::parse(std::ifstream(std::string(KVMESH_SOURCE_DIR) + "/cluster_configs/daemons-local.json"));
    j["auth"] = {{"token", kSecret}};
    j["coordinator"]["dead_after_ms"] = 5000;  // members a test registers by hand live through its checks
    path = "/tmp/kvmesh-limits-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".json";
    std::ofstream(path) << j.dump();
  }
  ~SecretConfig() { ::unlink(path.c_str()); }
};

HttpRequestOptions Secret() {
  HttpRequestOptions o;
  o.authorization = BearerAuthorization(kSecret);
  return o;
}

struct RawResponse {
  int status = 0;
  std::string head;  // status line and fields
  std::string body;
};

// One client connection on which a test writes exactly the bytes it wants.
class Raw {
 public:
  explicit Raw(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  bool connected() const { return connected_; }

  // False when the server closed or reset the connection (or the deadline passed).
  bool Send(std::string_view bytes, std::chrono::milliseconds timeout = TimeBound(5s)) {
    const auto end = SteadyClock::now() + timeout;
    while (!bytes.empty()) {
      pollfd p{fd_, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()).count();
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The next whole answer (head and Content-Length bytes of body), or nullopt
  // when none has come by the deadline or the server closed first.
  std::optional<RawResponse> Read(std::chrono::milliseconds timeout = TimeBound(3s)) {
    const auto end = SteadyClock::now() + timeout;
    for (;;) {
      const size_t he = buf_.find("\r\n\r\n");
      if (he != std::string::npos) {
        RawResponse r;
        r.head = buf_.substr(0, he + 2);
        r.status = std::atoi(r.head.c_str() + r.head.find(' ') + 1);
        size_t len = 0;
        std::string lower = r.head;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (size_t p = lower.find("\r\ncontent-length:"); p != std::string::npos)
          len = std::strtoull(r.head.c_str() + p + 17, nullptr, 10);
        if (buf_.size() >= he + 4 + len) {
          r.body = buf_.substr(he + 4, len);
          buf_.erase(0, he + 4 + len);
          return r;
        }
      }
      if (!Fill(end)) return std::nullopt;
    }
  }

  // True when the server closes the connection (EOF or reset) by the
  // deadline; bytes it sends meanwhile are kept for Read.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    const auto end = SteadyClock::now() + timeout;
    while (Fill(end)) {
    }
    return eof_;
  }

 private:
  // Reads what has come; false at EOF, on an error (eof_ set) or at the deadline.
  bool Fill(SteadyClock::time_point end) {
    if (eof_) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char b[65536];
    const ssize_t n = ::recv(fd_, b, sizeof b, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(b, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buf_;
};

std::string Chunked(std::string_view body) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", body.size());
  return std::string(size) + std::string(body) + "\r\n";
}

// A coordinator and node n0 (no RESP front), both with the cluster secret.
struct Cluster {
  SecretConfig cfg;
  Process coord, node;
  uint16_t coord_port = 0, node_http = 0;

  Cluster() {
    REQUIRE(coord.Start({Bin(), "coordinator", "--config", cfg.path, "--port", "0"}, /*merge_stderr=*/true));
    auto c = coord.WaitEvent("listening", TimeBound(10s));
    REQUIRE(c);
    coord_port = (*c)["ports"]["http"].get<uint16_t>();
    REQUIRE(node.Start({Bin(), "node", "--config", cfg.path, "--id", "n0", "--coordinator",
                        "127.0.0.1:" + std::to_string(coord_port), "--no-resp"},
                       /*merge_stderr=*/true));
    auto n = node.WaitEvent("listening", TimeBound(10s));
    REQUIRE(n);
    node_http = (*n)["ports"]["http"].get<uint16_t>();
    // n0 has joined and its first heartbeat has reported its counters.
    const auto end = SteadyClock::now() + TimeBound(10s);
    for (;;) {
      nlohmann::json s = Stats();
      if (s["live_nodes"] == 1 && s["nodes"].contains("n0") && s["nodes"]["n0"].contains("blocks")) break;
      REQUIRE(SteadyClock::now() < end);
      std::this_thread::sleep_for(50ms);
    }
  }

  Result<HttpResult> Call(const std::string& method, const std::string& target, const std::string& body,
                          uint16_t port = 0) {
    return HttpRequest("127.0.0.1", port ? port : coord_port, method, target, body, 3000, Secret());
  }
  nlohmann::json Stats() {
    auto r = Call("GET", "/stats", "");
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    return nlohmann::json::parse(r->body);
  }
  nlohmann::json Nodes() {
    auto r = Call("GET", "/nodes", "");
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    return nlohmann::json::parse(r->body);
  }
  std::string Policy() {
    auto r = Call("GET", "/policy", "", node_http);
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    return nlohmann::json::parse(r->body)["policy"].get<std::string>();
  }
  void CheckCoordinatorAlive() {
    REQUIRE_FALSE(coord.Wait(0ms).has_value());  // not exited
    nlohmann::json s = Stats();
    CHECK(s["live_nodes"] == 1);
    CHECK(s["nodes"]["n0"].contains("blocks"));
  }
};

// The last non-empty line of a program's output (curl -w "\n%{http_code}\n").
std::string LastLine(std::string out) {
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out.substr(out.rfind('\n') + 1);
}

std::string Head(const std::string& request_line, const std::string& fields) {
  return request_line + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + fields + "\r\n";
}

}  // namespace

TEST_CASE("Coordinator limits: a heartbeat nested 100,000 levels deep is refused and the coordinator keeps serving /stats",
          "[cluster][security][limits]") {
  Cluster c;
  const uint64_t epoch = c.Stats()["epoch"].get<uint64_t>();
  // 100,002 levels in 200 KB: under the heartbeat's size limit, so the depth bound refuses it.
  const std::string deep =
      R"({"id": "n0", "stats": {"blocks": 1, "deep": )" + std::string(100000, '[') + std::string(100000, ']') + "}}";
  auto r = c.Call("POST", "/heartbeat", deep);
  REQUIRE(r.ok());
  INFO(r->body);
  CHECK(r->status == 400);
  CHECK_THAT(r->body, Catch::Contains("deeper than"));
  // The same depth in objects is larger than a heartbeat may be: refused at its header.
  std::string deeper = R"({"id": "n0", "stats": )";
  for (int i = 0; i < 100000; ++i) deeper += R"({"a": )";
  deeper += "1" + std::string(100000, '}') + "}";
  r = c.Call("POST", "/heartbeat", deeper);
  REQUIRE(r.ok());
  CHECK(r->status == 413);
  // The coordinator serves /stats on, over the next heartbeats, and nothing moved.
  for (int i = 0; i < 3; ++i) {
    c.CheckCoordinatorAlive();
    std::this_thread::sleep_for(200ms);
  }
  CHECK(c.Stats()["epoch"].get<uint64_t>() == epoch);
  CHECK_FALSE(c.Stats()["nodes"]["n0"].contains("deep"));
}

TEST_CASE("Coordinator limits: a heartbeat's stats keep only the node counters the coordinator sums",
          "[cluster][security][limits]") {
  Cluster c;
  auto reg = c.Call("POST", "/register", R"({"id": "r1", "host": "127.0.0.1", "ports": {"data": 9}})");
  REQUIRE(reg.ok());
  REQUIRE(reg->status == 200);
  auto hb = c.Call("POST", "/heartbeat",
                   R"({"id": "r1", "stats": {"blocks": 5, "hits": 2, "junk": {"a": [1, 2, 3]}, "note": "x"}})");
  REQUIRE(hb.ok());
  CHECK(hb->status == 200);
  nlohmann::json s = c.Stats();
  CHECK(s["nodes"]["r1"] == nlohmann::json{{"blocks", 5}, {"hits", 2}});  // only what the coordinator sums
  // A counter that is not a counter refuses the heartbeat, naming its path.
  for (const char* body : {R"({"id": "r1", "stats": {"blocks": -1}})", R"({"id": "r1", "stats": {"hits": "many"}})",
                           R"({"id": "r1", "stats": [1, 2]})"}) {
    hb = c.Call("POST", "/heartbeat", body);
    REQUIRE(hb.ok());
    INFO(body << " -> " << hb->body);
    CHECK(hb->status == 400);
    CHECK_THAT(hb->body, Catch::Contains("$.stats"));
  }
  CHECK(c.Stats()["nodes"]["r1"] == nlohmann::json{{"blocks", 5}, {"hits", 2}});
  auto leave = c.Call("POST", "/leave", R"({"id": "r1"})");
  REQUIRE(leave.ok());
  CHECK(leave->status == 200);
}

TEST_CASE("HTTP limits: the coordinator and a node's http port answer bad credentials at the header, "
          "without reading a large body",
          "[cluster][security][limits]") {
  Cluster c;
  const uint64_t epoch = c.Stats()["epoch"].get<uint64_t>();
  const uint64_t refused_before = c.Stats()["auth_refused"].get<uint64_t>();
  const std::string policy = c.Policy();
  struct Where {
    uint16_t port;
    const char* request_line;
  };
  const std::vector<Where> where = {{c.coord_port, "POST /register"},
                                    {c.coord_port, "POST /heartbeat"},
                                    {c.node_http, "POST /policy"}};
  int coordinator_refusals = 0;
  for (const Where& w : where) {
    // 512 KiB is under the old 1 MiB body cap (the server waited for it); 64 MiB over it.
    for (const uint64_t length : {uint64_t{512} << 10, uint64_t{64} << 20}) {
      for (const auto& [authorization, status] :
           std::vector<std::pair<std::string, int>>{{"", 401}, {"Authorization: Bearer wrong\r\n", 403}}) {
        Raw raw(w.port);
        REQUIRE(raw.connected());
        // Only the head: the answer must come without the body.
        REQUIRE(raw.Send(Head(w.request_line, "Content-Length: " + std::to_string(length) + "\r\n" + authorization)));
        const auto t0 = SteadyClock::now();
        auto resp = raw.Read();
        INFO(w.request_line << " port " << w.port << ", Content-Length " << length << ", '" << authorization << "'");
        REQUIRE(resp);
        CHECK(resp->status == status);
        CHECK(SteadyClock::now() - t0 < TimeBound(2s));
        // The unread body makes the connection unusable: the server closes it.
        CHECK(raw.ClosedWithin(TimeBound(5s)));
        coordinator_refusals += w.port == c.coord_port;
      }
    }
  }
  // Expect: 100-continue without credentials: the refusal, and no 100 before it.
  {
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /register", "Content-Length: 100000\r\nExpect: 100-continue\r\n")));
    auto resp = raw.Read();
    REQUIRE(resp);
    CHECK(resp->status == 401);
    CHECK_THAT(resp->head, Catch::Contains("WWW-Authenticate"));
    ++coordinator_refusals;
  }
  // Nothing changed; every refusal was counted.
  CHECK(c.Stats()["epoch"].get<uint64_t>() == epoch);
  CHECK(c.Stats()["auth_refused"].get<uint64_t>() == refused_before + coordinator_refusals);
  CHECK(c.Policy() == policy);
  c.CheckCoordinatorAlive();
}

TEST_CASE("HTTP limits: an Authorization sent only in a chunked trailer is refused (coordinator and node http port)",
          "[cluster][security][limits]") {
  Cluster c;
  const uint64_t epoch = c.Stats()["epoch"].get<uint64_t>();
  const std::string policy = c.Policy();
  const std::string other = policy == "lru" ? "arc" : "lru";
  const std::string trailer = "0\r\nAuthorization: " + BearerAuthorization(kSecret) + "\r\n\r\n";
  {
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /register", "Transfer-Encoding: chunked\r\nTrailer: Authorization\r\n") +
                     Chunked(R"({"id": "rogue", "host": "127.0.0.1", "ports": {"data": 9}})") + trailer));
    auto resp = raw.Read();
    REQUIRE(resp);
    INFO(resp->head << resp->body);
    CHECK(resp->status == 401);
  }
  {
    Raw raw(c.node_http);
    REQUIRE(raw.Send(Head("POST /policy", "Transfer-Encoding: chunked\r\nTrailer: Authorization\r\n") +
                     Chunked(R"({"policy": ")" + other + "\"}") + trailer));
    auto resp = raw.Read();
    REQUIRE(resp);
    INFO(resp->head << resp->body);
    CHECK(resp->status == 401);
  }
  // With the secret in the head, a trailer is still no place for fields: refused whole.
  {
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /register", "Transfer-Encoding: chunked\r\nAuthorization: " +
                                                BearerAuthorization(kSecret) + "\r\n") +
                     Chunked(R"({"id": "rogue", "host": "127.0.0.1", "ports": {"data": 9}})") +
                     "0\r\nX-Later: 1\r\n\r\n"));
    auto resp = raw.Read();
    REQUIRE(resp);
    CHECK(resp->status == 400);
    CHECK_THAT(resp->body, Catch::Contains("trailer"));
  }
  // Nothing changed: no rogue member, the same epoch, the same policy.
  nlohmann::json nodes = c.Nodes();
  REQUIRE(nodes["nodes"].size() == 1);
  CHECK(nodes["nodes"][0]["id"] == "n0");
  CHECK(nodes["epoch"].get<uint64_t>() == epoch);
  CHECK(c.Policy() == policy);
  // The same request chunked with the secret in its head goes through (chunked bodies still work).
  {
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /register", "Transfer-Encoding: chunked\r\nAuthorization: " +
                                                BearerAuthorization(kSecret) + "\r\n") +
                     Chunked(R"({"id": "rogue", "host": "127.0.0.1",)") + Chunked(R"( "ports": {"data": 9}})") +
                     "0\r\n\r\n"));
    auto resp = raw.Read();
    REQUIRE(resp);
    CHECK(resp->status == 200);
  }
  auto leave = c.Call("POST", "/leave", R"({"id": "rogue"})");
  REQUIRE(leave.ok());
  CHECK(leave->status == 200);
}

TEST_CASE("HTTP limits: 'Transfer-Encoding: chunked, identity' and other ambiguous framings are refused "
          "(coordinator and node http port)",
          "[cluster][security][limits]") {
  Cluster c;
  const uint64_t epoch = c.Stats()["epoch"].get<uint64_t>();
  const std::string auth = "Authorization: " + BearerAuthorization(kSecret) + "\r\n";
  struct Case {
    std::string fields;
    std::string body;
  };
  const std::vector<Case> cases = {
      {"Transfer-Encoding: chunked, identity\r\n", "0\r\n\r\n"},  // the first: old servers read no body
      {"Transfer-Encoding: identity\r\n", ""},
      {"Transfer-Encoding: chunked, chunked\r\n", "0\r\n\r\n"},
      {"Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n"},
      {"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"},
      {"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"},
      {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"},
      {"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "0\r\n\r\n"},
      {"Content-Length: 5\r\nContent-Length: 6\r\n", "0\r\n\r\n\r\n"},
  };
  for (uint16_t port : {c.coord_port, c.node_http}) {
    for (const Case& k : cases) {
      Raw raw(port);
      REQUIRE(raw.Send(Head("GET /stats", auth + k.fields) + k.body));
      auto resp = raw.Read();
      INFO("port " << port << ": " << k.fields);
      REQUIRE(resp);
      CHECK((resp->status == 400 || resp->status == 501));
      CHECK(raw.ClosedWithin(TimeBound(5s)));  // and nothing after it is read as a request
      CHECK_FALSE(raw.Read(0ms));
    }
  }
  // A membership write framed that way changes nothing.
  {
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /register", auth + "Transfer-Encoding: chunked, identity\r\n") +
                     Chunked(R"({"id": "rogue", "host": "127.0.0.1", "ports": {"data": 9}})") + "0\r\n\r\n"));
    auto resp = raw.Read();
    REQUIRE(resp);
    CHECK(resp->status == 400);
    CHECK(raw.ClosedWithin(TimeBound(5s)));
  }
  nlohmann::json nodes = c.Nodes();
  CHECK(nodes["nodes"].size() == 1);
  CHECK(nodes["epoch"].get<uint64_t>() == epoch);
  c.CheckCoordinatorAlive();
}

TEST_CASE("HTTP limits: a body larger than the route's limit is refused at its header (coordinator and node http port)",
          "[cluster][security][limits]") {
  Cluster c;
  const std::string auth = "Authorization: " + BearerAuthorization(kSecret) + "\r\n";
  struct Case {
    uint16_t port;
    std::string request_line;
    uint64_t length;
  };
  const std::vector<Case> cases = {
      {c.coord_port, "POST /heartbeat", 300u << 10},  // over 256 KiB
      {c.coord_port, "POST /register", 100u << 10},   // over 64 KiB
      {c.coord_port, "POST /leave", 8u << 10},        // over 4 KiB
      {c.coord_port, "GET /stats", 10},               // a GET takes no body
      {c.node_http, "POST /policy", 8u << 10},        // over 4 KiB
      {c.node_http, "GET /metrics", 10},
  };
  for (const Case& k : cases) {
    Raw raw(k.port);
    REQUIRE(raw.Send(Head(k.request_line, auth + "Content-Length: " + std::to_string(k.length) + "\r\n")));
    auto resp = raw.Read();
    INFO(k.request_line << " with " << k.length << " bytes");
    REQUIRE(resp);
    CHECK(resp->status == 413);
    CHECK(raw.ClosedWithin(TimeBound(5s)));
  }
  // Chunked: a chunk past the limit is refused when its size is read.
  {
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /heartbeat", auth + "Transfer-Encoding: chunked\r\n") + "50000\r\n"));  // 320 KiB
    auto resp = raw.Read();
    REQUIRE(resp);
    CHECK(resp->status == 413);
  }
  c.CheckCoordinatorAlive();
}

TEST_CASE("HTTP limits: the coordinator still serves its clients: node heartbeats, GET /map, 100-continue and curl",
          "[cluster][security][limits]") {
  Cluster c;
  // The node's heartbeats keep arriving.
  nlohmann::json nodes = c.Nodes();
  REQUIRE(nodes["nodes"].size() == 1);
  CHECK(nodes["nodes"][0]["last_heartbeat_ms_ago"].get<int64_t>() < 1000);
  auto map = c.Call("GET", "/map", "");
  REQUIRE(map.ok());
  CHECK(map->status == 200);
  CHECK(nlohmann::json::parse(map->body)["nodes"].size() == 1);
  // Expect: 100-continue with the secret: 100, then the body, then the answer.
  {
    const std::string body = R"({"id": "c1", "host": "127.0.0.1", "ports": {"data": 9}})";
    Raw raw(c.coord_port);
    REQUIRE(raw.Send(Head("POST /register", "Authorization: " + BearerAuthorization(kSecret) +
                                                "\r\nExpect: 100-continue\r\nContent-Length: " +
                                                std::to_string(body.size()) + "\r\n")));
    auto cont = raw.Read();
    REQUIRE(cont);
    CHECK(cont->status == 100);
    REQUIRE(raw.Send(body));
    auto resp = raw.Read();
    REQUIRE(resp);
    CHECK(resp->status == 200);
  }
  // curl as docs/launch.md uses it; a body over 1 KiB makes curl send Expect: 100-continue.
  if (::access("/usr/bin/curl", X_OK) == 0) {
    const std::string url = "127.0.0.1:" + std::to_string(c.coord_port);
    const std::string header = "Authorization: " + BearerAuthorization(kSecret);
    auto out = kvmesh::testing::RunToEnd({"/usr/bin/curl", "-s", "-H", header, url + "/nodes"}, TimeBound(10s));
    REQUIRE(out);
    CHECK(nlohmann::json::parse(*out)["nodes"].size() == 2);
    const std::string big = R"({"id": "c2", "host": "127.0.0.1", "ports": {"data": 9}, "ucx": ")" +
                            std::string(4000, 'a') + "\"}";
    out = kvmesh::testing::RunToEnd({"/usr/bin/curl", "-s", "-w", "\n%{http_code}\n", "-H", header, "-H",
                                     "Content-Type: application/json", "-d", big, url + "/register"},
                                    TimeBound(10s));
    REQUIRE(out);
    CHECK(LastLine(*out) == "200");
    out = kvmesh::testing::RunToEnd({"/usr/bin/curl", "-s", "-w", "\n%{http_code}\n", "-H", header, "-H",
                                     "Transfer-Encoding: chunked", "-d", R"({"id": "c2"})", url + "/leave"},
                                    TimeBound(10s));
    REQUIRE(out);
    CHECK(LastLine(*out) == "200");
  }
  auto leave = c.Call("POST", "/leave", R"({"id": "c1"})");
  REQUIRE(leave.ok());
  CHECK(leave->status == 200);
  c.CheckCoordinatorAlive();
}
