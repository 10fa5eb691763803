// The client's two pure plans on their own, with no node and no socket: the
// frame plan (transport/frame_plan.h: where a batch splits under the node's
// limits, which blocks are never sent, the PUT tables and their checksums)
// and the replica plan (router/replica_plan.h: which rank is asked, how the
// replicas' answers merge, one map refresh on StaleEpoch). The Router, the
// RESP proxy's engine and the TCP and UCX channels execute these; the
// stale-epoch cases of each path are in tests/test_resp_proxy_loop.cc and
// tests/test_registered_memory.cc.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/checksum.h"
#include "router/replica_plan.h"
#include "router/shard_map.h"
#include "transport/frame_plan.h"
#include "transport/protocol.h"

using namespace kvmesh;
using namespace kvmesh::proto;

namespace {

std::vector<FrameSpan> PutFrames(const std::vector<uint64_t>& sizes, const ProtocolLimits& lim,
                                 std::vector<size_t>* refused = nullptr) {
  std::vector<FrameSpan> out;
  for (size_t at = 0; at < sizes.size();) {
    FrameSpan f = NextPutFrame(
        at, sizes.size(), lim, [&](size_t i) { return sizes[i]; },
        [&](size_t i, const Status& s) {
          CHECK(s.code() == StatusCode::kResourceExhausted);
          if (refused) refused->push_back(i);
        });
    if (f.empty()) break;
    out.push_back(f);
    at = f.end;
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> Pairs(const std::vector<FrameSpan>& fs) {
  std::vector<std::pair<size_t, size_t>> v;
  for (const FrameSpan& f : fs) v.emplace_back(f.begin, f.end);
  return v;
}

// n bytes that differ with the seed and along the block.
std::vector<std::byte> Bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7919) >> 3);
  return v;
}

std::shared_ptr<const ShardMap> Map(int nodes, uint32_t replicas, uint64_t epoch = 1) {
  std::vector<ShardInfo> infos;
  for (int i = 0; i < nodes; ++i) {
    ShardInfo s;
    s.id = "n" + std::to_string(i);
    s.host = "127.0.0.1";
    s.ports.data = static_cast<uint16_t>(9000 + i);
    infos.push_back(s);
  }
  auto m = ShardMap::Build(epoch, infos, {}, {}, replicas);
  REQUIRE(m.ok());
  return *m;
}

}  // namespace

// ---- frame plan ------------------------------------------------------------

TEST_CASE("Frame plan: a batch splits at max_items exactly", "[unit][plan][frame]") {
  ProtocolLimits lim;
  lim.max_items = 4;
  CHECK(Pairs(PutFrames(std::vector<uint64_t>(8, 100), lim)) == std::vector<std::pair<size_t, size_t>>{{0, 4}, {4, 8}});
  CHECK(Pairs(PutFrames(std::vector<uint64_t>(9, 100), lim)) ==
        std::vector<std::pair<size_t, size_t>>{{0, 4}, {4, 8}, {8, 9}});
  CHECK(FrameEnd(0, 3, lim, [](size_t) { return kKeyItemBytes; }) == 3);
  lim.max_items = 0;  // never an empty frame: one item a frame
  CHECK(FrameEnd(2, 5, lim, [](size_t) { return kKeyItemBytes; }) == 3);
}

TEST_CASE("Frame plan: a PUT frame holds items while record + payload bytes fit max_body_bytes", "[unit][plan][frame]") {
  ProtocolLimits lim;
  lim.max_body_bytes = 3 * (kPutItemSize + 100);  // exactly three items of 100 bytes
  CHECK(Pairs(PutFrames(std::vector<uint64_t>(7, 100), lim)) ==
        std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 6}, {6, 7}});
  lim.max_body_bytes -= 1;  // one byte short of three
  CHECK(Pairs(PutFrames(std::vector<uint64_t>(4, 100), lim)) == std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}});
  // A lone item over the body limit goes alone (the node refuses it).
  lim.max_body_bytes = 64;
  CHECK(Pairs(PutFrames({100, 100}, lim)) == std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}});
}

