#include "shard_node/server/data_server.h"

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

constexpr size_t kOps = 10;  // opcodes 1..9

struct OpStats {
  std::atomic<uint64_t> count{0};
  mutable std::mutex mu;
  LatencyHistogram hist;  // guarded by mu
};

// One answer: header + owned body bytes + pinned pool views, gathered for one write.
struct Reply {
  HeaderBytes header;
  std::string body;
  std::vector<BlockRef> refs;
  std::vector<std::string> copies;  // device-memory blocks copied out
  std::vector<asio::const_buffer> bufs;
};

bool TokenEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

class Server final : public DataServer {
 public:
  Server(ShardNode* node, DataServerOptions o, const std::atomic<uint64_t>* epoch)
      : node_(node), o_(std::move(o)), epoch_(epoch), acceptor_(accept_io_) {
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
    line("kvmesh_frames_rejected_total", "reason=\"malformed\"", double(malformed_.load()));
    line("kvmesh_frames_rejected_total", "reason=\"truncated\"", double(truncated_.load()));
    line("kvmesh_frames_rejected_total", "reason=\"auth\"", double(auth_failures_.load()));
    line("kvmesh_frames_rejected_total", "reason=\"stale_epoch\"", double(stale_.load()));
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
      Reply rep;
      bool close_after = false;
      if (!hello_done || h.opcode == Opcode::kHello) {
        Status st = HandleHello(h, body, hello_done, &rep);
        if (st.code() == StatusCode::kInvalidArgument && rep.bufs.empty()) {
          malformed_.fetch_add(1);
          break;
        }
        if (!st.ok()) close_after = true;
        else hello_done = true;
      } else {
        const uint64_t node_epoch = epoch_->load(std::memory_order_acquire);
        if (h.epoch != 0 && h.epoch < node_epoch) {
          stale_.fetch_add(1);
          ErrorReply(h, StaleEpoch("shard-map epoch " + std::to_string(h.epoch) + " is stale; node " + node_->id() +
                                   " is at epoch " + std::to_string(node_epoch) + ": refresh the map"),
                     &rep);
        } else if (!Handle(h, body, &rep).ok()) {
          malformed_.fetch_add(1);
          break;
        }
      }
      size_t out_bytes = 0;
      for (const auto& b : rep.bufs) out_bytes += b.size();
      co_await asio::async_write(s, rep.bufs, asio::redirect_error(asio::use_awaitable, ec));
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

  // Returns OK when the connection is now authenticated; non-OK closes it
  // (InvalidArgument with an empty reply: malformed, close without answering).
  Status HandleHello(const FrameHeader& h, std::span<const std::byte> body, bool hello_done, Reply* rep) {
    if (hello_done) {
      ErrorReply(h, InvalidArgument("HELLO sent twice"), rep);
      return InvalidArgument("HELLO twice");
    }
    if (h.opcode != Opcode::kHello) {
      auth_failures_.fetch_add(1);
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
    if (!o_.token.empty() && !TokenEquals(hello.token, o_.token)) {
      auth_failures_.fetch_add(1);
      ErrorReply(h, PermissionDenied(hello.token.empty() ? "this node requires a token" : "wrong token"), rep);
      return PermissionDenied("token");
    }
    HelloAnswer a{node_->id(), o_.limits};
    OkReply(h, 0, EncodeHelloAnswerBody(a), rep);
    return Status::Ok();
  }

  void ErrorReply(const FrameHeader& req, const Status& s, Reply* rep) {
    FrameHeader h;
    h.epoch = epoch_->load(std::memory_order_relaxed);
    h.opcode = req.opcode;
    h.flags = kFlagResponse;
    h.request_id = req.request_id;
    h.status = s.code();
    rep->body = s.message().substr(0, 1024);
    h.body_len = static_cast<uint32_t>(rep->body.size());
    rep->header = EncodeHeader(h);
    rep->bufs = {asio::buffer(rep->header), asio::buffer(rep->body)};
  }

  void OkReply(const FrameHeader& req, uint32_t count, std::string body, Reply* rep) {
    FrameHeader h;
    h.opcode = req.opcode;
    h.flags = kFlagResponse;
    h.request_id = req.request_id;
    h.epoch = epoch_->load(std::memory_order_relaxed);
    h.count = count;
    rep->body = std::move(body);
    h.body_len = static_cast<uint32_t>(rep->body.size());
    rep->header = EncodeHeader(h);
    rep->bufs = {asio::buffer(rep->header), asio::buffer(rep->body)};
  }

  // Answers one data frame. Non-OK only for a malformed body (closes the connection).
  Status Handle(const FrameHeader& h, std::span<const std::byte> body, Reply* rep) {
    std::vector<BlockKey> keys;
    switch (h.opcode) {
      case Opcode::kPut: {
        const size_t table = size_t{h.count} * kPutItemSize;
        std::vector<PutRecord> recs;
        KVMESH_RETURN_IF_ERROR(ParsePutTable(h, body.first(table), o_.limits, &recs));
        std::string codes(h.count, '\0');
        size_t off = table;
        for (size_t i = 0; i < recs.size(); ++i) {
          std::span<const std::byte> data = body.subspan(off, recs[i].size);
          off += recs[i].size;
          Status s;
          if (Checksum64(data.data(), data.size()) != recs[i].checksum) {
            s = DataLoss("payload checksum mismatch");
          } else {
            PutOptions po;
            po.priority = recs[i].priority;
            po.codec = recs[i].codec;
            s = node_->Put(recs[i].key, data, po);
          }
          codes[i] = static_cast<char>(s.code());
        }
        OkReply(h, h.count, std::move(codes), rep);
        return Status::Ok();
      }
      case Opcode::kGet: {
        KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
        std::string table(keys.size() * kGetItemSize, '\0');
        rep->refs.reserve(keys.size());
        const bool host = node_->store().backend().host_accessible();
        uint64_t total = table.size();
        std::vector<std::span<const std::byte>> payloads;
        for (size_t i = 0; i < keys.size(); ++i) {
          GetRecord r;
          Result<BlockRef> ref = node_->Get(keys[i]);
          if (!ref.ok()) {
            r.status = ref.status().code();
          } else if (total + ref->meta().size > o_.limits.max_body_bytes) {
            r.status = StatusCode::kBusy;  // the answer is full: ask again in a smaller batch
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
        // Re-encode the header for the full body (table + payloads).
        FrameHeader fh;
        fh.opcode = h.opcode;
        fh.flags = kFlagResponse;
        fh.request_id = h.request_id;
        fh.epoch = epoch_->load(std::memory_order_relaxed);
        fh.count = h.count;
        fh.body_len = static_cast<uint32_t>(total);
        rep->header = EncodeHeader(fh);
        for (auto p : payloads) rep->bufs.push_back(asio::buffer(p.data(), p.size()));
        return Status::Ok();
      }
      case Opcode::kExists: {
        KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
        const bool touch = h.flags & kFlagTouch;
        std::string found(keys.size(), '\0');
        for (size_t i = 0; i < keys.size(); ++i) found[i] = node_->Exists(keys[i], touch) ? 1 : 0;
        OkReply(h, h.count, std::move(found), rep);
        return Status::Ok();
      }
      case Opcode::kMatchPrefix: {
        KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
        uint32_t run = 0;
        while (run < keys.size() && node_->Exists(keys[run], /*touch=*/true)) ++run;
        std::string out(4, '\0');
        for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((run >> (8 * b)) & 0xFF);
        OkReply(h, h.count, std::move(out), rep);
        return Status::Ok();
      }
      case Opcode::kErase:
      case Opcode::kPin:
      case Opcode::kUnpin: {
        KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));
        std::string codes(keys.size(), '\0');
        for (size_t i = 0; i < keys.size(); ++i) {
          Status s = h.opcode == Opcode::kErase ? node_->Erase(keys[i])
                     : h.opcode == Opcode::kPin ? node_->Pin(keys[i])
                                                : node_->Unpin(keys[i]);
          codes[i] = static_cast<char>(s.code());
        }
        OkReply(h, h.count, std::move(codes), rep);
        return Status::Ok();
      }
      case Opcode::kStats:
        OkReply(h, 0, node_->StatsJson(), rep);
        return Status::Ok();
      case Opcode::kHello:
        break;
    }
    return InvalidArgument("unexpected opcode");
  }

  ShardNode* node_;
  DataServerOptions o_;
  const std::atomic<uint64_t>* epoch_;
  asio::io_context accept_io_{1};
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  size_t next_io_ = 0;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> conns_total_{0}, conns_open_{0}, malformed_{0}, truncated_{0}, auth_failures_{0}, stale_{0};
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
