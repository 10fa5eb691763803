#include "shard_node/server/data_server.h"

#include "shard_node/server/frame_handler.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/histogram.h"
#include "shard_node/shard_node.h"
#include "transport/asio.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace proto;

constexpr size_t kOps = proto::kMaxOpcode + 1;  // opcodes 1..kMaxOpcode

struct OpStats {
  std::atomic<uint64_t> count{0};
  mutable std::mutex mu;
  LatencyHistogram hist;  // guarded by mu
};

class Server final : public DataServer {
 public:
  Server(ShardNode* node, DataServerOptions o, const std::atomic<uint64_t>* epoch)
      : node_(node), o_(std::move(o)), epoch_(epoch), handler_(node, o_.limits, o_.token, epoch), acceptor_(accept_io_) {
    // One single-threaded io_context per I/O thread (connections are spread
    // round robin): a connection's handlers never hop threads.
    for (uint32_t i = 0; i < o_.threads; ++i) ios_.push_back(std::make_unique<asio::io_context>(1));
  }
  ~Server() override { Stop(); }

  Status Bind() {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(o_.host, ec);
    if (ec) return InvalidArgument("bad listen address " + o_.host + ": " + ec.message());
    tcp::endpoint ep(addr, o_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable("data listen on " + o_.host + ":" + std::to_string(o_.port) + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(accept_io_, Accept(), asio::detached);
    for (auto& io : ios_) guards_.emplace_back(asio::make_work_guard(*io));
    threads_.emplace_back([this] { accept_io_.run(); });
    for (auto& io : ios_) threads_.emplace_back([p = io.get()] { p->run(); });
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(accept_io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      accept_io_.stop();
    });
    for (auto& io : ios_) io->stop();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
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
  asio::awaitable<void> Accept() {
    for (;;) {
      boost::system::error_code ec;
      asio::io_context& io = *ios_[next_io_++ % ios_.size()];
      tcp::socket s = co_await acceptor_.async_accept(io, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor_.is_open()) co_return;
        continue;
      }
      asio::co_spawn(io, Session(std::move(s)), asio::detached);
    }
  }

  asio::awaitable<void> Session(tcp::socket s) {
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    conns_total_.fetch_add(1);
    conns_open_.fetch_add(1);
    bool hello_done = false;
    std::vector<std::byte> body;
    for (;;) {
      HeaderBytes hb;
      co_await asio::async_read(s, asio::buffer(hb), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (ec != asio::error::eof) truncated_.fetch_add(1);
        break;
      }
      FrameHeader h;
      if (!DecodeHeader(hb, o_.limits, &h).ok() || h.is_response()) {
        malformed_.fetch_add(1);  // close only this connection
        break;
      }
      body.resize(h.body_len);  // bounded by limits.max_body_bytes
      if (h.body_len > 0) {
        co_await asio::async_read(s, asio::buffer(body.data(), h.body_len),
                                  asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {
          truncated_.fetch_add(1);
          break;
        }
      }
      bytes_in_.fetch_add(kHeaderSize + h.body_len, std::memory_order_relaxed);
      const auto t0 = std::chrono::steady_clock::now();
      FrameReply rep;
      const FrameOutcome outcome = handler_.Handle(h, body, &hello_done, &rep);
      if (outcome == FrameOutcome::kClose) break;
      const bool close_after = outcome == FrameOutcome::kReplyThenClose;
      std::vector<asio::const_buffer> bufs;
      bufs.reserve(rep.pieces.size());
      for (auto piece : rep.pieces) bufs.push_back(asio::buffer(piece.data(), piece.size()));
      const size_t out_bytes = rep.bytes();
      co_await asio::async_write(s, bufs, asio::redirect_error(asio::use_awaitable, ec));
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
    s.shutdown(tcp::socket::shutdown_both, ec);
    s.close(ec);
    conns_open_.fetch_sub(1);
  }

  ShardNode* node_;
  DataServerOptions o_;
  const std::atomic<uint64_t>* epoch_;
  FrameHandler handler_;
  // Order matters for destruction: the pending accept on accept_io_ holds a
  // socket of one of ios_, so accept_io_ must go first (declared after).
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  asio::io_context accept_io_{1};
  size_t next_io_ = 0;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> conns_total_{0}, conns_open_{0}, malformed_{0}, truncated_{0};
  std::atomic<uint64_t> bytes_in_{0}, bytes_out_{0};
  std::array<OpStats, kOps> ops_;
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
