// Live sequences over the network (SEQ_* frames): the Router's sequence API
// embedded (in-process channels), over TCP data servers on loopback and over
// UCX servers (shared memory / loopback) give the same bytes; appends and
// reads larger than a frame are split and joined; prefix-affinity reuse
// across clients; malformed SEQ frames close only their connection; idle
// reaping; limits; dead nodes.
#include <catch2/catch.hpp>

#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "common/checksum.h"
#include "kvmesh/build_config.h"
#include "kvmesh/clock.h"
#include "kvmesh/embedded.h"
#include "kvmesh/router.h"
#include "router/shard_map.h"
#include "shard_node/server/data_server.h"
#include "shard_node/shard_node.h"
#include "tests/raw_frames.h"
#include "transport/protocol.h"
#include "transport/socket_util.h"
#include "transport/tcp_channel.h"
#if defined(KVMESH_HAVE_UCX)
#include "shard_node/server/ucx_server.h"
#include "transport/ucx_channel.h"
#endif

using namespace kvmesh;
using SteadyClock = std::chrono::steady_clock;
using namespace kvmesh::testing;  // Raw, ClosedByServer, HelloFrame (tests/raw_frames.h)

namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 4, kBt = 4;

ClusterConfig Config() {
  auto c = ParseConfig(R"({"model": {"model_id": "seqnet", "num_layers": 2, "num_kv_heads": 2, "head_dim": 4,
                                      "dtype": "fp32", "block_tokens": 4},
      "nodes": [{"id": "n0", "memory": {"host": "1MiB"}}, {"id": "n1", "memory": {"host": "1MiB"}}],
      "store": {"stripes": 1}})");
  REQUIRE(c.ok());
  return *c;
}

// The value of (layer, kv, head, position, dim) for a token: recomputable.
float Val(uint32_t layer, uint32_t kv, uint32_t head, uint32_t pos, uint32_t d, TokenId tok) {
  return static_cast<float>(tok) * 1000.0f + static_cast<float>(pos) + layer * 0.5f + kv * 0.25f + head * 0.125f +
         d * 0.0625f;
}

// K and V of tokens at positions [pos0, pos0+n): [layer][n][heads][dim] over the slice.
void MakeKv(std::span<const TokenId> toks, uint32_t pos0, Range heads, std::vector<float>* k, std::vector<float>* v) {
  const size_t n = toks.size(), H = heads.size();
  k->assign(kLayers * n * H * kDim, 0.0f);
  v->assign(k->size(), 0.0f);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < H; ++h)
        for (uint32_t d = 0; d < kDim; ++d) {
          const size_t idx = ((l * n + i) * H + h) * kDim + d;
          (*k)[idx] = Val(l, 0, heads.begin + h, pos0 + static_cast<uint32_t>(i), d, toks[i]);
          (*v)[idx] = Val(l, 1, heads.begin + h, pos0 + static_cast<uint32_t>(i), d, toks[i]);
        }
}

Result<uint32_t> Append(Router& r, const SequenceHandle& s, std::span<const TokenId> toks, uint32_t pos0) {
  std::vector<float> k, v;
  MakeKv(toks, pos0, s.heads, &k, &v);
  return r.AppendSequence(s, toks, std::as_bytes(std::span(k)), std::as_bytes(std::span(v)));
}

// Reads the whole sequence and checks every value against Val().
void CheckContent(Router& r, const SequenceHandle& s) {
  SequenceState st = r.SequenceInfo(s).value();
  std::vector<std::byte> k, v;
  REQUIRE(r.ReadSequence(s, 0, st.length, &k, &v).ok());
  std::vector<float> ek, ev;
  MakeKv(st.tokens, 0, s.heads, &ek, &ev);
  REQUIRE(k.size() == ek.size() * sizeof(float));
  CHECK(std::memcmp(k.data(), ek.data(), k.size()) == 0);
  CHECK(std::memcmp(v.data(), ev.data(), v.size()) == 0);
}

std::vector<TokenId> Toks(size_t n, TokenId base) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}

