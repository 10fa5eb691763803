#include "shard_node/server/data_server.h"

#include "shard_node/server/frame_handler.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common/histogram.h"
#include "shard_node/shard_node.h"
#include "transport/asio_listener.h"
#include "transport/asio_write.h"
#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace proto;

constexpr size_t kOps = proto::kMaxOpcode + 1;  // opcodes 1..kMaxOpcode

// A connection's reads: bytes the socket already holds cost one recv and no
// loop turn; a socket the last read drained is waited for in Asio's reactor.
// Short reads (a header, a key or item table, the head of a payload) go
// through a small staging buffer, so one recv usually brings a whole GET or
// EXISTS frame, or a PUT's header, table and first payload bytes; a longer
// remainder goes straight to its destination (a pool chunk).
// Over TLS every read is asynchronous (an SSL stream's synchronous read on a
// non-blocking socket is not a retryable "not yet"); the staging still holds.
// REQUIRES: a plain socket is in non-blocking mode. Not thread-safe (one session).
template <typename Stream>
class FrameReader {
 public:
  FrameReader(Stream& s, ConnectionWatch* watch) : s_(s), watch_(watch) {}

  // Bytes read from the stream and not yet taken.
  size_t buffered() const { return len_ - pos_; }

  // Reads exactly dst.size() bytes. False when the stream ended or failed (ec).
  asio::awaitable<bool> Read(std::span<std::byte> dst, boost::system::error_code& ec) {
    size_t done = Take(dst);
    while (done < dst.size()) {
      const std::span<std::byte> rest = dst.subspan(done);
      if (rest.size() < kStage) {  // the stage is empty here: Take drained it
        pos_ = 0;
        len_ = co_await Some(stage_, ec);
        if (ec) co_return false;
        done += Take(rest);
      } else {
        const size_t n = co_await Some(rest, ec);
        if (ec) co_return false;
        done += n;
      }
    }
    co_return true;
  }

 private:
  static constexpr size_t kStage = 8u << 10;