TEST_CASE("Frame plan: empty blocks and blocks over max_block_bytes are refused, never spanned", "[unit][plan][frame]") {
  ProtocolLimits lim;
  lim.max_block_bytes = 1000;
  CHECK(CheckPutBlock(1000, lim).ok());
  CHECK(CheckPutBlock(1001, lim).code() == StatusCode::kResourceExhausted);
  CHECK(CheckPutBlock(0, lim).code() == StatusCode::kResourceExhausted);
  std::vector<size_t> refused;
  auto frames = PutFrames({10, 0, 10, 1000, 1001, 10, 0}, lim, &refused);
  CHECK(Pairs(frames) == std::vector<std::pair<size_t, size_t>>{{0, 1}, {2, 4}, {5, 6}});
  CHECK(refused == std::vector<size_t>{1, 4, 6});
  refused.clear();
  CHECK(PutFrames({0, 2000}, lim, &refused).empty());
  CHECK(refused == std::vector<size_t>{0, 1});
}

TEST_CASE("Frame plan: a GET frame is sized by the answers it may bring, each at most max_block_bytes",
          "[unit][plan][frame]") {
  ProtocolLimits lim;
  lim.max_block_bytes = 1000;
  lim.max_body_bytes = 2 * (kGetItemSize + 1000);
  CHECK(GetItemBytes(500, lim) == kGetItemSize + 500);
  CHECK(GetItemBytes(1u << 30, lim) == kGetItemSize + 1000);  // a huge destination asks no more than a block
  const std::vector<uint64_t> expect = {1000, 1u << 30, 1, 1};
  auto bytes = [&](size_t i) { return GetItemBytes(expect[i], lim); };
  CHECK(FrameEnd(0, 4, lim, bytes) == 2);  // exactly two full blocks
  CHECK(FrameEnd(2, 4, lim, bytes) == 4);
  lim.max_body_bytes = 5 * kKeySize;  // key lists: five keys a frame
  CHECK(FrameEnd(0, 12, lim, [](size_t) { return kKeyItemBytes; }) == 5);
}

TEST_CASE("Frame plan: the PUT table parses as the node parses it and carries the checksums it verifies",
          "[unit][plan][frame]") {
  // Items as the proxy sends them (a head and a part) and as the channels do (data alone).
  std::vector<std::vector<std::byte>> heads = {Bytes(24, 1), {}, Bytes(7, 3)};
  std::vector<std::vector<std::byte>> datas = {Bytes(1000, 11), Bytes(333, 12), {}};
  std::vector<PutPiece> pieces;
  for (size_t i = 0; i < heads.size(); ++i)
    pieces.push_back(PutPiece{BlockKey{i + 1, 100 + i}, heads[i], datas[i], static_cast<Priority>(i)});
  std::string table = "stale bytes that must go";
  std::vector<std::span<const std::byte>> payload;
  const FrameSpan f{0, pieces.size()};
  const uint64_t body = BuildPutTable(f, [&](size_t i) { return pieces[i]; }, &table,
                                      [&](std::span<const std::byte> b) { payload.push_back(b); });
  CHECK(table.size() == 3 * kPutItemSize);
  CHECK(payload.size() == 4);  // empty pieces are not sent
  // The frame as it goes on the wire, parsed by the node's parser.
  std::string wire = table;
  for (auto b : payload) wire.append(reinterpret_cast<const char*>(b.data()), b.size());
  CHECK(body == wire.size());
  FrameHeader h;
  h.opcode = Opcode::kPut;
  h.count = 3;
  h.body_len = static_cast<uint32_t>(body);
  const std::span<const std::byte> all = std::as_bytes(std::span(wire));
  std::vector<PutRecord> recs;
  REQUIRE(ParsePutTable(h, all.first(table.size()), ProtocolLimits{}, &recs).ok());
  size_t at = table.size();
  for (size_t i = 0; i < recs.size(); ++i) {
    CHECK(recs[i].key == pieces[i].key);
    CHECK(recs[i].priority == pieces[i].priority);
    REQUIRE(recs[i].size == heads[i].size() + datas[i].size());
    // The node checks Checksum64 over the block's bytes as they arrive, contiguous.
    CHECK(recs[i].checksum == Checksum64(all.data() + at, recs[i].size));
    at += recs[i].size;
  }
  CHECK(PayloadChecksum({}, datas[0]) == Checksum64(datas[0].data(), datas[0].size()));

  // A later frame of the same batch reuses the table string.
  const FrameSpan g{1, 3};
  payload.clear();
  BuildPutTable(g, [&](size_t i) { return pieces[i]; }, &table, [&](std::span<const std::byte> b) { payload.push_back(b); });
  CHECK(table.size() == 2 * kPutItemSize);
  CHECK(ReadKey(reinterpret_cast<const std::byte*>(table.data())) == pieces[1].key);
}