// Two shard nodes, each behind a TCP data server on 127.0.0.1 (run-time
// ports), and a Router over TCP channels to them.
struct TcpCluster {
  explicit TcpCluster(SequenceServiceOptions so = {}, Clock* clock = nullptr, int64_t timeout_ms = 2000) {
    cfg = Config();
    for (const NodeConfig& n : cfg.nodes) {
      auto node = ShardNode::Create(cfg, n.id, clock, so);
      REQUIRE(node.ok());
      DataServerOptions o;
      o.limits.max_body_bytes = 4096;  // small: reads and appends span several frames
      o.limits.max_block_bytes = 4096;
      auto s = DataServer::Start(node->get(), o, &epoch);
      REQUIRE(s.ok());
      nodes.push_back(std::move(*node));
      servers.push_back(std::move(*s));
    }
    router = MakeRouter(timeout_ms);
  }
  std::unique_ptr<Router> MakeRouter(int64_t timeout_ms = 2000) {
    std::vector<std::shared_ptr<ShardChannel>> chans;
    for (auto& s : servers) {
      TcpChannelOptions o;
      o.port = s->port();
      o.timeout_ms = timeout_ms;
      o.connect_timeout_ms = timeout_ms;
      chans.push_back(TcpChannel::Create(o));
    }
    return Router::Create(cfg.model, ShardMap::FromConfig(cfg).value(), std::move(chans)).value();
  }
  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<DataServer>> servers;
  std::unique_ptr<Router> router;
};

#if defined(KVMESH_HAVE_UCX)
// The same two nodes behind UCX servers (the same small frame limit), and a
// Router over UCX channels to them.
struct UcxCluster {
  UcxCluster() {
    cfg = Config();
    for (const NodeConfig& n : cfg.nodes) {
      auto node = ShardNode::Create(cfg, n.id);
      REQUIRE(node.ok());
      UcxServerOptions o;
      o.limits.max_body_bytes = 4096;  // small: reads and appends span several frames
      o.limits.max_block_bytes = 4096;
      auto s = UcxServer::Start(node->get(), o, &epoch);
      REQUIRE(s.ok());
      nodes.push_back(std::move(*node));
      servers.push_back(std::move(*s));
    }
    router = MakeRouter();
  }
  std::unique_ptr<Router> MakeRouter() {
    std::vector<std::shared_ptr<ShardChannel>> chans;
    for (auto& s : servers) {
      UcxChannelOptions o;
      o.node_address = s->address();
      o.timeout_ms = 5000;
      auto ch = UcxChannel::Connect(o);
      REQUIRE(ch.ok());
      chans.push_back(std::shared_ptr<ShardChannel>(std::move(*ch)));
    }
    return Router::Create(cfg.model, ShardMap::FromConfig(cfg).value(), std::move(chans)).value();
  }
  ~UcxCluster() {
    router.reset();  // channels (endpoints) before the servers
    for (auto& s : servers) s->Stop();
  }
  ClusterConfig cfg;
  std::atomic<uint64_t> epoch{0};
  std::vector<std::unique_ptr<ShardNode>> nodes;
  std::vector<std::unique_ptr<UcxServer>> servers;
  std::unique_ptr<Router> router;
};
#endif

// Appends 200 tokens of the full slice in one call (about 26 KiB of K and V:
// several frames under the 4 KiB limit) and reads them back in one call (the
// node answers a few positions per frame); returns the K/V checksums.
std::string SplitAndJoin(Router& r) {
  std::vector<TokenId> toks = Toks(200, 5000);
  SequenceHandle h = r.CreateSequence({}).value();
  REQUIRE(h.heads.size() == kHeads);
  REQUIRE(Append(r, h, toks, 0).value() == 0);
  REQUIRE(Append(r, h, Toks(3, 9000), 200).value() == 200);  // the next position follows the split frames
  std::vector<TokenId> all = toks;
  for (TokenId t : Toks(3, 9000)) all.push_back(t);
  SequenceState st = r.SequenceInfo(h).value();
  CHECK(st.tokens == all);
  CHECK(st.sealed_blocks == 203 / kBt);
  CheckContent(r, h);
  std::vector<std::byte> k, v;
  REQUIRE(r.ReadSequence(h, 37, 150, &k, &v).ok());  // a joined read from the middle
  REQUIRE(k.size() == size_t{kLayers} * 150 * kHeads * kDim * sizeof(float));
  std::vector<float> ek, ev;
  MakeKv(std::span(all).subspan(37, 150), 37, h.heads, &ek, &ev);
  CHECK(std::memcmp(k.data(), ek.data(), k.size()) == 0);
  CHECK(std::memcmp(v.data(), ev.data(), v.size()) == 0);
  REQUIRE(r.ReleaseSequence(h).ok());
  return std::to_string(Checksum64(k.data(), k.size())) + "/" + std::to_string(Checksum64(v.data(), v.size()));
}