  size_t Take(std::span<std::byte> dst) {
    const size_t n = std::min(len_ - pos_, dst.size());
    if (n) std::memcpy(dst.data(), stage_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  // One read of at least one byte into buf (0 with ec set at the end of the
  // stream or on an error). After a read that drained the socket the next
  // one waits in Asio's reactor at once (a recv would only say EAGAIN);
  // otherwise it reads at once and waits only if nothing is there.
  asio::awaitable<size_t> Some(std::span<std::byte> buf, boost::system::error_code& ec) {
    size_t n = 0;
    if (kPlain && !drained_) {
      n = s_.read_some(asio::buffer(buf.data(), buf.size()), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) ec = {};
      else if (ec) co_return 0;
    }
    if (n == 0) n = co_await s_.async_read_some(asio::buffer(buf.data(), buf.size()),
                                                asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return 0;
    drained_ = n < buf.size();
    if (watch_) watch_->Reading();  // a frame has begun, or more of it came
    co_return n;
  }

  static constexpr bool kPlain = std::is_same_v<Stream, tcp::socket>;
  Stream& s_;
  ConnectionWatch* watch_;
  std::array<std::byte, kStage> stage_;
  size_t pos_ = 0, len_ = 0;
  bool drained_ = true;  // the last read took less than it asked for
};

struct OpStats {
  std::atomic<uint64_t> count{0};
  mutable std::mutex mu;
  LatencyHistogram hist;  // guarded by mu
};

class Server final : public DataServer {
 public:
  Server(ShardNode* node, DataServerOptions o, const std::atomic<uint64_t>* epoch)
      : node_(node), o_(std::move(o)), epoch_(epoch), handler_(node, o_.limits, o_.token, epoch) {}
  ~Server() override { Stop(); }

  Status Bind() {
    // One accept thread and o_.threads session threads (AsioListener): a
    // connection's handlers never hop threads.
    AsioListenerOptions l;
    l.host = o_.host;
    l.port = o_.port;
    l.session_threads = o_.threads;
    l.what = "data";
    l.max_connections = o_.conn_limits.max_connections;
    l.max_connections_per_peer = o_.conn_limits.max_connections_per_peer;
    KVMESH_ASSIGN_OR_RETURN(listener_,
                            AsioListener::Start(l, [this](tcp::socket s) { return Session(std::move(s)); }));
    return Status::Ok();
  }

  uint16_t port() const override { return listener_->port(); }

  void Stop() override {
    if (listener_) listener_->Stop();
  }

  std::string MetricsText() const override {
    std::string out;
    auto line = [&](const std::string& name, const std::string& labels, double v) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.9g", v);
      out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
    };
    out += "# TYPE kvmesh_connections_total counter\n";
    line("kvmesh_connections_total", "", double(conns_total_.load()));
    out += "# TYPE kvmesh_connections_open gauge\n";
    line("kvmesh_connections_open", "", double(conns_open_.load()));
    out += "# TYPE kvmesh_frames_rejected_total counter\n";
    line("kvmesh_frames_rejected_total", "reason=\"malformed\"", double(malformed_.load() + handler_.malformed.load()));
    line("kvmesh_frames_rejected_total", "reason=\"truncated\"", double(truncated_.load()));
    line("kvmesh_frames_rejected_total", "reason=\"auth\"", double(handler_.auth_failures.load()));
    line("kvmesh_frames_rejected_total", "reason=\"stale_epoch\"", double(handler_.stale.load()));
    line("kvmesh_frames_rejected_total", "reason=\"preauth\"", double(preauth_refused_.load()));
    out += "# TYPE kvmesh_connections_refused_total counter\n";
    line("kvmesh_connections_refused_total", "", double(listener_->refused()));
    out += "# TYPE kvmesh_connection_timeouts_total counter\n";
    line("kvmesh_connection_timeouts_total", "kind=\"handshake\"", double(timeouts_.handshake.load()));
    line("kvmesh_connection_timeouts_total", "kind=\"read\"", double(timeouts_.read.load()));
    line("kvmesh_connection_timeouts_total", "kind=\"write\"", double(timeouts_.write.load()));
    line("kvmesh_connection_timeouts_total", "kind=\"idle\"", double(timeouts_.idle.load()));
    out += "# TYPE kvmesh_tls_handshake_failures_total counter\n";
    line("kvmesh_tls_handshake_failures_total", "", double(tls_failed_.load()));
    out += "# TYPE kvmesh_bytes_received_total counter\n";
    line("kvmesh_bytes_received_total", "", double(bytes_in_.load()));
    out += "# TYPE kvmesh_bytes_sent_total counter\n";
    line("kvmesh_bytes_sent_total", "", double(bytes_out_.load()));
    out += "# TYPE kvmesh_requests_total counter\n";
    for (size_t op = 1; op < kOps; ++op)
      line("kvmesh_requests_total", "op=\"" + std::string(OpcodeName(Opcode(op))) + "\"", double(ops_[op].count.load()));
    out += "# TYPE kvmesh_request_latency_seconds summary\n";
    for (size_t op = 1; op < kOps; ++op) {
      std::lock_guard<std::mutex> lock(ops_[op].mu);
      const LatencyHistogram& h = ops_[op].hist;
      if (h.count() == 0) continue;
      const std::string name(OpcodeName(Opcode(op)));
      line("kvmesh_request_latency_seconds", "op=\"" + name + "\",quantile=\"0.5\"", h.Percentile(0.5) * 1e-9);
      line("kvmesh_request_latency_seconds", "op=\"" + name + "\",quantile=\"0.99\"", h.Percentile(0.99) * 1e-9);
      line("kvmesh_request_latency_seconds_count", "op=\"" + name + "\"", double(h.count()));
    }
    return out;
  }

 private:
  // A connection's receive buffer: grown to the largest body so far, never
  // shrunk and never zero-filled.
  class Buffer {
   public:
    std::span<std::byte> Get(size_t n) {
      if (n > cap_) {
        data_.reset(new std::byte[n]);
        cap_ = n;
      }
      return {data_.get(), n};
    }

   private:
    std::unique_ptr<std::byte[]> data_;
    size_t cap_ = 0;
  };

  enum class PutRead { kDone, kTruncated, kMalformed };

  // Reads an admitted PUT: its item table, then each payload straight into a
  // chunk the node reserved for it, verified once there and committed (the
  // PUT ladder, TenantView::StartPut). Payloads the node does not take
  // directly (stored already, a node that encodes on put, a refusal) land in
  // `scratch`.
  template <typename Stream>
  asio::awaitable<PutRead> ReadPut(FrameReader<Stream>& in, const FrameHeader& h, TenantView v, Buffer& scratch,
                                   std::vector<PutRecord>& recs, FrameReply* rep) {
    boost::system::error_code ec;
    const size_t table_bytes = size_t{h.count} * kPutItemSize;
    std::span<std::byte> table = scratch.Get(table_bytes);
    if (!co_await in.Read(table, ec)) co_return PutRead::kTruncated;
    if (!ParsePutTable(h, table, handler_.limits(), &recs).ok()) co_return PutRead::kMalformed;
    std::string codes(recs.size(), '\0');
    for (size_t i = 0; i < recs.size(); ++i) {
      const PutRecord& r = recs[i];
      TenantView::PutLanding p = v.StartPut(r.key, r.size, r.checksum, PutOptionsOf(r, h.flags));
      std::span<std::byte> dst = p.reserved() ? p.chunk() : scratch.Get(r.size);
      if (!co_await in.Read(dst, ec)) co_return PutRead::kTruncated;  // an unfilled reservation frees its chunk
      codes[i] = static_cast<char>(v.FinishPut(p, dst).code());
    }
    handler_.OkReply(h, h.count, std::move(codes), rep);
    co_return PutRead::kDone;
  }

  asio::awaitable<void> Session(tcp::socket sock) {
    conns_total_.fetch_add(1);
    conns_open_.fetch_add(1);
    // The TLS handshake and the HELLO within handshake_timeout_ms, frames
    // within read_timeout_ms once begun, answers taken within write_timeout_ms.
    // A plain socket is non-blocking: FrameReader and WatchedWrite take no
    // loop turn when it is ready.
    co_await ServeAccepted(sock, {o_.tls.get(), o_.conn_limits, &timeouts_, &tls_failed_},
                           [this](auto& s, ConnectionWatch& watch) { return Frames(s, watch); });
    conns_open_.fetch_sub(1);
  }

  // The frames of one connection, over a plain or a TLS stream.
  template <typename Stream>
  asio::awaitable<void> Frames(Stream& s, ConnectionWatch& watch) {
    boost::system::error_code ec;
    FrameReader<Stream> in(s, &watch);
    ConnectionAuth conn;
    Buffer body;
    std::vector<PutRecord> put_records;  // kept for the connection: no allocation per PUT once warm
    for (;;) {
      if (in.buffered() == 0) watch.Idle();  // else the next frame has begun
      HeaderBytes hb;
      if (!co_await in.Read(hb, ec)) {
        if (ec != asio::error::eof) truncated_.fetch_add(1);
        break;
      }
      FrameHeader h;
      if (!DecodeHeader(hb, o_.limits, &h).ok() || h.is_response()) {
        malformed_.fetch_add(1);  // close only this connection
        break;
      }
      const auto t0 = std::chrono::steady_clock::now();
      FrameReply rep;
      FrameOutcome outcome;
      size_t read_bytes = kHeaderSize + h.body_len;
      if (!conn.hello_done && h.opcode != Opcode::kHello) {
        // Nothing before the handshake: refused at its header (PermissionDenied,
        // then closed), its body never read.
        preauth_refused_.fetch_add(1, std::memory_order_relaxed);
        outcome = handler_.Handle(h, {}, &conn, &rep);
        read_bytes = kHeaderSize;
      } else if (h.opcode == Opcode::kPut && handler_.Admit(h, conn)) {
        // The payloads go straight from the socket into reserved pool chunks.
        const PutRead r = co_await ReadPut(in, h, TenantView(node_, conn.tenant), body, put_records, &rep);
        if (r == PutRead::kTruncated) truncated_.fetch_add(1);
        if (r == PutRead::kMalformed) malformed_.fetch_add(1);
        if (r != PutRead::kDone) break;
        outcome = FrameOutcome::kReply;
      } else {
        std::span<std::byte> b = body.Get(h.body_len);  // bounded by limits.max_body_bytes
        if (h.body_len > 0 && !co_await in.Read(b, ec)) {
          truncated_.fetch_add(1);
          break;
        }
        outcome = handler_.Handle(h, b, &conn, &rep);
      }
      bytes_in_.fetch_add(read_bytes, std::memory_order_relaxed);
      if (outcome == FrameOutcome::kClose) break;
      if (conn.hello_done) watch.Authenticated();
      const bool close_after = outcome == FrameOutcome::kReplyThenClose;
      std::vector<asio::const_buffer> bufs;
      bufs.reserve(rep.pieces.size());
      for (auto piece : rep.pieces) bufs.push_back(asio::buffer(piece.data(), piece.size()));
      const size_t out_bytes = rep.bytes();
      co_await WatchedWrite(s, bufs, watch, ec);  // closed by the watch after write_timeout_ms
      if (ec) break;
      bytes_out_.fetch_add(out_bytes, std::memory_order_relaxed);
      OpStats& st = ops_[static_cast<size_t>(h.opcode)];
      st.count.fetch_add(1, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(st.mu);
        st.hist.Record(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
      }
      if (close_after) break;
    }
  }

  ShardNode* node_;
  DataServerOptions o_;
  const std::atomic<uint64_t>* epoch_;
  FrameHandler handler_;
  std::atomic<uint64_t> conns_total_{0}, conns_open_{0}, malformed_{0}, truncated_{0}, tls_failed_{0};
  std::atomic<uint64_t> bytes_in_{0}, bytes_out_{0}, preauth_refused_{0};
  WatchCounters timeouts_;
  std::array<OpStats, kOps> ops_;
  std::unique_ptr<AsioListener> listener_;  // last: destroyed first, with the sessions that use the above
};

}  // namespace

Result<std::unique_ptr<DataServer>> DataServer::Start(ShardNode* node, DataServerOptions options,
                                                      const std::atomic<uint64_t>* epoch) {
  if (options.threads == 0) options.threads = 1;
  auto s = std::make_unique<Server>(node, std::move(options), epoch);
  KVMESH_RETURN_IF_ERROR(s->Bind());
  return std::unique_ptr<DataServer>(std::move(s));
}

}  // namespace kvmesh
