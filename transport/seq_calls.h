// transport/seq_calls.h — the client side of the SEQ_* frames, whatever
// carries them. A transport gives one request frame there and back
// (SeqFrameIo); these functions build the bodies, parse the answers, split an
// append too large for one frame into several and join a read the node
// answered in pieces, so every ShardChannel backend (TCP, UCX) gets its
// sequence calls from SeqOverFrames and behaves the same, byte for byte.
//
//   class MyChannel : public SeqOverFrames<ShardChannel> {
//     Status SeqRoundtrip(...) override;  // send one frame, wait for its answer
//     Result<uint64_t> SeqMaxBody() override;
//   };
//
// Errors: the transport's call-level failures and the node's refusals pass
// through unchanged; an answer that does not parse is Unavailable ("bad
// answer from the node"), a K/V checksum mismatch in transit DataLoss.
//
// Thread-safety: the functions keep no state; they are as thread-safe as the
// SeqFrameIo they are given.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvmesh/request.h"
#include "kvmesh/sequence.h"
#include "kvmesh/status.h"
#include "transport/protocol.h"

namespace kvmesh {

class SeqFrameIo {
 public:
  // Sends request `op` (count 0) whose body is the concatenation of `body`
  // and waits for its answer within o's timeout. OK: *answer holds the
  // answer's body. Otherwise the call-level failure or the node's refusal.
  virtual Status SeqRoundtrip(proto::Opcode op, std::span<const std::span<const std::byte>> body,
                              const RequestOptions& o, std::vector<std::byte>* answer) = 0;
  // The largest request body the node accepts (learnt at HELLO; may connect).
  virtual Result<uint64_t> SeqMaxBody() = 0;

 protected:
  ~SeqFrameIo() = default;
};

// The ShardChannel sequence calls (transport/shard_channel.h) over frames.
Result<SeqCreated> SeqCreateCall(SeqFrameIo& io, const SeqCreateArgs& a, const RequestOptions& o);
// Splits an append whose frame would exceed SeqMaxBody() into frames of
// whole tokens (K and V regathered per layer); a failure part way leaves the
// earlier frames' tokens appended. Returns the position of the first token.
Result<uint32_t> SeqAppendCall(SeqFrameIo& io, SeqId id, std::span<const TokenId> tokens,
                               std::span<const std::byte> k, std::span<const std::byte> v, uint32_t layers,
                               const RequestOptions& o);
Status SeqTruncateCall(SeqFrameIo& io, SeqId id, uint32_t n, const RequestOptions& o);
Result<SeqId> SeqForkCall(SeqFrameIo& io, SeqId id, const RequestOptions& o);
Status SeqReleaseCall(SeqFrameIo& io, SeqId id, const RequestOptions& o);
Result<SequenceState> SeqInfoCall(SeqFrameIo& io, SeqId id, const RequestOptions& o);
// The node may answer fewer positions than asked (its frame limit): asks on
// from where it stopped and joins the [layer][n][row] pieces. *k and *v are
// written only on success.
Status SeqReadCall(SeqFrameIo& io, SeqId id, uint32_t from, uint32_t n, std::vector<std::byte>* k,
                   std::vector<std::byte>* v, const RequestOptions& o);

// The ShardChannel sequence methods of a frame-based channel (Base is a
// ShardChannel subclass), each forwarding to the function above with the
// channel's own SeqFrameIo.
template <typename Base>
class SeqOverFrames : public Base, protected SeqFrameIo {
 public:
  Result<SeqCreated> SeqCreate(const SeqCreateArgs& a, const RequestOptions& o) override {
    return SeqCreateCall(*this, a, o);
  }
  Result<uint32_t> SeqAppend(SeqId id, std::span<const TokenId> tokens, std::span<const std::byte> k,
                             std::span<const std::byte> v, uint32_t layers, const RequestOptions& o) override {
    return SeqAppendCall(*this, id, tokens, k, v, layers, o);
  }
  Status SeqTruncate(SeqId id, uint32_t n, const RequestOptions& o) override {
    return SeqTruncateCall(*this, id, n, o);
  }
  Result<SeqId> SeqFork(SeqId id, const RequestOptions& o) override { return SeqForkCall(*this, id, o); }
  Status SeqRelease(SeqId id, const RequestOptions& o) override { return SeqReleaseCall(*this, id, o); }
  Result<SequenceState> SeqInfo(SeqId id, const RequestOptions& o) override { return SeqInfoCall(*this, id, o); }
  Status SeqRead(SeqId id, uint32_t from, uint32_t n, std::vector<std::byte>* k, std::vector<std::byte>* v,
                 const RequestOptions& o) override {
    return SeqReadCall(*this, id, from, n, k, v, o);
  }
};

}  // namespace kvmesh