// A scenario over the public API; returns everything observable, in order.
std::vector<std::string> Scenario(Router& r) {
  std::vector<std::string> out;
  auto note = [&](const std::string& s) { out.push_back(s); };
  auto info = [&](const SequenceHandle& h) {
    SequenceState st = r.SequenceInfo(h).value();
    std::string s = "len=" + std::to_string(st.length) + " sealed=" + std::to_string(st.sealed_blocks) + " toks=";
    for (TokenId t : st.tokens) s += std::to_string(t) + ",";
    std::vector<std::byte> k, v;
    REQUIRE(r.ReadSequence(h, 0, st.length, &k, &v).ok());
    s += " kv=" + std::to_string(Checksum64(k.data(), k.size())) + "/" + std::to_string(Checksum64(v.data(), v.size()));
    note(s);
  };
  RequestOptions ro;
  ro.heads = {1, 2};  // a one-head slice
  std::vector<TokenId> toks = Toks(11, 50);
  SequenceHandle a = r.CreateSequence({}, ro).value();
  CHECK(a.prefix_tokens == 0);
  note("first=" + std::to_string(Append(r, a, std::span(toks).first(6), 0).value()));
  for (uint32_t i = 6; i < 11; ++i) note("pos=" + std::to_string(Append(r, a, std::span(toks).subspan(i, 1), i).value()));
  info(a);
  CheckContent(r, a);
  REQUIRE(r.TruncateSequence(a, 4).ok());  // 11 -> 7: block 1 unsealed
  info(a);
  SequenceHandle f = r.ForkSequence(a).value();
  CHECK(f.node_id == a.node_id);
  std::vector<TokenId> alt = Toks(3, 900);
  REQUIRE(Append(r, f, alt, 7).ok());
  std::vector<TokenId> more = Toks(2, 700);
  REQUIRE(Append(r, a, more, 7).ok());
  info(a);
  info(f);
  CheckContent(r, a);
  CheckContent(r, f);
  // A partial read in the middle.
  std::vector<std::byte> k, v;
  REQUIRE(r.ReadSequence(f, 3, 5, &k, &v).ok());
  note("mid=" + std::to_string(Checksum64(k.data(), k.size())) + "/" + std::to_string(Checksum64(v.data(), v.size())));
  // Errors are the node's answers, the same on every transport.
  note("trunc-too-many=" + std::string(StatusCodeName(r.TruncateSequence(a, 100).code())));
  note("read-past=" + std::string(StatusCodeName(r.ReadSequence(a, 5, 10, &k, &v).code())));
  std::vector<float> shortk(3);
  note("bad-kv=" + std::string(StatusCodeName(
                       r.AppendSequence(a, std::span(toks).first(1), std::as_bytes(std::span(shortk)),
                                        std::as_bytes(std::span(shortk)))
                           .status()
                           .code())));
  REQUIRE(r.ReleaseSequence(a).ok());
  REQUIRE(r.ReleaseSequence(f).ok());
  note("released-info=" + std::string(StatusCodeName(r.SequenceInfo(a).status().code())));
  note("release-twice=" + std::string(StatusCodeName(r.ReleaseSequence(a).code())));
  return out;
}

std::string SeqFrame(proto::Opcode op, const std::string& body, uint64_t id = 7) {
  proto::FrameHeader h;
  h.opcode = op;
  h.request_id = id;
  return proto::BuildFrame(h, body);
}

