#include "transport/tcp_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/frame_plan.h"
#include "transport/seq_calls.h"
#include "transport/socket_util.h"
#include "transport/sync_over_async.h"
#include "transport/fd_tls_client.h"

namespace kvmesh {
namespace {

using Clock = std::chrono::steady_clock;
using namespace proto;

// One call waiting for its answer. The reader fills it under `mu`.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  Status call;                  // call-level status
  FrameHeader header;
  std::vector<std::byte> body;  // small answers (status bytes, match count, stats)
  std::span<GetItem> get_items; // GET: payloads go straight to the callers' dst
};

// One connection. There is no reader thread: a caller waiting for its answer
// becomes the connection's reader (leader/follower) and routes every answer it
// reads to its waiter, so an uncontended call costs no thread hand-off; when
// it has its own answer it hands the reader role to another waiter.
class Connection {
 public:
  // tls: the connection's TLS session over fd (nullptr: plain TCP).
  Connection(int fd, std::unique_ptr<TlsConn> tls, int64_t stall_timeout_ms, ProtocolLimits limits)
      : fd_(fd), tls_(std::move(tls)), stall_ms_(stall_timeout_ms), limits_(limits) {}
  ~Connection() { ::shutdown(fd_.get(), SHUT_RDWR); }
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  // No call in flight (a hint for choosing a connection; it may change at once).
  bool idle() const { return in_flight_.load(std::memory_order_relaxed) == 0; }

  // Sends one frame made of `iov` and waits for its answer until `deadline`.
  Status Call(uint64_t id, std::vector<iovec>& iov, const std::shared_ptr<Pending>& p, Clock::time_point deadline) {
    KVMESH_RETURN_IF_ERROR(Send(id, iov, p, deadline));
    return Await(id, p, deadline);
  }

