#include "shard_node/server/frame_handler.h"

#include <unistd.h>

#include <cstring>

#include "common/checksum.h"
#include "common/credentials.h"
#include "kvmesh/clock.h"
#include "shard_node/shard_node.h"
#include "transport/local_index.h"

namespace kvmesh {

using namespace proto;

// ---- ConnectionPins -----------------------------------------------------------------

ConnectionPins& ConnectionPins::operator=(ConnectionPins&& o) noexcept {
  if (this != &o) {
    Clear();
    node_ = o.node_;
    tenant_ = o.tenant_;
    held_ = std::move(o.held_);
    count_ = o.count_;
    o.held_.clear();
    o.count_ = 0;
  }
  return *this;
}

Status ConnectionPins::Pin(ShardNode* node, uint32_t t, const BlockKey& stored) {
  if (count_ > 0 && (node != node_ || t != tenant_)) Clear();  // never expected: one node and identity per connection
  node_ = node;
  tenant_ = t;
  if (count_ >= kMaxPinsPerConnection)
    return ResourceExhausted("this connection holds its limit of " + std::to_string(kMaxPinsPerConnection) +
                             " pins: unpin some");
  KVMESH_ASSIGN_OR_RETURN(BlockRef ref, node->PinRef(stored));
  const uint64_t charge = node->store().ChunkBytesFor(ref.meta().size);
  KVMESH_RETURN_IF_ERROR(node->tenants().ReservePin(t, charge));  // ref unpins on the way out
  held_[stored].push_back(Held{std::move(ref), charge});
  ++count_;
  return Status::Ok();
}

Status ConnectionPins::Unpin(ShardNode* node, const BlockKey& stored) {
  auto it = held_.find(stored);
  if (it == held_.end()) {
    if (node->Exists(stored, false)) return FailedPrecondition("the block is not pinned by this connection");
    return NotFound("the block is not stored (nor pinned by this connection)");
  }
  std::vector<Held>& v = it->second;
  const uint64_t charge = v.front().charge;
  v.erase(v.begin());  // releases the pin: a doomed chunk is freed here
  if (v.empty()) held_.erase(it);
  --count_;
  node_->tenants().ReleasePin(tenant_, charge);
  return Status::Ok();
}

void ConnectionPins::Clear() {
  if (count_ == 0 || node_ == nullptr) return;
  uint64_t charge = 0;
  for (auto& [key, v] : held_)
    for (const Held& h : v) charge += h.charge;
  held_.clear();  // every pin released
  count_ = 0;
  node_->tenants().ReleasePin(tenant_, charge);
}

// ---- FrameHandler ---------------------------------------------------------------------

FrameOutcome FrameHandler::Handle(const FrameHeader& h, std::span<const std::byte> body, ConnectionAuth* conn,
                                  FrameReply* rep) {
  if (!conn->hello_done || h.opcode == Opcode::kHello) {
    Status st = HandleHello(h, body, conn, rep);
    if (st.code() == StatusCode::kInvalidArgument && rep->pieces.empty()) {
      malformed.fetch_add(1);
      return FrameOutcome::kClose;
    }
    if (!st.ok()) return FrameOutcome::kReplyThenClose;
    conn->hello_done = true;
    return FrameOutcome::kReply;
  }
  if (!Admit(h, *conn)) {
    stale.fetch_add(1);
    ErrorReply(h, StaleEpoch("shard-map epoch " + std::to_string(h.epoch) + " is stale; node " + node_->id() +
                             " is at epoch " + std::to_string(epoch_->load(std::memory_order_acquire)) +
                             ": refresh the map"),
               rep);
    return FrameOutcome::kReply;
  }
  TenantView v(node_, conn->tenant);
  if (IsRemoteMemoryOpcode(h.opcode)) {
    bool later = false;
    if (!HandleRemoteMemory(h, body, v, conn->memory, rep, &later).ok()) {
      malformed.fetch_add(1);
      return FrameOutcome::kClose;
    }
    return later ? FrameOutcome::kLater : FrameOutcome::kReply;
  }
  if (!HandleData(h, body, v, conn, rep).ok()) {
    malformed.fetch_add(1);
    return FrameOutcome::kClose;
  }
  return FrameOutcome::kReply;
}

bool FrameHandler::Admit(const FrameHeader& h, const ConnectionAuth& conn) {
  if (!conn.hello_done || h.opcode == Opcode::kHello) return false;
  const uint64_t node_epoch = epoch_->load(std::memory_order_acquire);
  if (h.epoch != 0 && h.epoch < node_epoch) return false;
  admitted_[static_cast<uint8_t>(h.opcode)].fetch_add(1, std::memory_order_relaxed);
  return true;
}

Status FrameHandler::HandleRemoteMemory(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                        RemoteMemory* memory, FrameReply* rep, bool* later) {
  if (memory == nullptr) {
    // One-sided transfers need a transport with remote memory access.
    ErrorReply(h, Unimplemented(std::string(OpcodeName(h.opcode)) + " is served over UCX only"), rep);
    return Status::Ok();
  }
  switch (h.opcode) {
    case Opcode::kMemRegister: {
      MemRegister m;
      KVMESH_RETURN_IF_ERROR(ParseMemRegister(body, &m));
      const Status s = memory->Register(m);
      if (s.ok()) OkReply(h, 0, {}, rep);
      else ErrorReply(h, s, rep);
      return Status::Ok();
    }
    case Opcode::kMemUnregister: {
      uint64_t id = 0;
      KVMESH_RETURN_IF_ERROR(ParseSeqId(body, &id));
      memory->Unregister(id);
      OkReply(h, 0, {}, rep);
      return Status::Ok();
    }
    case Opcode::kGetInto:
      KVMESH_RETURN_IF_ERROR(memory->GetInto(h, body, v));
      *later = true;
      return Status::Ok();
    case Opcode::kPutFrom:
      KVMESH_RETURN_IF_ERROR(memory->PutFrom(h, body, v));
      *later = true;
      return Status::Ok();
    default:
      return InvalidArgument("not a remote-memory opcode");
  }
}

// Returns OK when the connection is now authenticated; non-OK closes it
// (InvalidArgument with an empty reply: malformed, close without answering).
Status FrameHandler::HandleHello(const FrameHeader& h, std::span<const std::byte> body, ConnectionAuth* conn,
                                 FrameReply* rep) {
  if (conn->hello_done) {
    ErrorReply(h, InvalidArgument("HELLO sent twice"), rep);
    return InvalidArgument("HELLO twice");
  }
  if (h.opcode != Opcode::kHello) {
    auth_failures.fetch_add(1);
    ErrorReply(h, PermissionDenied("the first frame must be HELLO"), rep);
    return PermissionDenied("no HELLO");
  }
  Hello hello;
  Status st = ParseHelloBody(body, &hello);
  if (!st.ok()) return st;
  if (hello.version_min > kVersion || hello.version_max < kVersion) {
    ErrorReply(h, InvalidArgument("no common protocol version (node speaks " + std::to_string(kVersion) + ")"), rep);
    return FailedPrecondition("version");
  }
  // The cluster secret (no tenant name) or a tenant's name and token; the
  // connection's frames then act in that identity's namespace. A cluster
  // without tenants ignores the name (clients once sent their salt there).
  Result<uint32_t> who = kClusterTenant;
  if (!hello.tenant.empty() && node_->tenants().has_tenants())
    who = node_->tenants().Authenticate(hello.tenant, hello.token);
  else if (!token_.empty() && !ConstantTimeEquals(hello.token, token_))
    who = PermissionDenied(hello.token.empty() ? "this node requires a token" : "wrong token");
  if (!who.ok()) {
    auth_failures.fetch_add(1);
    ErrorReply(h, who.status(), rep);
    return who.status();
  }
  conn->tenant = *who;
  HelloAnswer a{node_->id(), limits_};
  OkReply(h, 0, EncodeHelloAnswerBody(a), rep);
  return Status::Ok();
}

HeaderBytes FrameHandler::AnswerHeader(const FrameHeader& req, StatusCode status, uint32_t count,
                                      uint32_t body_len) const {
  FrameHeader h;
  h.opcode = req.opcode;
  h.flags = kFlagResponse;
  h.request_id = req.request_id;
  h.epoch = epoch_->load(std::memory_order_relaxed);
  h.status = status;
  h.count = count;
  h.body_len = body_len;
  return EncodeHeader(h);
}

void FrameHandler::ErrorReply(const FrameHeader& req, const Status& s, FrameReply* rep) {
  rep->body = s.message().substr(0, 1024);
  rep->header = AnswerHeader(req, s.code(), 0, static_cast<uint32_t>(rep->body.size()));
  rep->SetHeaderAndBody();
}

void FrameHandler::OkReply(const FrameHeader& req, uint32_t count, std::string body, FrameReply* rep) {
  rep->body = std::move(body);
  rep->header = AnswerHeader(req, StatusCode::kOk, count, static_cast<uint32_t>(rep->body.size()));
  rep->SetHeaderAndBody();
}

// Answers one data frame. Non-OK only for a malformed body (closes the connection).
Status FrameHandler::HandleData(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                ConnectionAuth* conn, FrameReply* rep) {
  const SeqCaller c{v.tenant(), node_->tenants().Namespace(v.tenant())};
  switch (h.opcode) {
    case Opcode::kPut: return HandlePut(h, body, v, rep);
    case Opcode::kGet: return HandleGet(h, body, v, rep);
    case Opcode::kExists: return HandleExists(h, body, v, rep);
    case Opcode::kMatchPrefix: return HandleMatchPrefix(h, body, v, rep);
    case Opcode::kErase: return HandlePerKey(h, body, v, &TenantView::Erase, rep);
    case Opcode::kPin: return HandlePins(h, body, v, &conn->pins, /*pin=*/true, rep);
    case Opcode::kRelease: return HandlePerKey(h, body, v, &TenantView::Release, rep);
    case Opcode::kUnpin: return HandlePins(h, body, v, &conn->pins, /*pin=*/false, rep);
    case Opcode::kStats: return HandleStats(h, v, rep);
    case Opcode::kLocalMap: return HandleLocalMap(h, body, v, rep);
    case Opcode::kSeqCreate: return HandleSeqCreate(h, body, c, rep);
    case Opcode::kSeqAppend: return HandleSeqAppend(h, body, c, rep);
    case Opcode::kSeqTruncate: return HandleSeqTruncate(h, body, c, rep);
    case Opcode::kSeqFork: return HandleSeqFork(h, body, c, rep);
    case Opcode::kSeqRelease: return HandleSeqRelease(h, body, c, rep);
    case Opcode::kSeqInfo: return HandleSeqInfo(h, body, c, rep);
    case Opcode::kSeqRead: return HandleSeqRead(h, body, c, rep);
    case Opcode::kMemRegister:
    case Opcode::kMemUnregister:
    case Opcode::kGetInto:
    case Opcode::kPutFrom:  // HandleRemoteMemory
    case Opcode::kHello:    // answered by Handle() before any data frame
      break;
  }
  return InvalidArgument("unexpected opcode");
}

Status FrameHandler::HandleLocalMap(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                    FrameReply* rep) {
  uint64_t host = 0;
  KVMESH_RETURN_IF_ERROR(ParseSeqId(body, &host));  // one u64
  Status no;
  if (host == 0 || host != HostBootId()) {
    no = FailedPrecondition("local reads are for clients on the node's host");
  } else if (v.tenant() != kClusterTenant) {
    // The mapping is the whole pool, every namespace's blocks.
    no = FailedPrecondition("local reads map the whole pool: a tenant reads through the node");
  } else if (!node_->StartLocalReads()) {
    no = FailedPrecondition("this node offers no local reads (its pool is not shared host memory, or "
                            "$.transport.ucx.local_reads is false)");
  }
  if (!no.ok()) {
    ErrorReply(h, no, rep);
    return Status::Ok();
  }
  const std::string fds = "/proc/" + std::to_string(::getpid()) + "/fd/";
  LocalMapAnswer a;
  a.pool_bytes = node_->local_pool_bytes();
  a.index_bytes = node_->local_index()->bytes();
  a.pool_path = fds + std::to_string(node_->local_pool_fd());
  a.index_path = fds + std::to_string(node_->local_index()->fd());
  OkReply(h, 0, EncodeLocalMapAnswer(a), rep);
  return Status::Ok();
}

Status FrameHandler::HandlePut(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                               FrameReply* rep) {
  const size_t table = size_t{h.count} * kPutItemSize;
  std::vector<PutRecord> recs;
  KVMESH_RETURN_IF_ERROR(ParsePutTable(h, body.first(table), limits_, &recs));
  std::string codes(h.count, '\0');
  size_t off = table;
  for (size_t i = 0; i < recs.size(); ++i) {
    const PutRecord& r = recs[i];
    std::span<const std::byte> data = body.subspan(off, r.size);
    off += r.size;
    // The PUT ladder; the body is here, so it is the staging buffer too.
    TenantView::PutLanding p = v.StartPut(r.key, r.size, r.checksum, PutOptionsOf(r, h.flags));
    if (p.reserved()) std::memcpy(p.chunk().data(), data.data(), data.size());
    codes[i] = static_cast<char>(v.FinishPut(p, data).code());
  }
  OkReply(h, h.count, std::move(codes), rep);
  return Status::Ok();
}

Status FrameHandler::HandleGet(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                               FrameReply* rep) {
  std::vector<BlockKey> keys;
  KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
  std::string table(keys.size() * kGetItemSize, '\0');
  rep->refs.reserve(keys.size());
  const bool host = node_->store().backend().host_accessible();
  uint64_t total = table.size();
  std::vector<std::span<const std::byte>> payloads;
  rep->copies.reserve(keys.size());  // copies_ never reallocates: payload spans point into it
  for (size_t i = 0; i < keys.size(); ++i) {
    GetRecord r;
    // Host memory goes out unverified: the client verifies where it lands
    // (one hash pass per direction). Device memory is verified here, copied out.
    Result<BlockRef> ref = host ? v.GetForTransfer(keys[i]) : v.Get(keys[i]);
    if (!ref.ok()) {
      r.status = ref.status().code();
    } else if (total + ref->meta().logical_size > limits_.max_body_bytes) {
      r.status = StatusCode::kBusy;  // the answer is full: ask again in a smaller batch
    } else if (ref->meta().codec != 0) {
      // Stored encoded (config.codec): clients get the decoded block, as
      // in-process reads do, so the router API means the same everywhere.
      std::string& c = rep->copies.emplace_back(ref->meta().logical_size, '\0');
      ref->Release();
      Result<size_t> n = v.GetInto(keys[i], std::as_writable_bytes(std::span<char>(c)));
      if (!n.ok()) {
        r.status = n.status().code();
        rep->copies.pop_back();
      } else {
        c.resize(*n);
        r.size = static_cast<uint32_t>(*n);
        r.checksum = Checksum64(c.data(), c.size());
        total += r.size;
        payloads.push_back(std::as_bytes(std::span<const char>(c)));
      }
    } else {
      r.size = ref->meta().size;
      r.checksum = ref->meta().checksum;
      total += r.size;
      if (host) {
        payloads.push_back(ref->data());
        rep->refs.push_back(std::move(*ref));
      } else {
        std::string& c = rep->copies.emplace_back(r.size, '\0');
        node_->store().backend().CopyOut(reinterpret_cast<std::byte*>(c.data()), ref->data().data(), r.size);
        payloads.push_back(std::as_bytes(std::span<const char>(c)));
      }
    }
    EncodeGetRecord(r, reinterpret_cast<std::byte*>(table.data()) + i * kGetItemSize);
  }
  OkReply(h, h.count, std::move(table), rep);
  // The header for the full body (table + payloads).
  rep->header = AnswerHeader(h, StatusCode::kOk, h.count, static_cast<uint32_t>(total));
  for (auto p : payloads) rep->pieces.push_back(p);
  return Status::Ok();
}

Status FrameHandler::HandleExists(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                  FrameReply* rep) {
  std::vector<BlockKey> keys;
  KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
  const bool touch = h.flags & kFlagTouch;
  std::string found(keys.size(), '\0');
  for (size_t i = 0; i < keys.size(); ++i) found[i] = v.Exists(keys[i], touch) ? 1 : 0;
  OkReply(h, h.count, std::move(found), rep);
  return Status::Ok();
}

Status FrameHandler::HandleMatchPrefix(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                       FrameReply* rep) {
  std::vector<BlockKey> keys;
  KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
  uint32_t run = 0;
  while (run < keys.size() && v.Exists(keys[run], /*touch=*/true)) ++run;
  std::string out(4, '\0');
  for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((run >> (8 * b)) & 0xFF);
  OkReply(h, h.count, std::move(out), rep);
  return Status::Ok();
}

Status FrameHandler::HandlePerKey(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                  Status (TenantView::*op)(const BlockKey&), FrameReply* rep) {
  std::vector<BlockKey> keys;
  KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
  std::string codes(keys.size(), '\0');
  for (size_t i = 0; i < keys.size(); ++i) codes[i] = static_cast<char>((v.*op)(keys[i]).code());
  OkReply(h, h.count, std::move(codes), rep);
  return Status::Ok();
}

Status FrameHandler::HandlePins(const FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                                ConnectionPins* pins, bool pin, FrameReply* rep) {
  std::vector<BlockKey> keys;
  KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
  std::string codes(keys.size(), '\0');
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey stored = v.Key(keys[i]);
    const Status s = pin ? pins->Pin(node_, v.tenant(), stored) : pins->Unpin(node_, stored);
    codes[i] = static_cast<char>(s.code());
  }
  OkReply(h, h.count, std::move(codes), rep);
  return Status::Ok();
}