// Reads one answer frame (header + body) from a raw connection.
proto::FrameHeader ReadAnswer(int fd, std::string* body) {
  proto::HeaderBytes hb;
  REQUIRE(ReadFull(fd, hb.data(), hb.size(), 2000, {}).ok());
  proto::FrameHeader a;
  REQUIRE(proto::DecodeHeader(hb, {}, &a).ok());
  body->assign(a.body_len, '\0');
  if (a.body_len) REQUIRE(ReadFull(fd, body->data(), a.body_len, 2000, {}).ok());
  return a;
}

}  // namespace

TEST_CASE("Sequences: in-process and TCP give identical results, byte-for-byte", "[sequence][net]") {
  auto embedded = EmbeddedCluster::Start(Config()).value();
  std::vector<std::string> local = Scenario(embedded->router());
  TcpCluster tcp;
  std::vector<std::string> remote = Scenario(*tcp.router);
  CHECK(local == remote);
  REQUIRE(local.size() > 10);
  CHECK(local[1] == "pos=6");
  CHECK_THAT(local.back(), Catch::Equals("release-twice=NotFound"));
  CHECK_THAT(local[local.size() - 3], Catch::Equals("bad-kv=InvalidArgument"));
  // Everything released: nothing stays pinned on any node.
  for (auto& n : tcp.nodes) {
    CHECK(n->Stats().store.pinned_blocks == 0);
    CHECK(n->sequences().Stats().live == 0);
  }
}

TEST_CASE("Sequences: appends and reads larger than a frame are split and joined over TCP", "[sequence][net]") {
  auto embedded = EmbeddedCluster::Start(Config()).value();
  TcpCluster tcp;
  CHECK(SplitAndJoin(*tcp.router) == SplitAndJoin(embedded->router()));
  for (auto& n : tcp.nodes) CHECK(n->Stats().store.pinned_blocks == 0);
}

#if defined(KVMESH_HAVE_UCX)
TEST_CASE("Sequences: UCX gives the same results as in-process and TCP, byte-for-byte", "[sequence][net][ucx]") {
  auto embedded = EmbeddedCluster::Start(Config()).value();
  std::vector<std::string> local = Scenario(embedded->router());
  UcxCluster ucx;
  std::vector<std::string> remote = Scenario(*ucx.router);
  CHECK(local == remote);
  REQUIRE(local.size() > 10);
  // Larger than a frame: split appends, joined reads, the same bytes.
  const uint64_t before = ucx.servers[0]->requests() + ucx.servers[1]->requests();
  CHECK(SplitAndJoin(*ucx.router) == SplitAndJoin(embedded->router()));
  CHECK(ucx.servers[0]->requests() + ucx.servers[1]->requests() - before > 10);  // many frames
  // Prefix reuse across two UCX clients.
  std::vector<TokenId> prompt = Toks(10, 300);
  SequenceHandle a = ucx.router->CreateSequence(prompt).value();
  REQUIRE(Append(*ucx.router, a, prompt, 0).value() == 0);
  auto other = ucx.MakeRouter();
  SequenceHandle b = other->CreateSequence(prompt).value();
  CHECK(b.node_id == a.node_id);
  CHECK(b.prefix_tokens == 2 * kBt);
  REQUIRE(Append(*other, b, std::span(prompt).subspan(8), 8).value() == 8);
  CheckContent(*other, b);
  REQUIRE(ucx.router->ReleaseSequence(a).ok());
  REQUIRE(other->ReleaseSequence(b).ok());
  CHECK(other->SequenceInfo(b).status().code() == StatusCode::kNotFound);
  for (auto& n : ucx.nodes) {
    CHECK(n->Stats().store.pinned_blocks == 0);
    CHECK(n->sequences().Stats().live == 0);
  }
}
#endif

