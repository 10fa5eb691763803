// shard_node/server/frame_handler.h — the node's one door for kvmesh
// protocol frames, whatever transport carried them (Asio TCP and TLS, UCX
// active messages, UCX one-sided transfers). Holds the per-frame logic every
// server shares: HELLO and its credentials (the cluster secret or a tenant's
// name and token), admission and the stale-epoch refusal (Admit), the answer
// headers (AnswerHeader), and the batch operations, each in the namespace of
// the identity the connection proved (TenantView); explicit pins (PIN /
// UNPIN) belong to the connection that made them (ConnectionPins). A
// transport that reaches the client's memory one-sided gives its connections
// a remote-memory capability (RemoteMemory, ggml-backend style): MEM_REGISTER,
// MEM_UNREGISTER, GET_INTO and PUT_FROM enter here like every frame and are
// then handed to it; without one (TCP) they are answered Unimplemented.
// Answers are a list of byte pieces (header, tables, then payloads straight
// from pool memory, pinned by the BlockRefs the reply owns) for one gathered
// send.
//
// Thread-safety: Handle() may run concurrently for different connections.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "shard_node/block_store.h"
#include "shard_node/sequence_service.h"
#include "shard_node/tenant_view.h"
#include "transport/protocol.h"

namespace kvmesh {

class ShardNode;

// One answer frame, ready to send. `pieces` may point into the reply's own
// `header` and `body` (a short body lives inside the string object): a move
// re-points them into the new object, so a reply handed on (UcxRma's
// completion, a queued send) never sends the bytes of a destroyed one.
struct FrameReply {
  proto::HeaderBytes header;
  std::string body;
  std::vector<BlockRef> refs;       // pins the payloads until the reply is sent
  std::vector<std::string> copies;  // device-memory blocks copied out
  std::vector<std::vector<std::byte>> buffers;  // SEQ_READ K and V
  std::vector<std::span<const std::byte>> pieces;  // what to send, in order

  FrameReply() = default;
  FrameReply(FrameReply&& o) noexcept { *this = std::move(o); }
  FrameReply& operator=(FrameReply&& o) noexcept {
    if (this == &o) return *this;
    const auto* oh = reinterpret_cast<const std::byte*>(o.header.data());
    const auto* ob = reinterpret_cast<const std::byte*>(o.body.data());
    const size_t obn = o.body.size();
    header = o.header;
    body = std::move(o.body);
    refs = std::move(o.refs);
    copies = std::move(o.copies);  // the strings' bytes stay where they are
    buffers = std::move(o.buffers);
    pieces = std::move(o.pieces);
    const auto* nh = reinterpret_cast<const std::byte*>(header.data());
    const auto* nb = reinterpret_cast<const std::byte*>(body.data());
    // Addresses compared as integers: the pieces may point anywhere.
    auto inside = [](const std::byte* p, size_t n, const std::byte* base, size_t len) {
      const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base);
      return a >= b && a + n <= b + len;
    };
    for (auto& p : pieces) {
      if (inside(p.data(), p.size(), oh, header.size())) {
        p = std::span<const std::byte>(nh + (p.data() - oh), p.size());
      } else if (inside(p.data(), p.size(), ob, obn)) {
        p = std::span<const std::byte>(nb + (p.data() - ob), p.size());
      }
    }
    o.pieces.clear();
    return *this;
  }
  FrameReply(const FrameReply&) = delete;
  FrameReply& operator=(const FrameReply&) = delete;

  void SetHeaderAndBody() {
    pieces = {std::as_bytes(std::span(header)), std::as_bytes(std::span<const char>(body.data(), body.size()))};
  }
  size_t bytes() const {
    size_t n = 0;
    for (auto p : pieces) n += p.size();
    return n;
  }
};

// The most explicit pins (PIN frames not yet matched by an UNPIN) one
// connection or UCX session may hold; a PIN past it answers
// RESOURCE_EXHAUSTED for that key. (A tenant with a quota is also bound to
// pins over at most its quota's worth of chunk bytes, summed over its
// connections: TenantRegistry::ReservePin.)
inline constexpr size_t kMaxPinsPerConnection = 256;