Status FrameHandler::HandleStats(const FrameHeader& h, TenantView& v, FrameReply* rep) {
  // A tenant sees its own figures, never the node's (which name every tenant).
  if (v.tenant() != kClusterTenant) {
    OkReply(h, 0, node_->TenantStatsJson(v.tenant()), rep);
    return Status::Ok();
  }
  OkReply(h, 0, node_->StatsJson(), rep);
  return Status::Ok();
}

// SEQ_* frames against the node's SequenceService. Each returns non-OK only
// for a malformed body (closes the connection); a refused call (unknown id,
// wrong K/V size, checksum mismatch, limits) is an error answer and the
// connection stays.

Status FrameHandler::SeqAnswer(const FrameHeader& h, const Status& s, std::string ok_body, FrameReply* rep) {
  if (s.ok()) OkReply(h, 0, std::move(ok_body), rep);
  else ErrorReply(h, s, rep);
  return Status::Ok();
}

Status FrameHandler::HandleSeqCreate(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                     FrameReply* rep) {
  SeqCreateRequest q;
  KVMESH_RETURN_IF_ERROR(ParseSeqCreate(body, &q));
  SeqCreateArgs a;
  a.layers = q.layers;
  a.heads = q.heads;
  a.tenant_salt = q.tenant_salt;
  a.priority = q.priority;
  a.prefix = q.prefix;
  a.max_blocks = q.max_blocks == kSeqNoLimit ? SIZE_MAX : q.max_blocks;
  Result<SeqCreated> made = node_->sequences().Create(a, c);
  if (!made.ok()) return SeqAnswer(h, made.status(), {}, rep);
  return SeqAnswer(h, Status::Ok(), EncodeSeqCreateAnswer(*made), rep);
}