TEST_CASE("Sequences: a block sealed over the network is reused by another client's CreateSequence", "[sequence][net]") {
  TcpCluster c;
  RequestOptions ro;
  std::vector<TokenId> prompt = Toks(10, 300);  // 2 full blocks + 2 tokens
  SequenceHandle a = c.router->CreateSequence(prompt, ro).value();
  CHECK(a.prefix_tokens == 0);
  REQUIRE(Append(*c.router, a, prompt, 0).value() == 0);
  CHECK(c.router->SequenceInfo(a).value().sealed_blocks == 2);

  auto other = c.MakeRouter();  // a second client: its own connections
  SequenceHandle b = other->CreateSequence(prompt, ro).value();
  CHECK(b.node_id == a.node_id);  // prefix affinity: the same node
  CHECK(b.prefix_tokens == 2 * kBt);
  SequenceState sb = other->SequenceInfo(b).value();
  CHECK(sb.length == 8);
  CHECK(sb.sealed_blocks == 2);
  REQUIRE(Append(*other, b, std::span(prompt).subspan(8), 8).value() == 8);
  CheckContent(*other, b);
  // The same bytes through either client.
  std::vector<std::byte> ka, va, kb, vb;
  REQUIRE(c.router->ReadSequence(a, 0, 10, &ka, &va).ok());
  REQUIRE(other->ReadSequence(b, 0, 10, &kb, &vb).ok());
  CHECK(ka == kb);
  CHECK(va == vb);
  // max_blocks bounds what is attached.
  SequenceHandle one = other->CreateSequence(prompt, ro, 1).value();
  CHECK(one.prefix_tokens == kBt);
  // Released sequences leave the sealed blocks cached for the next request.
  REQUIRE(c.router->ReleaseSequence(a).ok());
  REQUIRE(other->ReleaseSequence(b).ok());
  REQUIRE(other->ReleaseSequence(one).ok());
  SequenceHandle again = c.router->CreateSequence(prompt, ro).value();
  CHECK(again.prefix_tokens == 2 * kBt);
  REQUIRE(c.router->ReleaseSequence(again).ok());
  for (auto& n : c.nodes) CHECK(n->Stats().store.pinned_blocks == 0);
}

