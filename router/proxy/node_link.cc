#include "router/proxy/node_link.h"

#include <algorithm>
#include <cstring>

#include "transport/asio_write.h"
#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using namespace proto;

constexpr size_t kChunkBytes = 1u << 20;  // receive chunk (a larger frame gets its own)
constexpr size_t kMaxFramesPerWrite = 256;

}  // namespace

// Receive chunks no answer holds any more come back here (at most a few):
// a 1 MiB allocation is an mmap and page faults each time otherwise.
struct NodeLink::ChunkPool {
  std::vector<std::unique_ptr<char[]>> free;
};

std::shared_ptr<char[]> NodeLink::NewChunk(size_t bytes) {
  if (bytes != kChunkBytes) return std::shared_ptr<char[]>(new char[bytes]);
  std::unique_ptr<char[]> mem;
  if (!pool_->free.empty()) {
    mem = std::move(pool_->free.back());
    pool_->free.pop_back();
  } else {
    mem.reset(new char[kChunkBytes]);
  }
  return std::shared_ptr<char[]>(mem.release(), [pool = std::weak_ptr<ChunkPool>(pool_)](char* p) {
    std::shared_ptr<ChunkPool> sp = pool.lock();
    if (sp && sp->free.size() < 8) sp->free.emplace_back(p);
    else delete[] p;
  });
}

NodeLink::NodeLink(asio::io_context& io, NodeLinkOptions o)
    : io_(io), o_(std::move(o)), limits_(o_.limits), pool_(std::make_shared<ChunkPool>()) {}

NodeLink::~NodeLink() {
  boost::system::error_code ec;
  if (conn_) conn_->socket.close(ec);
}

NodeLink::State NodeLink::state() {
  if (state_ == State::kBackoff && Clock::now() >= backoff_until_) state_ = State::kIdle;
  return state_;
}

void NodeLink::Connect(std::function<void()> on_change) {
  if (state() != State::kIdle) return;
  state_ = State::kConnecting;
  const uint64_t gen = ++gen_;
  conn_ = std::make_shared<Conn>(io_);
  asio::co_spawn(io_, Open(gen, conn_, std::move(on_change)), asio::detached);
}

namespace {

// Writes and reads on a connection, plain or TLS.
template <typename Conn, typename Buffers>
asio::awaitable<size_t> WriteAll(Conn& c, const Buffers& b, boost::system::error_code& ec) {
  if (c.tls) co_return co_await asio::async_write(*c.tls, b, asio::redirect_error(asio::use_awaitable, ec));
  co_return co_await asio::async_write(c.socket, b, asio::redirect_error(asio::use_awaitable, ec));
}
template <typename Conn, typename Buffers>
asio::awaitable<size_t> ReadAll(Conn& c, const Buffers& b, boost::system::error_code& ec) {
  if (c.tls) co_return co_await asio::async_read(*c.tls, b, asio::redirect_error(asio::use_awaitable, ec));
  co_return co_await asio::async_read(c.socket, b, asio::redirect_error(asio::use_awaitable, ec));
}
template <typename Conn, typename Buffers>
asio::awaitable<size_t> ReadSome(Conn& c, const Buffers& b, boost::system::error_code& ec) {
  if (c.tls) co_return co_await c.tls->async_read_some(b, asio::redirect_error(asio::use_awaitable, ec));
  co_return co_await c.socket.async_read_some(b, asio::redirect_error(asio::use_awaitable, ec));
}

}  // namespace