Status FrameHandler::HandleSeqAppend(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                     FrameReply* rep) {
  SeqAppendRequest q;
  KVMESH_RETURN_IF_ERROR(ParseSeqAppend(body, &q));
  if (Checksum64(q.k.data(), q.k.size()) != q.k_checksum || Checksum64(q.v.data(), q.v.size()) != q.v_checksum)
    return SeqAnswer(h, DataLoss("SEQ_APPEND K/V checksum mismatch in transit; nothing appended"), {}, rep);
  Result<uint32_t> pos = node_->sequences().Append(q.id, q.tokens, q.k, q.v, c);
  return SeqAnswer(h, pos.status(), pos.ok() ? EncodeU32(*pos) : std::string(), rep);
}

Status FrameHandler::HandleSeqTruncate(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                       FrameReply* rep) {
  uint64_t id = 0;
  uint32_t n = 0;
  KVMESH_RETURN_IF_ERROR(ParseSeqTruncate(body, &id, &n));
  return SeqAnswer(h, node_->sequences().Truncate(id, n, c), {}, rep);
}

Status FrameHandler::HandleSeqFork(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                   FrameReply* rep) {
  uint64_t id = 0;
  KVMESH_RETURN_IF_ERROR(ParseSeqId(body, &id));
  Result<SeqId> f = node_->sequences().Fork(id, c);
  return SeqAnswer(h, f.status(), f.ok() ? EncodeSeqId(*f) : std::string(), rep);
}