TEST_CASE("Sequences: malformed and oversize SEQ frames close only their connection", "[sequence][net][faults]") {
  TcpCluster c;
  std::vector<TokenId> toks = Toks(6, 10);
  SequenceHandle h = c.router->CreateSequence({}).value();
  REQUIRE(Append(*c.router, h, toks, 0).ok());
  const size_t node = h.node;
  const uint16_t port = c.servers[node]->port();
  const auto dl = SteadyClock::now() + std::chrono::seconds(2);

  auto closes = [&](const std::string& frame) {
    UniqueFd fd = Raw(port);
    std::string bytes = HelloFrame() + frame;
    REQUIRE(WriteAll(fd.get(), bytes.data(), bytes.size(), dl).ok());
    std::string body;
    proto::FrameHeader a = ReadAnswer(fd.get(), &body);  // the HELLO answer
    CHECK(a.opcode == proto::Opcode::kHello);
    return ClosedByServer(fd.get());
  };
  SECTION("SEQ_APPEND whose K and V differ in length") {
    std::string body = proto::EncodeSeqAppendHead(h.id, kLayers, std::span(toks).first(1), 0, 0) + std::string(33, 'x');
    CHECK(closes(SeqFrame(proto::Opcode::kSeqAppend, body)));
  }
  SECTION("SEQ_APPEND whose token count runs past the body") {
    std::string body = proto::EncodeSeqAppendHead(h.id, kLayers, std::span(toks).first(1), 0, 0);
    body[8] = '\x7f';  // n = 127 tokens, 4 bytes of them present
    CHECK(closes(SeqFrame(proto::Opcode::kSeqAppend, body)));
  }
  SECTION("SEQ_CREATE whose token count disagrees with the body") {
    proto::SeqCreateRequest q;
    q.prefix = toks;
    std::string body = proto::EncodeSeqCreate(q);
    body.resize(body.size() - 2);
    CHECK(closes(SeqFrame(proto::Opcode::kSeqCreate, body)));
  }
  SECTION("SEQ_CREATE with a salt longer than allowed") {
    proto::SeqCreateRequest q;
    std::string body = proto::EncodeSeqCreate(q);
    body[24] = '\xff';
    body[25] = '\x7f';
    CHECK(closes(SeqFrame(proto::Opcode::kSeqCreate, body)));
  }
  SECTION("SEQ_READ / SEQ_FORK with the wrong body length") {
    CHECK(closes(SeqFrame(proto::Opcode::kSeqRead, proto::EncodeSeqId(h.id))));
    CHECK(closes(SeqFrame(proto::Opcode::kSeqFork, proto::EncodeSeqTruncate(h.id, 1))));
  }
  SECTION("an oversize SEQ_APPEND claim is refused from the header") {
    proto::FrameHeader fh;
    fh.opcode = proto::Opcode::kSeqAppend;
    fh.body_len = 1u << 30;
    auto hb = proto::EncodeHeader(fh);
    CHECK(closes(std::string(reinterpret_cast<const char*>(hb.data()), hb.size())));
  }
  SECTION("refused calls are answered and keep the connection") {
    UniqueFd fd = Raw(port);
    std::string bytes = HelloFrame();
    // Checksum mismatch: DataLoss, nothing appended.
    std::vector<float> k, v;
    MakeKv(std::span(toks).first(1), 6, h.heads, &k, &v);
    std::string kb(reinterpret_cast<const char*>(k.data()), k.size() * 4);
    std::string vb(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    bytes += SeqFrame(proto::Opcode::kSeqAppend,
                      proto::EncodeSeqAppendHead(h.id, kLayers, std::span(toks).first(1), 1, 2) + kb + vb, 1);
    bytes += SeqFrame(proto::Opcode::kSeqInfo, proto::EncodeSeqId(999999), 2);  // unknown id
    bytes += SeqFrame(proto::Opcode::kSeqInfo, proto::EncodeSeqId(h.id), 3);
    REQUIRE(WriteAll(fd.get(), bytes.data(), bytes.size(), dl).ok());
    std::string body;
    ReadAnswer(fd.get(), &body);  // HELLO
    CHECK(ReadAnswer(fd.get(), &body).status == StatusCode::kDataLoss);
    CHECK(ReadAnswer(fd.get(), &body).status == StatusCode::kNotFound);
    proto::FrameHeader a = ReadAnswer(fd.get(), &body);
    REQUIRE(a.status == StatusCode::kOk);
    SequenceState info;
    REQUIRE(proto::ParseSeqInfoAnswer(std::as_bytes(std::span<const char>(body.data(), body.size())), &info).ok());
    CHECK(info.length == 6);  // the corrupt append added nothing
  }
  // The sequence and the good client are untouched.
  CHECK(c.router->SequenceInfo(h).value().length == 6);
  REQUIRE(Append(*c.router, h, Toks(1, 77), 6).value() == 6);
  CheckContent(*c.router, h);
}

TEST_CASE("Sequences: idle ones are released so a dead client leaks no pins, and the count is bounded",
          "[sequence][net]") {
  ManualClock clock;
  SequenceServiceOptions so;
  so.idle_timeout_ms = 1000;
  so.max_sequences = 3;
  TcpCluster c(so, &clock);
  RequestOptions ro;
  ro.affinity = Affinity::None();
  std::vector<TokenId> prompt = Toks(8, 5);
  // All on the node of this prompt (prefix affinity).
  SequenceHandle a = c.router->CreateSequence(prompt).value();
  REQUIRE(Append(*c.router, a, prompt, 0).ok());
  SequenceHandle b = c.router->CreateSequence(prompt).value();
  SequenceHandle d = c.router->CreateSequence(prompt).value();
  CHECK(b.node_id == a.node_id);
  CHECK(d.node_id == a.node_id);
  ShardNode& node = *c.nodes[a.node];
  CHECK(node.Stats().store.pinned_blocks == 2);
  // The limit: a fourth live sequence on that node is refused (the client may
  // retry elsewhere; the sequence service never exceeds it).
  CHECK(node.sequences().Create(SeqCreateArgs{}).status().code() == StatusCode::kResourceExhausted);
  CHECK(c.router->ForkSequence(a).status().code() == StatusCode::kResourceExhausted);

  // b stays in use; a and d are abandoned (their client died).
  clock.AdvanceSeconds(0.6);
  REQUIRE(c.router->SequenceInfo(b).ok());
  clock.AdvanceSeconds(0.6);  // a and d idle 1.2 s, b 0.6 s
  REQUIRE(c.router->SequenceInfo(b).ok());  // a call: the lazy reaper runs
  CHECK(node.sequences().Stats().reaped == 2);
  CHECK(c.router->SequenceInfo(a).status().code() == StatusCode::kNotFound);
  CHECK(c.router->SequenceInfo(d).status().code() == StatusCode::kNotFound);
  CHECK(node.Stats().store.pinned_blocks == 2);  // b holds them
  REQUIRE(c.router->ReleaseSequence(b).ok());
  CHECK(node.Stats().store.pinned_blocks == 0);
  // Room again.
  SequenceHandle e = c.router->CreateSequence(prompt).value();
  CHECK(e.prefix_tokens == 8);
  // ReapIdle frees everything idle now.
  clock.AdvanceSeconds(2);
  CHECK(node.sequences().ReapIdle() == 1);
  CHECK(node.sequences().Stats().live == 0);
}

TEST_CASE("Sequences: $.sequences configures the nodes of an embedded cluster", "[sequence][net]") {
  ClusterConfig cfg = Config();
  cfg.sequences.max_sequences = 2;
  cfg.sequences.max_sequence_tokens = 6;
  auto c = EmbeddedCluster::Start(cfg).value();
  Router& r = c->router();
  std::vector<TokenId> prompt = Toks(8, 11);  // one node by prefix affinity
  SequenceHandle a = r.CreateSequence(prompt).value();
  CHECK(Append(r, a, prompt, 0).status().code() == StatusCode::kResourceExhausted);  // 8 > 6 tokens
  REQUIRE(Append(r, a, std::span(prompt).first(6), 0).ok());
  SequenceHandle b = r.CreateSequence(prompt).value();
  CHECK(b.node_id == a.node_id);
  CHECK(r.CreateSequence(prompt).status().code() == StatusCode::kResourceExhausted);  // a third on that node
  REQUIRE(r.ReleaseSequence(b).ok());
  REQUIRE(r.CreateSequence(prompt).ok());
}

TEST_CASE("Sequences: a dead node answers Unavailable within the timeout, never hangs", "[sequence][net][faults]") {
  TcpCluster c({}, nullptr, 500);
  std::vector<TokenId> prompt = Toks(8, 40);
  SequenceHandle h = c.router->CreateSequence(prompt).value();
  REQUIRE(Append(*c.router, h, prompt, 0).ok());
  c.servers[h.node].reset();  // the node's process is gone: its sockets close
  auto t0 = SteadyClock::now();
  Status s = Append(*c.router, h, Toks(1, 1), 8).status();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(c.router->SequenceInfo(h).status().code() == StatusCode::kUnavailable);
  std::vector<std::byte> k, v;
  CHECK(IsMiss(c.router->ReadSequence(h, 0, 1, &k, &v)));
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(3000));
  // A new sequence of the same prompt goes to the next node in rendezvous order.
  SequenceHandle g = c.router->CreateSequence(prompt).value();
  CHECK(g.node_id != h.node_id);
  CHECK(g.prefix_tokens == 0);  // that node has no copy of the prefix
  REQUIRE(Append(*c.router, g, prompt, 0).ok());
  CheckContent(*c.router, g);
  // A handle whose node left the shard map answers Unavailable.
  SequenceHandle gone = h;
  gone.node_id = "n9";
  CHECK(c.router->SequenceInfo(gone).status().code() == StatusCode::kUnavailable);
}