// The explicit pins one connection (or UCX session) holds, by stored key.
// Each is a handle on the pinned chunk (ShardNode::PinRef): an UNPIN
// releases the oldest pin the connection holds on the key, and destroying
// (or resetting) the set releases them all, so a pin never outlives its
// connection, and a pinned block that was erased, replaced or evicted by a
// quota meanwhile is freed at that release. A pin belongs to its connection:
// another connection's UNPIN of the key does not release it.
// Move-only; one thread at a time (the connection's). REQUIRES: the node
// outlives the set.
class ConnectionPins {
 public:
  ConnectionPins() = default;
  ~ConnectionPins() { Clear(); }
  ConnectionPins(ConnectionPins&& o) noexcept { *this = std::move(o); }
  ConnectionPins& operator=(ConnectionPins&& o) noexcept;
  ConnectionPins(const ConnectionPins&) = delete;
  ConnectionPins& operator=(const ConnectionPins&) = delete;

  // Pins `stored` (a stored, scoped key) for tenant t. ResourceExhausted past
  // kMaxPinsPerConnection or the tenant's pin budget; the node's misses.
  Status Pin(ShardNode* node, uint32_t t, const BlockKey& stored);
  // Releases the oldest of this connection's pins on `stored`.
  // FailedPrecondition when the connection holds none and the block is
  // stored, NotFound when it is not.
  Status Unpin(ShardNode* node, const BlockKey& stored);
  // Releases every pin (what closing the connection does).
  void Clear();
  size_t size() const { return count_; }

 private:
  struct Held {
    BlockRef ref;
    uint64_t charge = 0;  // what the tenant's pin budget was charged
  };
  ShardNode* node_ = nullptr;
  uint32_t tenant_ = 0;
  absl::flat_hash_map<BlockKey, std::vector<Held>> held_;  // oldest first
  size_t count_ = 0;
};

// A connection's remote-memory capability: what its transport does for the
// frames that move bytes one-sided between the node's pool and the client's
// registered memory (docs/protocol.md "Registered memory"). FrameHandler
// admits each such frame (authenticated, epoch current), parses what it can
// and calls this in the connection's tenant namespace; UCX sessions have one
// (UcxSessionMemory, shard_node/server/ucx_rma.h), TCP connections none.
// Called on the connection's thread only.
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;
  // MEM_REGISTER: the client's region `r` (a known id is replaced).
  // InvalidArgument when its key does not unpack: the answer.
  virtual Status Register(const proto::MemRegister& r) = 0;
  // MEM_UNREGISTER: forgets region `id` (unknown: nothing to do).
  virtual void Unregister(uint64_t id) = 0;
  // GET_INTO, PUT_FROM: start the frame's transfers for tenant view `v`. The
  // capability answers once the bytes have moved, its answer header from
  // FrameHandler::OkReply. A body that does not parse returns
  // InvalidArgument and starts nothing (the connection is then closed).
  virtual Status GetInto(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView v) = 0;
  virtual Status PutFrom(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView v) = 0;
};

// What one connection (or UCX session) has proven so far, and the pins it
// holds: destroying or resetting it (the connection closed, a session
// dropped) releases them.
struct ConnectionAuth {
  bool hello_done = false;
  // The identity its HELLO proved (TenantRegistry::Authenticate): every data
  // frame then acts in that tenant's namespace (TenantView).
  uint32_t tenant = 0;  // kClusterTenant
  ConnectionPins pins;  // its PIN frames' pins
  // Its transport's remote-memory capability (not owned); null: none.
  RemoteMemory* memory = nullptr;

  // Forgets the handshake and releases the pins (the capability stays).
  void Reset() {
    hello_done = false;
    tenant = 0;
    pins.Clear();
  }
};

enum class FrameOutcome {
  kReply,           // send the reply, keep the connection
  kReplyThenClose,  // send the reply (an error answer), then close
  kClose,           // malformed: close without answering
  kLater,           // handed to the connection's RemoteMemory, which answers when its transfer is done
};

// A PUT record's options (PutOptions) for the PUT ladder (TenantView::StartPut),
// with the frame's flags.
inline PutOptions PutOptionsOf(const proto::PutRecord& r, uint16_t flags) {
  PutOptions po;
  po.priority = r.priority;
  po.codec = r.codec;
  po.replace = flags & proto::kFlagReplace;
  return po;
}

class FrameHandler {
 public:
  // A HELLO without a tenant name must carry `token` (the cluster secret;
  // empty: none needed); one with a name, a tenant's token of the node's
  // TenantRegistry ($.auth.tenants of its config).
  // REQUIRES: node and epoch outlive the handler.
  FrameHandler(ShardNode* node, proto::ProtocolLimits limits, std::string token, const std::atomic<uint64_t>* epoch)
      : node_(node), limits_(limits), token_(std::move(token)), epoch_(epoch) {}