Status FrameHandler::HandleSeqRelease(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                      FrameReply* rep) {
  uint64_t id = 0;
  KVMESH_RETURN_IF_ERROR(ParseSeqId(body, &id));
  return SeqAnswer(h, node_->sequences().Release(id, c), {}, rep);
}

Status FrameHandler::HandleSeqInfo(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                   FrameReply* rep) {
  uint64_t id = 0;
  KVMESH_RETURN_IF_ERROR(ParseSeqId(body, &id));
  Result<SequenceState> st = node_->sequences().Info(id, c);
  if (!st.ok()) return SeqAnswer(h, st.status(), {}, rep);
  if (12 + uint64_t{st->length} * 4 > limits_.max_body_bytes)
    return SeqAnswer(h, ResourceExhausted("sequence too long for one SEQ_INFO answer"), {}, rep);
  return SeqAnswer(h, Status::Ok(), EncodeSeqInfoAnswer(*st), rep);
}

Status FrameHandler::HandleSeqRead(const FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                                   FrameReply* rep) {
  uint64_t id = 0;
  uint32_t from = 0, n = 0;
  KVMESH_RETURN_IF_ERROR(ParseSeqRead(body, &id, &from, &n));
  std::vector<std::byte> k, v;
  const size_t room = limits_.max_body_bytes - kSeqReadAnswerFixed;
  Result<SeqRows> rows = node_->sequences().Read(id, from, n, room, &k, &v, c);
  if (!rows.ok()) return SeqAnswer(h, rows.status(), {}, rep);
  if (k.size() + v.size() > room)
    return SeqAnswer(h, ResourceExhausted("one position of this slice exceeds the node's frame limit"), {}, rep);
  OkReply(h, 0,
          EncodeSeqReadAnswerHead(rows->n, rows->layers, rows->row_bytes, Checksum64(k.data(), k.size()),
                                  Checksum64(v.data(), v.size())),
          rep);
  rep->header = AnswerHeader(h, StatusCode::kOk, 0, static_cast<uint32_t>(rep->body.size() + k.size() + v.size()));
  rep->buffers.push_back(std::move(k));
  rep->buffers.push_back(std::move(v));
  for (const auto& b : rep->buffers) rep->pieces.push_back(std::span<const std::byte>(b));
  return Status::Ok();
}

}  // namespace kvmesh