  // The two halves of Call, so that one caller can have requests in flight on
  // several connections (router fan-out). Send registers p as the waiter of
  // request `id` and writes the frame; on an error p needs no Await.
  Status Send(uint64_t id, std::vector<iovec>& iov, const std::shared_ptr<Pending>& p, Clock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(map_mu_);
      if (broken()) return Unavailable("connection lost");
      pending_[id] = p;
      in_flight_.store(pending_.size(), std::memory_order_relaxed);
    }
    Status ws;
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      ws = tls_ ? tls_->WriteAllV(iov, deadline) : WriteAllV(fd_.get(), iov, deadline);
    }
    if (!ws.ok()) {
      MarkBroken(ws);
      std::lock_guard<std::mutex> lock(p->mu);
      return p->done ? p->call : ws;
    }
    return Status::Ok();
  }

  // Waits for the answer of a request Send sent, until `deadline` (then the
  // request is abandoned: a late answer never touches p's buffers). Past the
  // deadline it still reads what has already arrived, once: a caller that
  // spent the time awaiting another node's answer finds this one waiting.
  Status Await(uint64_t id, const std::shared_ptr<Pending>& p, Clock::time_point deadline) {
    bool looked = false;  // read once at or after the deadline
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(p->mu);
        // Follow while someone else reads; lead when the role is free.
        p->cv.wait_until(lock, deadline, [&] { return p->done || !reading_.load(std::memory_order_acquire); });
        if (p->done) return p->call;
        if (Clock::now() >= deadline && (looked || reading_.load(std::memory_order_acquire))) {
          p->abandoned = true;
          lock.unlock();
          Forget(id);
          return DeadlineExceeded("no answer from the node within the timeout");
        }
      }
      bool expected = false;
      if (!reading_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) continue;
      looked = looked || Clock::now() >= deadline;
      Status rs = Status::Ok();
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(p->mu);
          if (p->done) break;
        }
        rs = ReadOne(deadline);
        if (!rs.ok()) break;
      }
      reading_.store(false, std::memory_order_release);
      WakeFollowers();
      if (rs.code() == StatusCode::kDeadlineExceeded) continue;  // nothing arrived in time: loop times out
      if (!rs.ok()) MarkBroken(rs);
    }
  }

 private:
  void Forget(uint64_t id) {
    std::lock_guard<std::mutex> lock(map_mu_);
    pending_.erase(id);
    in_flight_.store(pending_.size(), std::memory_order_relaxed);
  }
  // Wakes every waiter so one of them takes the reader role. The map's
  // references keep them alive; no reference is taken here, so a waiter is
  // never freed by this thread (callers release their Pending last).
  // Lock order map_mu_ -> q->mu: nobody takes map_mu_ while holding a q->mu.
  void WakeFollowers() {
    std::lock_guard<std::mutex> map_lock(map_mu_);
    for (auto& [id, q] : pending_) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->cv.notify_all();
    }
  }
  void MarkBroken(const Status& why) {
    std::unordered_map<uint64_t, std::shared_ptr<Pending>> failed;
    {
      std::lock_guard<std::mutex> lock(map_mu_);
      if (!broken_.exchange(true)) ::shutdown(fd_.get(), SHUT_RDWR);
      failed.swap(pending_);
      in_flight_.store(0, std::memory_order_relaxed);
    }
    for (auto& [id, p] : failed) {
      std::unique_lock<std::mutex> lock(p->mu);
      if (p->done || p->abandoned) continue;  // its caller may be gone: ours may be the last reference
      p->call = Unavailable("connection to the node lost: " + why.message());
      p->done = true;
      p->cv.notify_all();
      p.reset();  // under the lock, as in ReadOne: the waiting caller releases last
    }
  }

  // Reads n bytes of a frame already under way (the peer may stall at most
  // stall_ms_). Over plain TCP short reads go through the stage: what it
  // holds is taken first, and a short rest refills it with one recv, which
  // usually brings the whole answer (a GET's header, item table and the head
  // of its first payload, or all of a small answer) and may bring the start
  // of the next one. A rest of kStage bytes or more goes straight to dst.
  Status Read(void* dst, size_t n) {
    if (tls_) return tls_->ReadFull(dst, n, stall_ms_);
    std::byte* out = static_cast<std::byte*>(dst);
    size_t got = Take(out, n);
    if (got == n) return Status::Ok();
    const size_t rest = n - got;
    if (rest >= kStage) return ReadFull(fd_.get(), out + got, rest, stall_ms_, {});
    size_t filled = 0;
    Status s = ReadAtLeast(fd_.get(), stage_.data(), rest, stage_.size(), stall_ms_, {}, &filled);
    stage_pos_ = 0;
    stage_len_ = filled;
    KVMESH_RETURN_IF_ERROR(s);
    Take(out + got, rest);
    return Status::Ok();
  }
  // Plain TCP, the stage empty: waits for the next frame to begin and reads
  // what has come of it into the stage. The socket is blocking, so the wait
  // is the recv itself (no poll before it: one syscall and one wake-up per
  // answer), bounded by SO_RCVTIMEO slices of at most kWaitSliceMs: the
  // timeout changes only near a deadline, not per call. DeadlineExceeded
  // when nothing came before `deadline` (the stream is intact).
  Status AwaitFrame(Clock::time_point deadline) {
    for (;;) {
      const int left = MsLeft(deadline);
      if (left > 0) SetRecvTimeout(std::min(left, kWaitSliceMs));
      const ssize_t r = ::recv(fd_.get(), stage_.data(), stage_.size(), left > 0 ? 0 : MSG_DONTWAIT);
      if (r > 0) {
        stage_pos_ = 0;
        stage_len_ = static_cast<size_t>(r);
        return Status::Ok();
      }
      if (r == 0) return Unavailable("connection closed by peer");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Unavailable(std::string("recv: ") + std::strerror(errno));
      if (left == 0) return DeadlineExceeded("deadline");
    }
  }
  void SetRecvTimeout(int ms) {
    if (ms == recv_timeout_ms_) return;
    timeval tv{ms / 1000, (ms % 1000) * 1000};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    recv_timeout_ms_ = ms;
  }
  // Copies up to n staged bytes to dst; returns how many.
  size_t Take(std::byte* dst, size_t n) {
    const size_t k = std::min(n, stage_len_ - stage_pos_);
    if (k) std::memcpy(dst, stage_.data() + stage_pos_, k);
    stage_pos_ += k;
    return k;
  }
  // Bytes of the stream already read (the stage, or TLS's decrypted buffer).
  bool HasBuffered() const { return tls_ ? tls_->HasBuffered() : stage_pos_ < stage_len_; }

  // Reads one answer frame and completes its waiter. DeadlineExceeded when no
  // frame started before `deadline` (the stream is intact); other errors break it.
  Status ReadOne(Clock::time_point deadline) {
    if (broken()) return Unavailable("connection lost");
    // Past the deadline: only a frame that has already arrived (no waiting).
    // The stage, or TLS, may hold bytes the socket no longer shows.
    if (!HasBuffered()) {
      if (!tls_) {
        KVMESH_RETURN_IF_ERROR(AwaitFrame(deadline));
      } else {
        pollfd pf{fd_.get(), POLLIN, 0};
        int pr = ::poll(&pf, 1, MsLeft(deadline));
        if (pr == 0) return DeadlineExceeded("deadline");
      }
    }
    HeaderBytes hb;
    KVMESH_RETURN_IF_ERROR(Read(hb.data(), hb.size()));
    FrameHeader h;
    KVMESH_RETURN_IF_ERROR(DecodeHeader(hb, limits_, &h));
    if (!h.is_response()) return InvalidArgument("node sent a request frame");
    std::shared_ptr<Pending> p;
    {
      std::lock_guard<std::mutex> lock(map_mu_);
      auto it = pending_.find(h.request_id);
      if (it != pending_.end()) {
        p = it->second;
        pending_.erase(it);
        in_flight_.store(pending_.size(), std::memory_order_relaxed);
      }
    }
    if (p == nullptr) {  // the caller gave up: drain the body
      scratch_.resize(h.body_len);
      return Read(scratch_.data(), h.body_len);
    }
    std::unique_lock<std::mutex> lock(p->mu);
    Status s = Fill(h, p.get());
    if (!s.ok()) p->call = Unavailable("bad answer from the node: " + s.message());
    p->done = true;
    p->cv.notify_all();
    // Drop our reference while holding p->mu: a caller that has not given up
    // still holds its own and can only see `done` after we unlock, so it
    // frees the Pending, in its own thread. (An abandoned one was released
    // by its caller: then ours is the last and must outlive the lock.)
    if (!p->abandoned) p.reset();
    return s;
  }

  // Reads the body of answer `h` into p (REQUIRES p->mu held, so an
  // abandoning caller cannot free its buffers meanwhile).
  Status Fill(const FrameHeader& h, Pending* p) {
    p->header = h;
    if (h.status != StatusCode::kOk || h.opcode != Opcode::kGet || p->abandoned) {
      p->body.resize(h.body_len);
      KVMESH_RETURN_IF_ERROR(Read(p->body.data(), h.body_len));
      p->call = h.status == StatusCode::kOk ? Status::Ok() : ParseErrorBody(h, p->body);
      return Status::Ok();
    }
    // GET: the item table, then each hit straight into its caller's buffer.
    if (h.count != p->get_items.size()) return InvalidArgument("GET answer count differs from the request");
    std::vector<std::byte>& table = table_;
    std::vector<GetRecord>& recs = recs_;
    table.resize(size_t{h.count} * kGetItemSize);
    KVMESH_RETURN_IF_ERROR(Read(table.data(), table.size()));
    KVMESH_RETURN_IF_ERROR(ParseGetTable(h, table, limits_, &recs));
    for (size_t i = 0; i < recs.size(); ++i) {
      GetItem& it = p->get_items[i];
      const GetRecord& r = recs[i];
      it.size = r.size;
      it.status = GetRecordStatus(r);
      if (!it.status.ok()) continue;
      if (it.dst.size() < r.size) {
        std::vector<std::byte> sink(r.size);
        KVMESH_RETURN_IF_ERROR(Read(sink.data(), r.size));
        it.status = ResourceExhausted("destination smaller than the block");
        continue;
      }
      KVMESH_RETURN_IF_ERROR(Read(it.dst.data(), r.size));
      it.status = VerifyPayload(it.dst.first(r.size), r.checksum);
    }
    p->call = Status::Ok();
    return Status::Ok();
  }

  UniqueFd fd_;
  std::unique_ptr<TlsConn> tls_;  // over fd_: destroyed first
  const int64_t stall_ms_;
  const ProtocolLimits limits_;
  std::mutex write_mu_;
  std::mutex map_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;  // guarded by map_mu_
  std::atomic<size_t> in_flight_{0};  // pending_.size(), written under map_mu_, read without it
  std::atomic<bool> broken_{false};
  std::atomic<bool> reading_{false};  // one caller at a time reads (leader)
  std::vector<std::byte> scratch_;    // used by the reader only
  std::vector<std::byte> table_;      // a GET answer's item table (the reader only; kept: no allocation per GET)
  std::vector<GetRecord> recs_;       // its parsed records (the reader only)
  // Plain TCP: bytes read ahead of the frame being read (the reader only).
  static constexpr size_t kStage = 4096;
  std::array<std::byte, kStage> stage_;
  size_t stage_pos_ = 0, stage_len_ = 0;
  static constexpr int kWaitSliceMs = 100;
  int recv_timeout_ms_ = 0;  // the socket's SO_RCVTIMEO (0: none yet; the reader only)
};