TEST_CASE("Frame plan: a key table is the key list the node parses", "[unit][plan][frame]") {
  std::vector<BlockKey> keys = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  std::string table;
  const FrameSpan f{1, 4};
  const uint64_t len = BuildKeyTable(f, [&](size_t i) { return keys[i]; }, &table);
  CHECK(len == 3 * kKeySize);
  FrameHeader h;
  h.opcode = Opcode::kExists;
  h.count = 3;
  h.body_len = static_cast<uint32_t>(len);
  std::vector<BlockKey> parsed;
  REQUIRE(ParseKeys(h, std::as_bytes(std::span(table)), &parsed).ok());
  CHECK(parsed == std::vector<BlockKey>(keys.begin() + 1, keys.end()));
}

TEST_CASE("Frame plan: a GET record makes the item's status; a hit is verified where it landed",
          "[unit][plan][frame]") {
  CHECK(GetRecordStatus(GetRecord{StatusCode::kOk, 10, 0}).ok());
  const Status miss = GetRecordStatus(GetRecord{StatusCode::kNotFound, 0, 0});
  CHECK(miss.code() == StatusCode::kNotFound);
  CHECK(miss.message() == "not stored");
  CHECK(GetRecordStatus(GetRecord{StatusCode::kPermissionDenied, 0, 0}).code() == StatusCode::kPermissionDenied);
  const auto b = Bytes(4096, 5);
  CHECK(VerifyPayload(b, Checksum64(b.data(), b.size())).ok());
  auto bad = b;
  bad[100] ^= std::byte{1};
  CHECK(VerifyPayload(bad, Checksum64(b.data(), b.size())).code() == StatusCode::kDataLoss);
  CHECK(IsMiss(VerifyPayload(bad, 0)));  // corrupt in transit: a miss, the next replica is asked
}

// ---- replica plan ----------------------------------------------------------

TEST_CASE("Replica plan: writes start on every replica rank, reads on rank 0; ranks follow the map's placement",
          "[unit][plan][replica]") {
  auto m = Map(4, 3);
  CHECK(StartRanks(*m, ReplicaOp::kPut) == 3);
  CHECK(StartRanks(*m, ReplicaOp::kErase) == 3);
  CHECK(StartRanks(*m, ReplicaOp::kGet) == 1);
  CHECK(StartRanks(*m, ReplicaOp::kExists) == 1);
  for (uint64_t k = 0; k < 50; ++k) {
    const BlockKey key{k * 0x9E3779B97F4A7C15ull, k};
    uint32_t place[ShardMap::kMaxReplicas];
    REQUIRE(m->Place(key, {}, place) == 3);
    for (uint32_t r = 0; r < 3; ++r) CHECK(NodeAtRank(*m, key, {}, r) == place[r]);
    CHECK(NodeAtRank(*m, key, {}, 3) == kNoNode);
    CHECK(NodeAtRank(*m, key, {}, 0) == static_cast<uint32_t>(m->Primary(key, {})));
  }
  // Fewer live nodes than replicas: no node past the last.
  auto two = Map(2, 3);
  CHECK(NodeAtRank(*two, BlockKey{1, 1}, {}, 1) != kNoNode);
  CHECK(NodeAtRank(*two, BlockKey{1, 1}, {}, 2) == kNoNode);

  // One round of a batch: the wanted keys, each with its node at that rank, in order.
  std::vector<BlockKey> keys;
  for (uint64_t k = 0; k < 10; ++k) keys.push_back(BlockKey{k, ~k});
  std::vector<std::pair<size_t, uint32_t>> got;
  const bool any = PlaceRank(
      *m, keys.size(), {}, 1, [&](size_t i) { return keys[i]; }, [](size_t i) { return i % 2 == 0; },
      [&](size_t i, uint32_t node) { got.emplace_back(i, node); });
  CHECK(any);
  REQUIRE(got.size() == 5);
  for (size_t j = 0; j < got.size(); ++j) {
    CHECK(got[j].first == 2 * j);
    CHECK(got[j].second == NodeAtRank(*m, keys[2 * j], {}, 1));
  }
  CHECK_FALSE(PlaceRank(*two, keys.size(), {}, 2, [&](size_t i) { return keys[i]; }, [](size_t) { return true; },
                        [](size_t, uint32_t) { FAIL("placed past the last rank"); }));
}

