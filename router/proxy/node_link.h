// router/proxy/node_link.h — one pipelined connection from the RESP proxy's
// event loop to one shard node, speaking the kvmesh wire protocol
// (docs/protocol.md) without ever blocking the loop.
//
// Connect() opens the connection and sends HELLO (client id, tenant, token);
// once the node has answered, the link is ready and Send() writes frames,
// any number in flight. A node answers a connection's frames in order, so
// the link matches answers first in, first out (and checks the request id).
// Writes are gathered: frames queued while a write is under way go out in
// the next single write. Answers are read into shared receive chunks (1 MiB,
// reused once released, or one frame's size when larger) with as few reads
// as the bytes allow; a frame's body is handed over in place, kept alive by
// the chunk, so a GET payload reaches the client with no copy in the proxy.
//
// TLS: with a client context in the options the link speaks TLS to the
// node's data port (verifying the node's certificate, and its host name
// unless verify_hostname is off; presenting the context's certificate for
// mutual TLS); writes then always go through Asio's SSL stream, with runs of
// small pieces merged so that a record carries more than a frame header.
//
// Failure: a connect or HELLO that fails or exceeds connect_timeout_ms, a
// broken stream, a malformed answer, or Expire() finding a frame past its
// deadline closes the connection and fails every frame queued or in flight
// (their callbacks run later on the loop, never inside the call that failed
// them). After a failed connect the link refuses for backoff_ms.
//
// Thread-safety: none; every call and callback runs on the loop's thread, and
// the answers (whose receive chunks return to the link's pool when released)
// are released there too, or once the loop has stopped.
// Asio appears in this header: include it from .cc files only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/ssl.hpp>

#include "kvmesh/status.h"
#include "transport/asio.h"
#include "transport/protocol.h"

namespace kvmesh {

struct NodeLinkOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string client_id = "kvmesh-proxy";
  std::string tenant;
  std::string token;
  int64_t connect_timeout_ms = 1000;
  int64_t backoff_ms = 100;
  proto::ProtocolLimits limits;  // bounds on answers this side accepts
  // Non-null: TLS to the node (transport/asio_tls.h MakeAsioTlsClientContext).
  std::shared_ptr<boost::asio::ssl::context> tls;
  bool verify_hostname = true;  // the node's certificate must name `host`
};

// One request frame. The link fills in request_id and epoch.
struct LinkFrame {
  using Done = std::function<void(const Status& call, const proto::FrameHeader& answer, std::span<const char> body,
                                  const std::shared_ptr<const void>& keep)>;
  proto::FrameHeader header;  // opcode, flags, count, body_len
  std::string table;          // the first body bytes (keys, item records)
  // Borrowed body bytes after the table (PUT payloads); valid until `done` runs.
  std::vector<boost::asio::const_buffer> payload;
  std::chrono::steady_clock::time_point deadline;
  // Runs once on the loop: the call-level status (OK: answered, `answer`
  // and `body` hold it, `keep` keeps body alive) or why there is no answer.
  Done done;

  proto::HeaderBytes header_bytes{};  // the encoded header (the link's)
};

// Held by shared_ptr: its coroutines keep it alive until they end.
class NodeLink : public std::enable_shared_from_this<NodeLink> {
 public:
  NodeLink(boost::asio::io_context& io, NodeLinkOptions o);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  enum class State : uint8_t { kIdle, kConnecting, kReady, kBackoff };
  // kBackoff turns back into kIdle once the backoff has passed.
  State state();
  // Starts connecting (from kIdle); `on_change` runs on the loop once the
  // link is ready or has failed (then in kBackoff or kIdle).
  void Connect(std::function<void()> on_change);
  // Queues a frame. REQUIRES: state() == kReady.
  void Send(std::unique_ptr<LinkFrame> f, uint64_t epoch);
  // Closes the connection when a frame is past its deadline.
  void Expire(std::chrono::steady_clock::time_point now);
  // Closes the connection and fails every frame with `why`.
  void Close(const Status& why);
  bool busy() const { return !queued_.empty() || !inflight_.empty(); }
  // The node's limits (from its HELLO answer; valid when ready).
  const proto::ProtocolLimits& limits() const { return limits_; }
  const std::string& node_id() const { return node_id_; }

 private:
  struct ChunkPool;
  // One connection: its handlers hold it, so a closed one outlives them.
  struct Conn {
    explicit Conn(boost::asio::io_context& io) : socket(io) {}
    boost::asio::ip::tcp::socket socket;
    std::unique_ptr<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>> tls;  // with o_.tls
  };
  std::shared_ptr<char[]> NewChunk(size_t bytes);
  boost::asio::awaitable<void> Open(uint64_t gen, std::shared_ptr<Conn> c, std::function<void()> on_change);
  // connect (+ TLS handshake) + HELLO
  boost::asio::awaitable<Status> Handshake(Conn& c, proto::HelloAnswer* answer);
  boost::asio::awaitable<void> Reader(uint64_t gen, std::shared_ptr<Conn> c);
  void Pump();
  void Fail(std::deque<std::unique_ptr<LinkFrame>>* frames, const Status& why);
  Status Deliver(const proto::FrameHeader& h, std::span<const char> body, const std::shared_ptr<const void>& keep);

  boost::asio::io_context& io_;
  NodeLinkOptions o_;
  std::shared_ptr<Conn> conn_;  // the current connection (null when idle)
  State state_ = State::kIdle;
  uint64_t gen_ = 0;  // bumped on every close: handlers of an older connection stand down
  std::chrono::steady_clock::time_point backoff_until_{};
  proto::ProtocolLimits limits_;
  std::string node_id_;
  uint64_t next_id_ = 1;
  bool writing_ = false;
  std::deque<std::unique_ptr<LinkFrame>> queued_;    // not yet written
  std::deque<std::unique_ptr<LinkFrame>> inflight_;  // written (or being written), answers due in order
  std::vector<boost::asio::const_buffer> wbufs_;     // the write in progress
  std::string tls_stage_;                            // small pieces of a TLS write, merged
  std::shared_ptr<ChunkPool> pool_;  // receive chunks to reuse (their deleters hold it weakly)
};

}  // namespace kvmesh