TEST_CASE("Sequences: a stalled node ends the call within the timeout", "[sequence][net][faults]") {
  TcpCluster c({}, nullptr, 300);
  SequenceHandle h = c.router->CreateSequence(Toks(8, 40)).value();
  c.servers[h.node]->Stop();  // stops answering; connections stay open
  auto t0 = SteadyClock::now();
  Status s = c.router->SequenceInfo(h).status();
  CHECK(IsMiss(s));  // DeadlineExceeded: the node may still be alive
  CHECK(SteadyClock::now() - t0 < std::chrono::milliseconds(1500));
}

TEST_CASE("Sequences: many threads on one router, own and shared sequences", "[sequence][net]") {
  TcpCluster c;
  SequenceHandle shared = c.router->CreateSequence({}).value();
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::vector<TokenId> toks = Toks(9, 1000 * (t + 1));
      auto h = c.router->CreateSequence({});
      if (!h.ok()) return void(++bad);
      for (uint32_t i = 0; i < toks.size(); ++i)
        if (Append(*c.router, *h, std::span(toks).subspan(i, 1), i).value_or(99) != i) ++bad;
      SequenceState st = c.router->SequenceInfo(*h).value();
      if (st.tokens != toks || st.sealed_blocks != 2) ++bad;
      // The shared sequence: appends from every thread interleave, reads race them.
      for (int i = 0; i < 5; ++i) {
        if (!Append(*c.router, shared, Toks(1, t), 0).ok()) ++bad;  // positions differ: values not checked
        std::vector<std::byte> k, v;
        if (!c.router->ReadSequence(shared, 0, 1, &k, &v).ok()) ++bad;
      }
      if (!c.router->ReleaseSequence(*h).ok()) ++bad;
    });
  }
  for (auto& t : ts) t.join();
  CHECK(bad == 0);
  CHECK(c.router->SequenceInfo(shared).value().length == 20);
  REQUIRE(c.router->ReleaseSequence(shared).ok());
}