TEST_CASE("Replica plan: a GET miss and an unanswered EXISTS ask the next rank; answers and StaleEpoch do not",
          "[unit][plan][replica]") {
  CHECK(AskNextRank(ReplicaOp::kGet, NotFound("not stored")));
  CHECK(AskNextRank(ReplicaOp::kGet, DataLoss("checksum")));
  CHECK(AskNextRank(ReplicaOp::kGet, Unavailable("down")));
  CHECK(AskNextRank(ReplicaOp::kGet, DeadlineExceeded("slow")));
  CHECK_FALSE(AskNextRank(ReplicaOp::kGet, Status::Ok()));
  CHECK_FALSE(AskNextRank(ReplicaOp::kGet, ResourceExhausted("destination too small")));
  CHECK_FALSE(AskNextRank(ReplicaOp::kGet, PermissionDenied("tenant")));
  CHECK_FALSE(AskNextRank(ReplicaOp::kGet, StaleEpoch("old map")));
  CHECK_FALSE(AskNextRank(ReplicaOp::kExists, Status::Ok()));  // found or not: an answer
  CHECK(AskNextRank(ReplicaOp::kExists, Unavailable("down")));
  CHECK(AskNextRank(ReplicaOp::kExists, PermissionDenied("refused")));
  CHECK_FALSE(AskNextRank(ReplicaOp::kExists, StaleEpoch("old map")));
  CHECK_FALSE(AskNextRank(ReplicaOp::kPut, Unavailable("down")));  // writes went to every rank already
  CHECK_FALSE(AskNextRank(ReplicaOp::kErase, NotFound("gone")));
}

TEST_CASE("Replica plan: a PUT is stored when any replica stored it, else the lowest rank's error",
          "[unit][plan][replica]") {
  WriteMerge none;
  CHECK(none.Result().code() == StatusCode::kUnavailable);  // no replica answered
  WriteMerge any;
  any.Add(0, Unavailable("rank 0 down"));
  any.Add(2, Status::Ok());
  any.Add(1, ResourceExhausted("full"));
  CHECK(any.stored());
  CHECK(any.Result().ok());
  // Answers arrive in any order (the proxy's legs): the lowest rank's error wins.
  WriteMerge failed;
  failed.Add(2, PermissionDenied("rank 2"));
  failed.Add(0, ResourceExhausted("rank 0"));
  failed.Add(1, Unavailable("rank 1"));
  CHECK_FALSE(failed.stored());
  CHECK(failed.Result().code() == StatusCode::kResourceExhausted);
  CHECK(failed.Result().message() == "rank 0");
}

TEST_CASE("Replica plan: StaleEpoch refreshes the map once, not twice; a failed refresh is final",
          "[unit][plan][replica]") {
  CHECK(EpochRetry::IsStale(StaleEpoch("old")));
  CHECK_FALSE(EpochRetry::IsStale(Unavailable("down")));
  EpochRetry r;
  CHECK_FALSE(r.WantsRefresh(false));
  CHECK(r.WantsRefresh(true));
  CHECK(r.Refreshed(Status::Ok()));  // placed again with the new map
  CHECK(r.refreshed());
  CHECK_FALSE(r.WantsRefresh(true));  // the second StaleEpoch is the answer
  EpochRetry f;
  CHECK(f.WantsRefresh(true));
  CHECK_FALSE(f.Refreshed(Unavailable("coordinator down")));  // not placed again
  CHECK_FALSE(f.WantsRefresh(true));
  // After a refresh a read starts over at rank 0; a write's leg keeps its rank.
  CHECK(EpochRetry::RankAfterRefresh(ReplicaOp::kGet, 2) == 0);
  CHECK(EpochRetry::RankAfterRefresh(ReplicaOp::kExists, 1) == 0);
  CHECK(EpochRetry::RankAfterRefresh(ReplicaOp::kPut, 2) == 2);
  CHECK(EpochRetry::RankAfterRefresh(ReplicaOp::kErase, 1) == 1);
}