// A call in flight (router fan-out); defined with the asynchronous calls at the end.
class TcpCallState;
enum class TcpCallKind : uint8_t { kPut, kGet, kExists, kErase };

class TcpChannelImpl final : public SeqOverFrames<SyncOverAsync<TcpChannel>> {
 public:
  explicit TcpChannelImpl(TcpChannelOptions o) : o_(std::move(o)), slots_(std::max<uint32_t>(1, o_.connections)) {}

  std::string_view transport() const override { return "tcp"; }
  void set_epoch(uint64_t e) override { epoch_.store(e, std::memory_order_release); }
  uint64_t last_node_epoch() const override { return node_epoch_.load(); }
  std::string node_id() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return node_id_;
  }

  Status Connect() override { return Acquire().status(); }

  // Put, Get, Exists and Erase are the asynchronous forms waited for at once
  // (SyncOverAsync). Put and Get batches larger than the node's limits (items
  // or bytes) go as several frames, all written before the first answer is
  // awaited.
  bool async_calls() const override { return true; }
  void StartPut(std::span<PutItem> items, const RequestOptions& o, ChannelCall* call) override;
  void StartGet(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call) override;
  void StartExists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch, const RequestOptions& o,
                   ChannelCall* call) override;
  void StartErase(std::span<const BlockKey> keys, std::span<Status> statuses, const RequestOptions& o,
                  ChannelCall* call) override;

  Status Pin(std::span<const BlockKey> keys, std::span<Status> st) override {
    return StatusCall(Opcode::kPin, keys, st);
  }
  Status Unpin(std::span<const BlockKey> keys, std::span<Status> st) override {
    return StatusCall(Opcode::kUnpin, keys, st);
  }
  Status Release(std::span<const BlockKey> keys, std::span<Status> st) override {
    return StatusCall(Opcode::kRelease, keys, st);
  }

  Status MatchPrefix(std::span<const BlockKey> keys, uint32_t* matched, const RequestOptions& o) override {
    *matched = 0;
    if (keys.empty()) return Status::Ok();
    std::string body;
    for (const BlockKey& k : keys) AppendKey(&body, k);
    std::vector<iovec> iov{{}, {body.data(), body.size()}};
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(Opcode::kMatchPrefix, 0, keys.size(), body.size(), iov, p, o));
    return ParseMatchAnswer(p->header, p->body, matched);
  }

  // Live sequences: SeqOverFrames (transport/seq_calls.h) over SeqRoundtrip below.

  Result<std::string> StatsJson() override {
    std::vector<iovec> iov{{}};
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(Opcode::kStats, 0, 0, 0, iov, p, {}));
    return std::string(reinterpret_cast<const char*>(p->body.data()), p->body.size());
  }

 private:
  Status KeyCall(Opcode op, uint8_t flags, std::span<const BlockKey> keys, const RequestOptions& o,
                 std::vector<uint8_t>* codes) {
    codes->clear();
    if (keys.empty()) return Status::Ok();
    std::string body;
    for (const BlockKey& k : keys) AppendKey(&body, k);
    std::vector<iovec> iov{{}, {body.data(), body.size()}};
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(op, flags, keys.size(), body.size(), iov, p, o));
    return ParseStatusBytes(p->header, p->body, codes);
  }
  Status StatusCall(Opcode op, std::span<const BlockKey> keys, std::span<Status> st) {
    std::vector<uint8_t> codes;
    KVMESH_RETURN_IF_ERROR(KeyCall(op, 0, keys, {}, &codes));
    for (size_t i = 0; i < keys.size(); ++i) st[i] = ItemStatus(codes[i]);
    return Status::Ok();
  }

  // SeqFrameIo: one SEQ frame there and back.
  Status SeqRoundtrip(Opcode op, std::span<const std::span<const std::byte>> body, const RequestOptions& o,
                      std::vector<std::byte>* answer) override {
    std::vector<iovec> iov{{}};
    uint64_t len = 0;
    for (std::span<const std::byte> b : body) {
      iov.push_back({const_cast<std::byte*>(b.data()), b.size()});
      len += b.size();
    }
    auto p = std::make_shared<Pending>();
    KVMESH_RETURN_IF_ERROR(Roundtrip(op, 0, 0, len, iov, p, o));
    *answer = std::move(p->body);
    return Status::Ok();
  }
  Result<uint64_t> SeqMaxBody() override {
    KVMESH_RETURN_IF_ERROR(Acquire().status());  // the node's limits come with its HELLO
    return limits().max_body_bytes;
  }

  Clock::time_point Deadline(const RequestOptions& o) const {
    const int64_t timeout = o.timeout_ms > 0 ? o.timeout_ms : o_.timeout_ms;
    return Clock::now() + std::chrono::milliseconds(timeout);
  }

  // Sends one request (iov[0] is filled with the header) and waits for its answer.
  Status Roundtrip(Opcode op, uint8_t flags, size_t count, uint64_t body_len, std::vector<iovec>& iov,
                   const std::shared_ptr<Pending>& p, const RequestOptions& o) {
    const auto deadline = Deadline(o);
    std::shared_ptr<Connection> conn;
    uint64_t id = 0;
    Status s = SendFrame(op, flags, count, body_len, iov, p, deadline, &conn, &id);
    if (s.ok()) s = conn->Await(id, p, deadline);
    if (s.code() == StatusCode::kStaleEpoch) node_epoch_.store(p->header.epoch);
    return s;
  }

  // Sends one request and leaves it in flight: Await(*id) on *conn_out
  // collects it. It goes on *conn_out when that is set (a connection the
  // caller acquired), else on the next connection of the pool.
  Status SendFrame(Opcode op, uint8_t flags, size_t count, uint64_t body_len, std::vector<iovec>& iov,
                   const std::shared_ptr<Pending>& p, Clock::time_point deadline, std::shared_ptr<Connection>* conn_out,
                   uint64_t* id_out) {
    std::shared_ptr<Connection> conn = std::move(*conn_out);
    if (conn == nullptr) {
      KVMESH_ASSIGN_OR_RETURN(conn, Acquire());
    }
    ProtocolLimits lim = limits();
    if (count > lim.max_items || body_len > lim.max_body_bytes)
      return InvalidArgument("batch exceeds the node's limits (" + std::to_string(count) + " items, " +
                             std::to_string(body_len) + " bytes)");
    FrameHeader h;
    h.opcode = op;
    h.flags = flags;
    h.request_id = next_id_.fetch_add(1, std::memory_order_relaxed);
    h.epoch = epoch_.load(std::memory_order_acquire);
    h.count = static_cast<uint32_t>(count);
    h.body_len = static_cast<uint32_t>(body_len);
    HeaderBytes hb = EncodeHeader(h);
    iov[0] = {hb.data(), hb.size()};
    Status s = conn->Send(h.request_id, iov, p, deadline);
    if (s.code() == StatusCode::kStaleEpoch) node_epoch_.store(p->header.epoch);
    KVMESH_RETURN_IF_ERROR(s);
    *conn_out = std::move(conn);
    *id_out = h.request_id;
    return Status::Ok();
  }
  // Sends one frame of call `st` (its body in st->iov) and records it there.
  // The frame goes on *conn when set (consumed), else on the pool's next connection.
  Status SendPart(Opcode op, uint8_t flags, size_t count, uint64_t body_len, TcpCallState* st, size_t begin,
                  std::shared_ptr<Pending> p, std::shared_ptr<Connection>* conn);
  // Sends frame f of a PUT batch (the frame plan, transport/frame_plan.h).
  Status SendPut(std::span<PutItem> items, FrameSpan f, const RequestOptions& o, TcpCallState* st,
                 std::shared_ptr<Connection>* conn);
  template <typename KeyOf, typename ItemBytes, typename MakePending>
  Status SendKeys(Opcode op, uint8_t flags, size_t n, const ProtocolLimits& lim, KeyOf key_of, ItemBytes item_bytes,
                  MakePending make, TcpCallState* st, std::shared_ptr<Connection>* conn);
  Status SendKeyList(Opcode op, uint8_t flags, std::span<const BlockKey> keys, TcpCallState* st);
  TcpCallState* BeginCall(ChannelCall* call, TcpCallKind kind, const RequestOptions& o);

  ProtocolLimits limits() const {
    std::lock_guard<std::mutex> lock(mu_);
    return server_limits_;
  }

  // A live connection from the pool, opening one when needed: the first open
  // connection with no call in flight, else the next slot round robin. So a
  // lone caller keeps to one warm connection (and to the node thread serving
  // it: alternating connections made a single client's round trip ~1.5x
  // slower in bench_transport's RESP table), while concurrent callers spread
  // over the pool, opening its other connections only when they are needed.
  Result<std::shared_ptr<Connection>> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    for (const std::shared_ptr<Connection>& c : slots_)
      if (c && !c->broken() && c->idle()) return c;
    size_t i = rr_.fetch_add(1, std::memory_order_relaxed) % slots_.size();
    if (slots_[i] && !slots_[i]->broken()) return slots_[i];
    if (Clock::now() < backoff_until_) return Unavailable("node " + Addr() + " unreachable (backing off)");
    lock.unlock();
    Result<std::shared_ptr<Connection>> c = Open();
    lock.lock();
    if (!c.ok()) {
      if (c.status().code() != StatusCode::kPermissionDenied)
        backoff_until_ = Clock::now() + std::chrono::milliseconds(o_.reconnect_backoff_ms);
      return c.status();
    }
    slots_[i] = *c;
    return *c;
  }

  std::string Addr() const { return o_.host + ":" + std::to_string(o_.port); }

  Result<std::shared_ptr<Connection>> Open() {
    const auto deadline = Clock::now() + std::chrono::milliseconds(o_.connect_timeout_ms);
    KVMESH_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(o_.host, o_.port, deadline));
    std::unique_ptr<TlsConn> tls;
    if (o_.tls) {
      Result<std::unique_ptr<TlsConn>> t = o_.tls->Connect(fd.get(), o_.host, deadline);
      if (!t.ok()) return Unavailable("node " + Addr() + ": " + t.status().message());
      tls = std::move(*t);
    }
    auto write = [&](std::vector<iovec>& iov) { return tls ? tls->WriteAllV(iov, deadline) : WriteAllV(fd.get(), iov, deadline); };
    auto read = [&](void* dst, size_t n) {
      return tls ? tls->ReadFullUntil(dst, n, deadline, "the node") : ReadFullUntil(fd.get(), dst, n, deadline, "the node");
    };
    // HELLO, synchronously, before any caller shares the socket.
    Hello hello;
    hello.client_id = o_.client_id;
    hello.tenant = o_.tenant;
    hello.token = o_.token;
    std::string body = EncodeHelloBody(hello);
    FrameHeader h;
    h.opcode = Opcode::kHello;
    h.request_id = 0;
    std::string frame = BuildFrame(h, body);
    std::vector<iovec> iov{{frame.data(), frame.size()}};
    KVMESH_RETURN_IF_ERROR(write(iov));
    HeaderBytes hb;
    Status s = read(hb.data(), hb.size());
    if (!s.ok()) return Unavailable("HELLO to " + Addr() + ": " + s.message());
    FrameHeader a;
    ProtocolLimits lim = o_.limits;
    KVMESH_RETURN_IF_ERROR(DecodeHeader(hb, lim, &a));
    std::vector<std::byte> ab(a.body_len);
    KVMESH_RETURN_IF_ERROR(read(ab.data(), ab.size()));
    if (a.opcode != Opcode::kHello || !a.is_response()) return Unavailable("node did not answer HELLO");
    if (a.status != StatusCode::kOk) return ParseErrorBody(a, ab);
    HelloAnswer ans;
    KVMESH_RETURN_IF_ERROR(ParseHelloAnswerBody(ab, &ans));
    {
      std::lock_guard<std::mutex> lock(mu_);
      node_id_ = ans.node_id;
      server_limits_ = ans.limits;
      server_limits_.max_body_bytes = std::min(server_limits_.max_body_bytes, o_.limits.max_body_bytes);
    }
    SetNoDelay(fd.get());
    // Plain TCP: a blocking socket, so the reader waits in recv itself
    // (Connection::AwaitFrame); every other read and write passes
    // MSG_DONTWAIT and waits in poll within its bound. TLS stays non-blocking.
    if (!tls) ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    return std::make_shared<Connection>(fd.release(), std::move(tls), o_.timeout_ms, o_.limits);
  }

  TcpChannelOptions o_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Connection>> slots_;  // guarded by mu_
  Clock::time_point backoff_until_{};               // guarded by mu_
  std::string node_id_;                             // guarded by mu_
  ProtocolLimits server_limits_;                    // written once per connect, under mu_
  std::atomic<size_t> rr_{0};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> node_epoch_{0};
};