asio::awaitable<Status> NodeLink::Handshake(Conn& c, proto::HelloAnswer* answer) {
  boost::system::error_code ec;
  const std::string where = o_.host + ":" + std::to_string(o_.port);
  tcp::resolver resolver(io_);
  auto endpoints =
      co_await resolver.async_resolve(o_.host, std::to_string(o_.port), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return Unavailable("resolve " + o_.host + ": " + ec.message());
  co_await asio::async_connect(c.socket, endpoints, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return Unavailable("connect to node " + where + ": " + ec.message());
  c.socket.set_option(tcp::no_delay(true), ec);
  if (o_.tls) {
    c.tls = std::make_unique<asio::ssl::stream<tcp::socket&>>(c.socket, *o_.tls);
    if (Status s = PrepareTlsClient(c.tls->native_handle(), o_.host, o_.verify_hostname); !s.ok()) co_return s;
    co_await c.tls->async_handshake(asio::ssl::stream_base::client, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return Unavailable("TLS handshake with node " + where + ": " + TlsErrorMessage(ec, c.tls->native_handle()));
  }
  Hello hello;
  hello.client_id = o_.client_id;
  hello.tenant = o_.tenant;
  hello.token = o_.token;
  FrameHeader h;
  h.opcode = Opcode::kHello;
  const std::string frame = BuildFrame(h, EncodeHelloBody(hello));
  co_await WriteAll(c, asio::buffer(frame), ec);
  HeaderBytes hb;
  if (!ec) co_await ReadAll(c, asio::buffer(hb), ec);
  if (ec) co_return Unavailable("HELLO to node " + where + ": " + ec.message());
  FrameHeader a;
  if (Status s = DecodeHeader(hb, o_.limits, &a); !s.ok()) co_return Unavailable("HELLO answer: " + s.message());
  std::vector<std::byte> body(a.body_len);
  co_await ReadAll(c, asio::buffer(body), ec);
  if (ec || a.opcode != Opcode::kHello || !a.is_response()) co_return Unavailable("node " + where + " did not answer HELLO");
  if (a.status != StatusCode::kOk) co_return ParseErrorBody(a, body);
  co_return ParseHelloAnswerBody(body, answer);
}

asio::awaitable<void> NodeLink::Open(uint64_t gen, std::shared_ptr<Conn> c, std::function<void()> on_change) {
  auto self = shared_from_this();
  asio::steady_timer timer(io_);
  timer.expires_after(std::chrono::milliseconds(o_.connect_timeout_ms));
  timer.async_wait([this, self, gen, c](const boost::system::error_code& e) {
    if (!e && gen == gen_ && state_ == State::kConnecting) {
      boost::system::error_code ignore;
      c->socket.close(ignore);  // the connect or HELLO in progress fails
    }
  });
  HelloAnswer answer;
  const Status failure = co_await Handshake(*c, &answer);
  if (gen != gen_) co_return;  // closed meanwhile (its frames were failed by Close)
  timer.cancel();
  if (!failure.ok() || state_ != State::kConnecting) {
    boost::system::error_code ec;
    c->socket.close(ec);
    conn_.reset();
    state_ = State::kBackoff;
    backoff_until_ = Clock::now() + std::chrono::milliseconds(o_.backoff_ms);
    on_change();
    co_return;
  }
  limits_ = answer.limits;
  limits_.max_body_bytes = std::min(limits_.max_body_bytes, o_.limits.max_body_bytes);
  limits_.max_items = std::min(limits_.max_items, o_.limits.max_items);
  node_id_ = answer.node_id;
  boost::system::error_code ec;
  if (!c->tls) c->socket.non_blocking(true, ec);  // Pump writes at once when it can
  state_ = State::kReady;
  asio::co_spawn(io_, Reader(gen, c), asio::detached);
  Pump();
  on_change();
}

void NodeLink::Send(std::unique_ptr<LinkFrame> f, uint64_t epoch) {
  f->header.epoch = epoch;
  queued_.push_back(std::move(f));
  Pump();
}

void NodeLink::Pump() {
  if (writing_ || state_ != State::kReady || queued_.empty()) return;
  wbufs_.clear();
  for (size_t n = 0; n < kMaxFramesPerWrite && !queued_.empty(); ++n) {
    std::unique_ptr<LinkFrame> f = std::move(queued_.front());
    queued_.pop_front();
    f->header.request_id = next_id_++;
    f->header_bytes = EncodeHeader(f->header);
    wbufs_.emplace_back(f->header_bytes.data(), f->header_bytes.size());
    if (!f->table.empty()) wbufs_.emplace_back(f->table.data(), f->table.size());
    for (const asio::const_buffer& b : f->payload) wbufs_.push_back(b);
    inflight_.push_back(std::move(f));
  }
  std::shared_ptr<Conn> c = conn_;
  const uint64_t gen = gen_;
  auto written = [this, self = shared_from_this(), gen, c](const boost::system::error_code& e, size_t) {
    if (gen != gen_) return;
    writing_ = false;
    if (e) return Close(Unavailable("write to node " + o_.host + ":" + std::to_string(o_.port) + ": " + e.message()));
    Pump();
  };
  if (c->tls) {  // through the SSL stream, small pieces merged into records
    wbufs_ = CoalesceForTls(wbufs_, &tls_stage_);
    writing_ = true;
    asio::async_write(*c->tls, wbufs_, std::move(written));
    return;
  }
  // At once when the socket takes it all (no loop turn for the completion),
  // else the rest asynchronously.
  boost::system::error_code ec;
  const bool all = WriteNow(c->socket, wbufs_, ec);  // a non-blocking socket
  if (ec) return Close(Unavailable("write to node " + o_.host + ":" + std::to_string(o_.port) + ": " + ec.message()));
  if (all) return Pump();  // all written (more may have been queued meanwhile: none here)
  writing_ = true;
  asio::async_write(c->socket, wbufs_, std::move(written));
}

asio::awaitable<void> NodeLink::Reader(uint64_t gen, std::shared_ptr<Conn> c) {
  auto self = shared_from_this();
  std::shared_ptr<char[]> chunk = NewChunk(kChunkBytes);
  size_t cap = kChunkBytes, filled = 0, used = 0;
  boost::system::error_code ec;
  // Moves the unread tail into a fresh chunk of at least `need` bytes.
  auto relocate = [&](size_t need) {
    const size_t tail = filled - used;
    const size_t bytes = std::max(kChunkBytes, need);
    std::shared_ptr<char[]> next = NewChunk(bytes);
    if (tail) std::memcpy(next.get(), chunk.get() + used, tail);
    chunk = std::move(next);
    cap = bytes, filled = tail, used = 0;
  };
  // Reads until at least `want` unread bytes are buffered (false: the link is gone).
  auto fill = [&](size_t want) -> asio::awaitable<bool> {
    while (filled - used < want) {
      if (cap - used < want) relocate(want);
      const size_t n = co_await ReadSome(*c, asio::buffer(chunk.get() + filled, cap - filled), ec);
      if (gen != gen_) co_return false;
      if (ec) {
        Close(Unavailable("connection to node " + o_.host + ":" + std::to_string(o_.port) + " lost: " + ec.message()));
        co_return false;
      }
      filled += n;
    }
    co_return true;
  };
  for (;;) {
    if (!co_await fill(kHeaderSize)) co_return;
    FrameHeader h;
    Status s = DecodeHeader(std::as_bytes(std::span<const char>(chunk.get() + used, kHeaderSize)), o_.limits, &h);
    if (!s.ok()) {
      Close(Unavailable("bad answer from node: " + s.message()));
      co_return;
    }
    const size_t need = kHeaderSize + h.body_len;
    if (!co_await fill(need)) co_return;
    s = Deliver(h, std::span<const char>(chunk.get() + used + kHeaderSize, h.body_len), chunk);
    if (gen != gen_) co_return;  // a callback closed the link
    if (!s.ok()) {
      Close(Unavailable("bad answer from node: " + s.message()));
      co_return;
    }
    used += need;
    if (used == filled) {
      if (chunk.use_count() == 1) filled = used = 0;  // nobody holds a body: reuse the chunk
      else if (cap - filled < (16u << 10)) relocate(0);
    }
  }
}

Status NodeLink::Deliver(const FrameHeader& h, std::span<const char> body, const std::shared_ptr<const void>& keep) {
  if (!h.is_response()) return InvalidArgument("node sent a request frame");
  if (inflight_.empty()) return InvalidArgument("answer with no request in flight");
  std::unique_ptr<LinkFrame> f = std::move(inflight_.front());
  inflight_.pop_front();
  if (f->header.request_id != h.request_id) {
    inflight_.push_front(std::move(f));  // failed with the rest by Close
    return InvalidArgument("answer out of order");
  }
  const Status call = h.status == StatusCode::kOk ? Status::Ok() : ParseErrorBody(h, std::as_bytes(body));
  f->done(call, h, body, keep);
  return Status::Ok();
}

void NodeLink::Fail(std::deque<std::unique_ptr<LinkFrame>>* frames, const Status& why) {
  while (!frames->empty()) {
    std::shared_ptr<LinkFrame> f(std::move(frames->front()));
    frames->pop_front();
    asio::post(io_, [f, why] { f->done(why, FrameHeader{}, {}, nullptr); });
  }
}

void NodeLink::Close(const Status& why) {
  ++gen_;
  boost::system::error_code ec;
  if (conn_) conn_->socket.close(ec);
  conn_.reset();
  writing_ = false;
  if (state_ != State::kBackoff) state_ = State::kIdle;
  Fail(&inflight_, why);
  Fail(&queued_, why);
}

void NodeLink::Expire(Clock::time_point now) {
  const bool late = (!inflight_.empty() && inflight_.front()->deadline <= now) ||
                    (!queued_.empty() && queued_.front()->deadline <= now);
  if (late) Close(DeadlineExceeded("no answer from node " + o_.host + ":" + std::to_string(o_.port) + " within the timeout"));
}

}  // namespace kvmesh