TEST_CASE("Network sequences on a node with a codec seal their blocks encoded and read them back dequantised",
          "[sequence][net][codec]") {
  // A node whose config has $.codec: its sequences store sealed blocks
  // through the codec (fewer stored bytes), the tail stays exact, and reads
  // return the decoded values (here Val() rounded by fp16: within 1e-3 relative).
  ClusterConfig cfg = Config();
  cfg.codec.codec = "fp16";
  auto cluster = EmbeddedCluster::Start(cfg).value();
  Router& r = cluster->router();
  std::vector<TokenId> toks(10);
  std::iota(toks.begin(), toks.end(), 7);
  SequenceHandle h = r.CreateSequence({}).value();
  REQUIRE(Append(r, h, toks, 0).ok());
  SequenceState st = r.SequenceInfo(h).value();
  CHECK(st.sealed_blocks == 2);
  std::vector<std::byte> k, v;
  REQUIRE(r.ReadSequence(h, 0, st.length, &k, &v).ok());
  std::vector<float> ek, ev;
  MakeKv(toks, 0, h.heads, &ek, &ev);
  REQUIRE(k.size() == ek.size() * sizeof(float));
  const size_t n = toks.size(), H = h.heads.size();
  size_t exact_sealed = 0, sealed = 0;
  for (uint32_t l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < n; ++i)
      for (size_t x = 0; x < H * kDim; ++x) {
        const size_t idx = (l * n + i) * H * kDim + x;
        float gk, gv;
        std::memcpy(&gk, k.data() + idx * sizeof(float), sizeof gk);
        std::memcpy(&gv, v.data() + idx * sizeof(float), sizeof gv);
        if (i >= 2 * kBt) {  // the open tail: exact
          REQUIRE(gk == ek[idx]);
          REQUIRE(gv == ev[idx]);
        } else {
          REQUIRE(std::abs(gk - ek[idx]) <= 1e-3f * std::abs(ek[idx]));
          REQUIRE(std::abs(gv - ev[idx]) <= 1e-3f * std::abs(ev[idx]));
          exact_sealed += (gk == ek[idx]) + (gv == ev[idx]);
          sealed += 2;
        }
      }
  CHECK(exact_sealed < sealed);  // really went through fp16
  ShardNode& node = cluster->node(h.node);
  const StoreStats ss = node.store().Stats();
  CHECK(ss.blocks == 2);
  CHECK(ss.bytes_stored < ss.bytes_logical);  // encoded
  REQUIRE(r.ReleaseSequence(h).ok());
}