// ---- asynchronous calls (router fan-out) ------------------------------------------
// Start* writes every frame of the call (several when the batch exceeds the
// node's limits) and returns; Wait() then awaits each frame on its connection
// (leader/follower as for any caller), so answers from many nodes arrive
// while the caller still writes or waits elsewhere. Every frame shares the
// call's deadline.

class TcpCallState final : public ChannelCallState {
 public:
  struct Frame {
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Pending> p;
    uint64_t id = 0;
    size_t begin = 0, count = 0;  // its items in the call's batch
  };

  Status Wait() override {
    Status first = Status::Ok();
    for (Frame& f : frames) {
      Status s = f.conn->Await(f.id, f.p, deadline);
      if (s.code() == StatusCode::kStaleEpoch) node_epoch->store(f.p->header.epoch);
      if (s.ok()) s = Collect(f);
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    if (first.ok()) first = std::move(unsent);  // frames never sent fail the call after those that were
    frames.clear();                             // drops connections and answers; keeps the capacity
    unsent = Status::Ok();
    return first;
  }

  TcpCallKind kind = TcpCallKind::kPut;
  Clock::time_point deadline;
  std::atomic<uint64_t>* node_epoch = nullptr;
  std::vector<Frame> frames;
  Status unsent;  // why the rest of the batch was not sent (OK: all of it was)
  std::span<PutItem> put;
  std::span<uint8_t> found;
  std::span<Status> statuses;
  // Reused from call to call: request bodies (only until written) and answer codes.
  std::string table;
  std::vector<iovec> iov;
  std::vector<uint8_t> codes;

 private:
  // Copies frame f's per-item answers into the caller's items (GET answers
  // were read straight into them).
  Status Collect(const Frame& f) {
    if (kind == TcpCallKind::kGet) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(ParseStatusBytes(f.p->header, f.p->body, &codes));
    if (codes.size() != f.count) return Unavailable("bad answer from the node: item count differs from the request");
    for (size_t i = 0; i < f.count; ++i) {
      switch (kind) {
        case TcpCallKind::kPut: put[f.begin + i].status = ItemStatus(codes[i]); break;
        case TcpCallKind::kExists: found[f.begin + i] = codes[i] ? 1 : 0; break;
        case TcpCallKind::kErase: statuses[f.begin + i] = ItemStatus(codes[i]); break;
        case TcpCallKind::kGet: break;
      }
    }
    return Status::Ok();
  }
};

TcpCallState* TcpChannelImpl::BeginCall(ChannelCall* call, TcpCallKind kind, const RequestOptions& o) {
  TcpCallState* st = call->StartAs<TcpCallState>();
  st->kind = kind;
  st->deadline = Deadline(o);
  st->node_epoch = &node_epoch_;
  st->frames.clear();
  st->unsent = Status::Ok();
  return st;
}

Status TcpChannelImpl::SendPart(Opcode op, uint8_t flags, size_t count, uint64_t body_len, TcpCallState* st,
                                size_t begin, std::shared_ptr<Pending> p, std::shared_ptr<Connection>* first) {
  std::shared_ptr<Connection> conn;
  if (first != nullptr) conn = std::move(*first);
  uint64_t id = 0;
  KVMESH_RETURN_IF_ERROR(SendFrame(op, flags, count, body_len, st->iov, p, st->deadline, &conn, &id));
  st->frames.push_back(TcpCallState::Frame{std::move(conn), std::move(p), id, begin, count});
  return Status::Ok();
}

Status TcpChannelImpl::SendPut(std::span<PutItem> items, FrameSpan f, const RequestOptions& o, TcpCallState* st,
                               std::shared_ptr<Connection>* conn) {
  st->iov.clear();
  st->iov.push_back({});  // header
  st->iov.push_back({});  // the item table, once built
  auto piece = [&](size_t i) { return PutPiece{items[i].key, {}, items[i].data, o.priority}; };
  auto payload = [&](std::span<const std::byte> b) { st->iov.push_back({const_cast<std::byte*>(b.data()), b.size()}); };
  const uint64_t body = BuildPutTable(f, piece, &st->table, payload);
  st->iov[1] = {st->table.data(), st->table.size()};
  return SendPart(Opcode::kPut, o.replace ? kFlagReplace : 0, f.size(), body, st, f.begin,
                  std::make_shared<Pending>(), conn);
}

// Sends the key lists of items [0, n) (key_of(i)) in the frames the node's
// limits `lim` allow (item_bytes(i): what item i adds to a frame); make(f)
// gives frame f's Pending.
template <typename KeyOf, typename ItemBytes, typename MakePending>
Status TcpChannelImpl::SendKeys(Opcode op, uint8_t flags, size_t n, const ProtocolLimits& lim, KeyOf key_of,
                                ItemBytes item_bytes, MakePending make, TcpCallState* st,
                                std::shared_ptr<Connection>* conn) {
  for (size_t at = 0; at < n;) {
    const FrameSpan f{at, FrameEnd(at, n, lim, item_bytes)};
    const uint64_t len = BuildKeyTable(f, key_of, &st->table);
    st->iov.assign({{}, {st->table.data(), st->table.size()}});
    KVMESH_RETURN_IF_ERROR(SendPart(op, flags, f.size(), len, st, f.begin, make(f), conn));
    at = f.end;
  }
  return Status::Ok();
}

void TcpChannelImpl::StartPut(std::span<PutItem> items, const RequestOptions& o, ChannelCall* call) {
  TcpCallState* st = BeginCall(call, TcpCallKind::kPut, o);
  st->put = items;
  // The node's limits come with its HELLO. The connection acquired for them
  // carries the first frame: acquiring a second one for sending would take
  // two round-robin steps per call and, with two connections, send every
  // call on the same one.
  Result<std::shared_ptr<Connection>> first = Acquire();
  if (!first.ok()) {
    st->unsent = first.status();
    return;
  }
  std::shared_ptr<Connection> conn = std::move(*first);
  const ProtocolLimits lim = limits();
  auto size_of = [&](size_t i) -> uint64_t { return items[i].data.size(); };
  auto refuse = [&](size_t i, Status s) { items[i].status = std::move(s); };
  for (size_t at = 0; at < items.size();) {
    const FrameSpan f = NextPutFrame(at, items.size(), lim, size_of, refuse);
    if (f.empty()) return;
    st->unsent = SendPut(items, f, o, st, &conn);
    if (!st->unsent.ok()) return;
    at = f.end;
  }
}

void TcpChannelImpl::StartGet(std::span<GetItem> items, const RequestOptions& o, ChannelCall* call) {
  TcpCallState* st = BeginCall(call, TcpCallKind::kGet, o);
  Result<std::shared_ptr<Connection>> first = Acquire();  // as in StartPut
  if (!first.ok()) {
    st->unsent = first.status();
    return;
  }
  std::shared_ptr<Connection> conn = std::move(*first);
  const ProtocolLimits lim = limits();
  auto pending = [&](FrameSpan f) {
    auto p = std::make_shared<Pending>();
    p->get_items = items.subspan(f.begin, f.size());  // the reader fills them
    return p;
  };
  st->unsent = SendKeys(
      Opcode::kGet, 0, items.size(), lim, [&](size_t i) { return items[i].key; },
      [&](size_t i) { return GetItemBytes(items[i].dst.size(), lim); }, pending, st, &conn);
}

void TcpChannelImpl::StartExists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch,
                                 const RequestOptions& o, ChannelCall* call) {
  TcpCallState* st = BeginCall(call, TcpCallKind::kExists, o);
  st->found = found;
  st->unsent = SendKeyList(Opcode::kExists, touch ? kFlagTouch : 0, keys, st);
}

void TcpChannelImpl::StartErase(std::span<const BlockKey> keys, std::span<Status> statuses, const RequestOptions& o,
                                ChannelCall* call) {
  TcpCallState* st = BeginCall(call, TcpCallKind::kErase, o);
  st->statuses = statuses;
  st->unsent = SendKeyList(Opcode::kErase, 0, keys, st);
}

Status TcpChannelImpl::SendKeyList(Opcode op, uint8_t flags, std::span<const BlockKey> keys, TcpCallState* st) {
  if (keys.empty()) return Status::Ok();
  KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<Connection> conn, Acquire());  // the node's limits, as in StartPut
  return SendKeys(
      op, flags, keys.size(), limits(), [&](size_t i) { return keys[i]; }, [](size_t) { return kKeyItemBytes; },
      [](FrameSpan) { return std::make_shared<Pending>(); }, st, &conn);
}

}  // namespace

std::unique_ptr<TcpChannel> TcpChannel::Create(TcpChannelOptions options) {
  return std::make_unique<TcpChannelImpl>(std::move(options));
}

}  // namespace kvmesh