  // Answers frame `h` (body already read and within limits) of a connection
  // whose handshake state is *conn.
  FrameOutcome Handle(const proto::FrameHeader& h, std::span<const std::byte> body, ConnectionAuth* conn,
                      FrameReply* rep);

  const proto::ProtocolLimits& limits() const { return limits_; }

  // Admission, for Handle and for a server that reads a data frame's body
  // itself (a PUT straight into pool memory): true when data frame h runs
  // now, its connection being authenticated and h's epoch current (0, or not
  // older than the node's: the one stale-epoch check); the frame is then
  // counted as admitted. When false, read the body and pass the frame to
  // Handle, which refuses it as the protocol says.
  bool Admit(const proto::FrameHeader& h, const ConnectionAuth& conn);

  // Answers to `req`, for servers that run an operation themselves.
  void ErrorReply(const proto::FrameHeader& req, const Status& s, FrameReply* rep);
  void OkReply(const proto::FrameHeader& req, uint32_t count, std::string body, FrameReply* rep);

  // Data frames of `op` admitted (Admit) so far.
  uint64_t admitted(proto::Opcode op) const {
    return admitted_[static_cast<uint8_t>(op)].load(std::memory_order_relaxed);
  }

  std::atomic<uint64_t> auth_failures{0}, stale{0}, malformed{0};

 private:
  Status HandleHello(const proto::FrameHeader& h, std::span<const std::byte> body, ConnectionAuth* conn,
                     FrameReply* rep);
  // Dispatches a data frame to its opcode's handler. Every handler below
  // answers into *rep and returns non-OK only for a malformed body (the
  // connection is then closed without an answer). `v` is the node as the
  // connection's tenant sees it.
  Status HandleData(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v, ConnectionAuth* conn,
                    FrameReply* rep);
  Status HandlePut(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v, FrameReply* rep);
  Status HandleGet(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v, FrameReply* rep);
  Status HandleExists(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v, FrameReply* rep);
  Status HandleMatchPrefix(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                           FrameReply* rep);
  // ERASE, RELEASE: `op` on each key, one status code byte per key.
  Status HandlePerKey(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                      Status (TenantView::*op)(const BlockKey&), FrameReply* rep);
  // PIN, UNPIN: the connection's own pins (ConnectionPins), one status code byte per key.
  Status HandlePins(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                    ConnectionPins* pins, bool pin, FrameReply* rep);
  Status HandleStats(const proto::FrameHeader& h, TenantView& v, FrameReply* rep);
  // LOCAL_MAP: the pool and index paths for a client of this host
  // (transport/local_index.h), or why not.
  Status HandleLocalMap(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v, FrameReply* rep);
  // MEM_REGISTER, MEM_UNREGISTER (answered here), GET_INTO, PUT_FROM (*later:
  // the capability answers) through the connection's RemoteMemory.
  Status HandleRemoteMemory(const proto::FrameHeader& h, std::span<const std::byte> body, TenantView& v,
                            RemoteMemory* memory, FrameReply* rep, bool* later);
  // SEQ_*: a refused call is an error answer, not a malformed frame.
  Status HandleSeqCreate(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                         FrameReply* rep);
  Status HandleSeqAppend(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                         FrameReply* rep);
  Status HandleSeqTruncate(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                           FrameReply* rep);
  Status HandleSeqFork(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                       FrameReply* rep);
  Status HandleSeqRelease(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                          FrameReply* rep);
  Status HandleSeqInfo(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                       FrameReply* rep);
  Status HandleSeqRead(const proto::FrameHeader& h, std::span<const std::byte> body, const SeqCaller& c,
                       FrameReply* rep);
  // Answers `s` as an error, or OK with `ok_body`; returns OK.
  Status SeqAnswer(const proto::FrameHeader& h, const Status& s, std::string ok_body, FrameReply* rep);
  // The header of every answer to `req`: the node's epoch, `status`, `count`
  // records and a body of body_len bytes.
  proto::HeaderBytes AnswerHeader(const proto::FrameHeader& req, StatusCode status, uint32_t count,
                                  uint32_t body_len) const;

  ShardNode* node_;
  const proto::ProtocolLimits limits_;
  const std::string token_;
  const std::atomic<uint64_t>* epoch_;
  std::array<std::atomic<uint64_t>, proto::kMaxOpcode + 1> admitted_{};
};

}  // namespace kvmesh
