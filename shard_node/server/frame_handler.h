// shard_node/server/frame_handler.h — answers kvmesh protocol frames for one
// ShardNode, whatever transport carried them (Asio TCP, UCX active messages).
// Holds the per-frame logic every server shares: HELLO and its credentials
// (the cluster secret or a tenant's name and token), the stale-epoch refusal,
// and the batch operations, each in the namespace of the identity the
// connection proved (TenantView); explicit pins (PIN / UNPIN) belong to the
// connection that made them (ConnectionPins). Answers are a list of byte
// pieces (header, tables, then payloads straight from pool memory, pinned by
// the BlockRefs the reply owns) for one gathered send.
//
// Thread-safety: Handle() may run concurrently for different connections.
#pragma once

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

// What one connection (or UCX session) has proven so far, and the pins it
// holds: destroying or resetting it (the connection closed, a session
// dropped) releases them.
struct ConnectionAuth {
  bool hello_done = false;
  // The identity its HELLO proved (TenantRegistry::Authenticate): every data
  // frame then acts in that tenant's namespace (TenantView).
  uint32_t tenant = 0;  // kClusterTenant
  ConnectionPins pins;  // its PIN frames' pins
};

enum class FrameOutcome {
  kReply,           // send the reply, keep the connection
  kReplyThenClose,  // send the reply (an error answer), then close
  kClose,           // malformed: close without answering
};

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

  // For a server that reads a data frame's body itself (a PUT straight into
  // pool memory): true when frame h would run now, its connection being
  // authenticated and its epoch current. When false, read the body and pass
  // the frame to Handle, which refuses it as the protocol says.
  bool Admits(const proto::FrameHeader& h, const ConnectionAuth& conn) const;

  // Answers to `req`, for servers that run an operation themselves.
  void ErrorReply(const proto::FrameHeader& req, const Status& s, FrameReply* rep);
  void OkReply(const proto::FrameHeader& req, uint32_t count, std::string body, FrameReply* rep);

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

  ShardNode* node_;
  const proto::ProtocolLimits limits_;
  const std::string token_;
  const std::atomic<uint64_t>* epoch_;
};

}  // namespace kvmesh
