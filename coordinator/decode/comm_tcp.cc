// StepComm over TCP: a full mesh driven by one poll() loop per collective
// (see comm_tcp.h for the contract and the design).
#include "coordinator/decode/comm_tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/checksum.h"
#include "transport/socket_util.h"

namespace kvmesh::decode {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class Op : uint8_t {
  kHello = 1,    // rank -> 0: u32 rank, u32 size, u32 listen ip (network order), u32 listen port
  kWelcome = 2,  // 0 -> rank: u64 group id, then per rank u32 ip, u32 port
  kSumF32 = 3,
  kMinU64 = 4,
  kSumU64 = 5,
  kBroadcast = 6,
  kBarrier = 7,
  kAbort = 8,      // the reason (text); `root` carries the StatusCode
  kPeerHello = 9,  // rank j -> rank i < j on i's listener: u64 group id, u32 rank j, u32 size
  kReady = 10,     // rank -> 0: my links are up; 0 -> rank: every rank's are
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kHello: return "hello";
    case Op::kWelcome: return "welcome";
    case Op::kSumF32: return "AllReduceSum";
    case Op::kMinU64: return "AllReduceMin";
    case Op::kSumU64: return "AllReduceSumU64";
    case Op::kBroadcast: return "Broadcast";
    case Op::kBarrier: return "Barrier";
    case Op::kAbort: return "abort";
    case Op::kPeerHello: return "peer hello";
    case Op::kReady: return "ready";
  }
  return "unknown";
}

constexpr uint32_t kMagic = 0x4353564bu;  // "KVSC" little-endian
constexpr uint8_t kVersion = 2;           // 2: the full mesh (1 was the star)
constexpr size_t kHeaderBytes = 40;
constexpr size_t kMaxAbortBytes = 4096;
constexpr size_t kHelloBytes = 16;
constexpr size_t kPeerHelloBytes = 16;
// How long a failing rank spends telling its peers why, and how long a rank
// waits for the rest of an abort frame whose header it has read.
constexpr milliseconds kAbortWait{200};

struct Header {
  Op op = Op::kBarrier;
  uint16_t root = 0;
  uint64_t seq = 0;
  uint64_t len = 0;
  uint64_t sum = 0;  // xxh3 of the payload
};

void Put(std::byte* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t Get(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

void Encode(const Header& h, std::byte* b) {
  Put(&b[0], kMagic, 4);
  Put(&b[4], kVersion, 1);
  Put(&b[5], static_cast<uint8_t>(h.op), 1);
  Put(&b[6], h.root, 2);
  Put(&b[8], h.seq, 8);
  Put(&b[16], h.len, 8);
  Put(&b[24], h.sum, 8);
  Put(&b[32], Checksum64(b, 32), 8);
}

Status DecodeHeader(const std::byte* b, const std::string& from, Header* h) {
  if (Get(&b[32], 8) != Checksum64(b, 32))
    return DataLoss("bad frame header from " + from + " (checksum mismatch: not a kvmesh step peer, or corrupted)");
  if (Get(&b[0], 4) != kMagic) return DataLoss("bad frame magic from " + from);
  if (Get(&b[4], 1) != kVersion)
    return DataLoss("frame version " + std::to_string(Get(&b[4], 1)) + " from " + from + ", expected " +
                    std::to_string(kVersion));
  h->op = static_cast<Op>(Get(&b[5], 1));
  h->root = static_cast<uint16_t>(Get(&b[6], 2));
  h->seq = Get(&b[8], 8);
  h->len = Get(&b[16], 8);
  h->sum = Get(&b[24], 8);
  return Status::Ok();
}

// `got` must be `want` (op, root, seq, len). A valid header for the wrong
// collective is a program error (the ranks left SPMD order); an unknown op
// is garbage.
Status CheckExpected(const Header& got, const Header& want, const std::string& from) {
  if (got.op == want.op && got.root == want.root && got.seq == want.seq && got.len == want.len) return Status::Ok();
  std::ostringstream m;
  m << "collective mismatch: " << from << " sent " << OpName(got.op) << " #" << got.seq << " (root " << got.root
    << ", " << got.len << " bytes), expected " << OpName(want.op) << " #" << want.seq << " (root " << want.root
    << ", " << want.len << " bytes)";
  if (got.op < Op::kHello || got.op > Op::kReady) return DataLoss(m.str());
  return Internal(m.str());
}

int MsLeft(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

std::string RankName(int r) { return "rank " + std::to_string(r); }

Status Closed(const std::string& from) { return Unavailable(from + " closed the connection (process exited or died)"); }

// errno of a failed send/recv on a peer's socket, as a Status.
Status SocketError(const char* what, const std::string& peer, int err) {
  if (err == EPIPE || err == ECONNRESET) return Closed(peer);
  return Unavailable(std::string(what) + " " + peer + ": " + std::strerror(err));
}

// Reads exactly n bytes before the deadline from a non-blocking socket.
Status ReadAll(int fd, void* dst, size_t n, Clock::time_point deadline, const std::string& from) {
  char* p = static_cast<char*>(dst);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Closed(from);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return SocketError("recv from", from, errno);
    pollfd pf{fd, POLLIN, 0};
    const int left = MsLeft(deadline);
    if (left == 0) return DeadlineExceeded("no data from " + from + " within the step timeout");
    ::poll(&pf, 1, left);
  }
  return Status::Ok();
}

// The Status an abort frame carries, once its header `h` has been read
// (`have`: the first bytes of its reason, already read).
Status ReadAbort(int fd, const Header& h, std::span<const std::byte> have, const std::string& from) {
  if (h.len > kMaxAbortBytes) return DataLoss("oversized abort frame from " + from);
  std::string why(h.len, '\0');
  const size_t n = std::min<size_t>(have.size(), why.size());
  if (n > 0) std::memcpy(why.data(), have.data(), n);
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, why.data() + n, why.size() - n, Clock::now() + kAbortWait, from));
  const auto code = static_cast<StatusCode>(h.root);
  return Status(code == StatusCode::kOk ? StatusCode::kUnavailable : code, from + " aborted: " + why);
}

// Blocking-style send of one frame (rendezvous and aborts; the collectives
// use the non-blocking links of TcpComm).
Status SendFrame(int fd, Header h, std::span<const std::byte> payload, Clock::time_point deadline,
                 const std::string& to) {
  h.len = payload.size();
  h.sum = Checksum64(payload.data(), payload.size());
  std::array<std::byte, kHeaderBytes> head;
  Encode(h, head.data());
  std::vector<iovec> iov{{head.data(), head.size()}};
  if (!payload.empty()) iov.push_back({const_cast<std::byte*>(payload.data()), payload.size()});
  Status s = WriteAllV(fd, iov, deadline);
  return s.ok() ? s : Status(s.code(), "to " + to + ": " + s.message());
}

void SendAbort(int fd, const Status& s, uint64_t seq, Clock::time_point deadline, const std::string& to) {
  const std::string why = s.ToString().substr(0, kMaxAbortBytes);
  (void)SendFrame(fd, Header{Op::kAbort, static_cast<uint16_t>(s.code()), seq, 0, 0},
                  std::as_bytes(std::span(why.data(), why.size())), deadline, to);
}

// Blocking-style receive of one frame that must be `want` into *payload (the
// rendezvous). An abort frame becomes the Status it carries.
Status RecvFrame(int fd, const Header& want, std::vector<std::byte>* payload, Clock::time_point deadline,
                 const std::string& from) {
  std::array<std::byte, kHeaderBytes> b;
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, b.data(), b.size(), deadline, from));
  Header h;
  KVMESH_RETURN_IF_ERROR(DecodeHeader(b.data(), from, &h));
  if (h.op == Op::kAbort) return ReadAbort(fd, h, {}, from);
  KVMESH_RETURN_IF_ERROR(CheckExpected(h, want, from));
  payload->resize(h.len);
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, payload->data(), payload->size(), deadline, from));
  if (Checksum64(payload->data(), payload->size()) != h.sum)
    return DataLoss("payload checksum mismatch in " + std::string(OpName(h.op)) + " from " + from);
  return Status::Ok();
}

// Reads and discards what a peer already sent, so that closing its socket
// sends a FIN after our abort frame rather than a reset that could discard it.
void Drain(int fd) {
  char sink[65536];
  for (int i = 0; i < 1024 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
}

// One link of the mesh and its progress within the current collective.
struct Link {
  enum class Rx : uint8_t {
    kIdle,     // nothing (more) expected in this collective
    kHeader,   // reading the expected frame (header not complete yet)
    kPayload,  // header checked, reading the rest of the payload
  };
  UniqueFd fd;  // invalid for this rank's own slot
  std::string name;
  // Send side: what is left of this collective's frame (iovecs advanced in
  // place); out_first == out.size(): nothing to send.
  std::array<iovec, 2> out{};
  size_t out_first = 2;
  bool out_started = false;  // part of the frame is on the wire
  // Receive side.
  Rx rx = Rx::kIdle;
  Header want;
  std::array<std::byte, kHeaderBytes> head{};
  size_t got = 0;             // bytes of the frame (header, then payload) read so far
  uint64_t sum = 0;           // payload checksum announced by the header
  std::vector<std::byte> in;  // payload (want.len bytes), reused across collectives

  bool sending() const { return out_first < out.size(); }
  bool receiving() const { return rx == Rx::kHeader || rx == Rx::kPayload; }
};

// Writes what the socket takes now. Ok with bytes left means "wait for POLLOUT".
Status PushOut(Link& l) {
  while (l.sending()) {
    if (l.out[l.out_first].iov_len == 0) {
      ++l.out_first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = &l.out[l.out_first];
    msg.msg_iovlen = l.out.size() - l.out_first;
    const ssize_t n = ::sendmsg(l.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      return SocketError("send to", l.name, errno);
    }
    l.out_started = true;
    for (size_t done = static_cast<size_t>(n); done > 0;) {
      iovec& v = l.out[l.out_first];
      const size_t take = std::min(done, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + take;
      v.iov_len -= take;
      done -= take;
      if (v.iov_len == 0) ++l.out_first;
    }
  }
  return Status::Ok();
}

// Reads what has arrived of the expected frame: header and payload in one
// recvmsg (the receiver knows the length), so a frame that is all here
// costs one system call. Ok while still receiving means "wait for POLLIN";
// an abort frame becomes the Status it carries.
Status PullIn(Link& l) {
  const size_t total = kHeaderBytes + l.in.size();
  while (l.receiving()) {
    if (l.got < total) {
      std::array<iovec, 2> v;
      size_t nv = 0, asked = 0;
      if (l.got < kHeaderBytes) v[nv++] = {l.head.data() + l.got, kHeaderBytes - l.got};
      const size_t off = l.got > kHeaderBytes ? l.got - kHeaderBytes : 0;
      if (off < l.in.size()) v[nv++] = {l.in.data() + off, l.in.size() - off};
      for (size_t i = 0; i < nv; ++i) asked += v[i].iov_len;
      msghdr m{};
      m.msg_iov = v.data();
      m.msg_iovlen = nv;
      const ssize_t r = ::recvmsg(l.fd.get(), &m, MSG_DONTWAIT);
      if (r == 0) return Closed(l.name);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
        return SocketError("recv from", l.name, errno);
      }
      l.got += static_cast<size_t>(r);
      if (l.rx == Link::Rx::kHeader && l.got >= kHeaderBytes) {
        Header h;
        KVMESH_RETURN_IF_ERROR(DecodeHeader(l.head.data(), l.name, &h));
        if (h.op == Op::kAbort)  // its reason may already be in `in`
          return ReadAbort(l.fd.get(), h, std::span(l.in.data(), l.got - kHeaderBytes), l.name);
        KVMESH_RETURN_IF_ERROR(CheckExpected(h, l.want, l.name));  // so h.len == in.size()
        l.sum = h.sum;
        l.rx = Link::Rx::kPayload;
      }
      if (static_cast<size_t>(r) < asked) return Status::Ok();  // drained the socket: wait for POLLIN
      continue;
    }
    if (Checksum64(l.in.data(), l.in.size()) != l.sum)
      return DataLoss("payload checksum mismatch in " + std::string(OpName(l.want.op)) + " from " + l.name);
    l.rx = Link::Rx::kIdle;
  }
  return Status::Ok();
}

// An abort frame waiting at the head of a link this collective reads
// nothing (more) from, as the Status it carries; Ok if there is none.
Status PendingAbort(Link& l) {
  std::array<std::byte, kHeaderBytes> b;
  const ssize_t r = ::recv(l.fd.get(), b.data(), b.size(), MSG_PEEK | MSG_DONTWAIT);
  Header h;
  if (r != static_cast<ssize_t>(kHeaderBytes) || !DecodeHeader(b.data(), l.name, &h).ok() || h.op != Op::kAbort)
    return Status::Ok();
  (void)::recv(l.fd.get(), b.data(), b.size(), MSG_DONTWAIT);  // the peeked header: already here
  return ReadAbort(l.fd.get(), h, {}, l.name);
}

class TcpComm final : public StepComm {
 public:
  // links[r]: the socket to rank r; links[rank] is empty.
  TcpComm(const TcpCommOptions& o, std::vector<UniqueFd> links)
      : rank_(o.rank), size_(o.size), step_timeout_(o.step_timeout), links_(static_cast<size_t>(o.size)) {
    for (int r = 0; r < size_ && r < static_cast<int>(links.size()); ++r) {
      links_[r].fd = std::move(links[r]);
      links_[r].name = RankName(r);
    }
    pfd_.reserve(links_.size());
    who_.reserve(links_.size());
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "tcp"; }

  Status AllReduceSum(std::span<float> data) override {
    return Reduce(Op::kSumF32, data, [](float a, float b) { return a + b; });
  }
  Status AllReduceMin(std::span<uint64_t> data) override {
    return Reduce(Op::kMinU64, data, [](uint64_t a, uint64_t b) { return a < b ? a : b; });
  }
  Status AllReduceSumU64(std::span<uint64_t> data) override {
    return Reduce(Op::kSumU64, data, [](uint64_t a, uint64_t b) { return a + b; });
  }

  // The root sends to every rank; the others read the root's link only.
  Status Broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size_)
      return InvalidArgument("Broadcast root " + std::to_string(root) + " out of [0, " + std::to_string(size_) + ")");
    if (size_ == 1) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(broken_);
    const Header h{Op::kBroadcast, static_cast<uint16_t>(root), ++seq_, data.size(), 0};
    Begin(h, data);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (rank_ == root) SendTo(links_[r], data);
      else if (r == root) Expect(links_[r], h);
    }
    KVMESH_RETURN_IF_ERROR(Check(Progress()));
    const Link& from = links_[static_cast<size_t>(root)];
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), from.in.data(), data.size());  // only on success
    return Status::Ok();
  }

  Status Barrier() override {
    if (size_ == 1) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(broken_);
    const Header h{Op::kBarrier, 0, ++seq_, 0, 0};
    Begin(h, {});
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      SendTo(links_[r], {});
      Expect(links_[r], h);
    }
    return Check(Progress());
  }

 private:
  // Every rank sends `data` to every other and folds all N inputs in rank
  // order: acc = input 0, then acc = f(acc, input r) for r = 1, 2, ... — the
  // same operations in the same order as the thread backend, on every rank.
  template <typename T, typename F>
  Status Reduce(Op op, std::span<T> data, F f) {
    if (size_ == 1) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(broken_);
    const auto bytes = std::as_bytes(data);
    const Header h{op, 0, ++seq_, bytes.size(), 0};
    Begin(h, bytes);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      SendTo(links_[r], bytes);
      Expect(links_[r], h);
    }
    KVMESH_RETURN_IF_ERROR(Check(Progress()));
    auto input = [&](int r) {
      return r == rank_ ? data.data() : reinterpret_cast<const T*>(links_[static_cast<size_t>(r)].in.data());
    };
    // Rank 0 folds into `data` (its own input 0); the others into rank 0's
    // received input, reading their own `data` at their turn, then copy out.
    T* acc = rank_ == 0 ? data.data() : reinterpret_cast<T*>(links_[0].in.data());
    const size_t n = data.size();
    for (int r = 1; r < size_; ++r) {
      const T* x = input(r);
      for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], x[i]);
    }
    if (rank_ != 0 && n > 0) std::memcpy(data.data(), acc, bytes.size());
    return Status::Ok();
  }

  // Starts a collective: encodes its frame header once (the same frame goes
  // to every link) and resets every link to "nothing to send or receive".
  void Begin(Header h, std::span<const std::byte> payload) {
    h.len = payload.size();
    h.sum = Checksum64(payload.data(), payload.size());
    Encode(h, head_.data());
    for (auto& l : links_) {
      l.out_first = l.out.size();
      l.out_started = false;
      l.rx = Link::Rx::kIdle;
    }
  }
  void SendTo(Link& l, std::span<const std::byte> payload) {
    l.out[0] = {head_.data(), head_.size()};
    l.out[1] = {const_cast<std::byte*>(payload.data()), payload.size()};
    l.out_first = 0;
  }
  void Expect(Link& l, const Header& want) {
    l.want = want;
    l.in.resize(want.len);  // keeps its capacity: no allocation at a steady size
    l.rx = Link::Rx::kHeader;
    l.got = 0;
  }

  // Drives every link until all of this collective's frames are sent and
  // received, the first error, or the deadline. Each pass polls exactly the
  // links that have something to do, so it sleeps in poll() until one does.
  Status Progress() {
    const auto deadline = Clock::now() + Timeout();
    // Send first, without poll(): small frames go out at once. Receiving
    // starts with poll(), which costs one call for all links where trying
    // each link would cost one failed recv per late peer.
    for (auto& l : links_)
      if (l.fd.valid()) KVMESH_RETURN_IF_ERROR(PushOut(l));
    for (;;) {
      pfd_.clear();
      who_.clear();
      bool pending = false;
      for (size_t r = 0; r < links_.size(); ++r) {
        const Link& l = links_[r];
        if (!l.fd.valid()) continue;
        short events = 0;
        if (l.sending()) events |= POLLOUT;
        if (l.receiving()) events |= POLLIN;
        pending = pending || l.sending() || l.receiving();
        if (events != 0) {
          pfd_.push_back(pollfd{l.fd.get(), events, 0});
          who_.push_back(r);
        }
      }
      if (!pending) return Status::Ok();
      const int n = ::poll(pfd_.data(), pfd_.size(), MsLeft(deadline));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("poll", errno);
      }
      if (n == 0) {
        if (MsLeft(deadline) > 0) continue;
        return Stalled();
      }
      for (size_t i = 0; i < pfd_.size(); ++i) {
        const short ev = pfd_[i].revents;
        if (ev == 0) continue;
        Link& l = links_[who_[i]];
        if (l.sending() && (ev & (POLLOUT | POLLERR | POLLHUP))) KVMESH_RETURN_IF_ERROR(PushOut(l));
        if (l.receiving() && (ev & (POLLIN | POLLERR | POLLHUP))) KVMESH_RETURN_IF_ERROR(PullIn(l));
      }
    }
  }

  // The step timeout ran out. Another rank may have decided first (rank 0
  // waits less than the others) and sent its abort on a link this
  // collective no longer reads: report its verdict, so every rank names
  // the same culprit. Otherwise name the first rank we still wait for.
  Status Stalled() {
    for (auto& l : links_)
      if (l.fd.valid() && l.rx == Link::Rx::kIdle) KVMESH_RETURN_IF_ERROR(PendingAbort(l));
    for (const auto& l : links_)
      if (l.fd.valid() && l.receiving()) return DeadlineExceeded("no data from " + l.name + " within the step timeout");
    for (const auto& l : links_)
      if (l.fd.valid() && l.sending())
        return DeadlineExceeded(l.name + " stopped reading: our frame did not go out within the step timeout");
    return DeadlineExceeded("step timeout");
  }

  milliseconds Timeout() const {
    // Ranks other than 0 wait a grace period longer, so that when a third
    // rank stalls, rank 0's abort (naming it) arrives before their own timer
    // fires and every rank reports the same culprit.
    if (rank_ == 0) return step_timeout_;
    return step_timeout_ + std::max<milliseconds>(milliseconds(500), step_timeout_ / 4);
  }

  // On failure the group is finished: this rank tells every rank it still
  // reaches why, closes every socket, and the error sticks.
  Status Check(Status s) {
    if (s.ok()) return s;
    s = s.WithContext("tcp step #" + std::to_string(seq_) + " on rank " + std::to_string(rank_));
    const auto deadline = Clock::now() + kAbortWait;
    for (auto& l : links_) {
      if (!l.fd.valid()) continue;
      Drain(l.fd.get());
      if (l.sending() && l.out_started) {  // the abort must start on a frame boundary
        std::vector<iovec> rest(l.out.begin() + static_cast<std::ptrdiff_t>(l.out_first), l.out.end());
        if (!WriteAllV(l.fd.get(), rest, deadline).ok()) continue;
      }
      SendAbort(l.fd.get(), s, seq_, deadline, l.name);
    }
    for (auto& l : links_) l.fd.reset();
    broken_ = s;
    return s;
  }

  const int rank_, size_;
  const milliseconds step_timeout_;
  std::vector<Link> links_;
  uint64_t seq_ = 0;
  Status broken_;
  std::array<std::byte, kHeaderBytes> head_{};  // this collective's frame header, sent to every link
  std::vector<pollfd> pfd_;                     // poll set, reused
  std::vector<size_t> who_;                     // pfd_[i] is links_[who_[i]]
};

// ---- Rendezvous ---------------------------------------------------------------

// A rank's mesh listener as the others connect to it (port 0: it has none).
struct PeerAddr {
  uint32_t ip = 0;  // in_addr_t, network byte order
  uint32_t port = 0;
};

Status ResolveIpv4(const std::string& host, uint16_t port, sockaddr_in* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) return Unavailable("cannot resolve " + host + ": " + gai_strerror(rc));
  std::memcpy(out, res->ai_addr, sizeof(sockaddr_in));
  ::freeaddrinfo(res);
  out->sin_port = htons(port);
  return Status::Ok();
}

std::string Ipv4String(uint32_t ip) {
  in_addr a{};
  a.s_addr = ip;
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

// A non-blocking listening socket on *sa; *sa gets the bound port.
Result<UniqueFd> ListenOn(sockaddr_in* sa, int backlog) {
  UniqueFd ls(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!ls.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const std::string want = Ipv4String(sa->sin_addr.s_addr) + ":" + std::to_string(ntohs(sa->sin_port));
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(sa), sizeof *sa) != 0)
    return Unavailable("tcp step rendezvous: bind " + want + ": " + std::strerror(errno));
  if (::listen(ls.get(), backlog) != 0) return ErrnoStatus("listen " + want, errno);
  socklen_t len = sizeof *sa;
  if (::getsockname(ls.get(), reinterpret_cast<sockaddr*>(sa), &len) != 0) return ErrnoStatus("getsockname", errno);
  return ls;
}

uint64_t NewGroupId() {
  uint64_t g = 0;
  if (::getrandom(&g, sizeof g, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof g))
    g = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (uint64_t(::getpid()) << 40);
  return g;
}

Status WriteRendezvousFile(const std::string& path, const std::string& addr) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << addr << "\n";
    f.flush();
    if (!f) return IoError("cannot write rendezvous file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return ErrnoStatus("rename " + tmp + " -> " + path, errno);
  }
  return Status::Ok();
}

// "host:port" from a complete rendezvous file (one that ends in a newline).
bool ReadRendezvousFile(const std::string& path, std::string* addr) {
  std::ifstream f(path);
  if (!f) return false;
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.empty() || s.back() != '\n') return false;
  s.pop_back();
  *addr = s;
  return true;
}

// Rank 0: every rank's ready frame (its links are up). A rank that could not
// link up sends an abort instead, which fails the rendezvous at once.
Status WaitReady(std::vector<UniqueFd>& peers, Clock::time_point deadline, milliseconds timeout) {
  std::vector<pollfd> pf;
  std::vector<int> who;
  std::vector<bool> ready(peers.size(), false);
  ready[0] = true;
  for (;;) {
    pf.clear();
    who.clear();
    for (size_t r = 1; r < peers.size(); ++r) {
      if (ready[r]) continue;
      pf.push_back(pollfd{peers[r].get(), POLLIN, 0});
      who.push_back(static_cast<int>(r));
    }
    if (pf.empty()) return Status::Ok();
    const int n = ::poll(pf.data(), pf.size(), MsLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string missing;
      for (int r : who) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return DeadlineExceeded("tcp step rendezvous: ranks " + missing + " did not connect to their peers within " +
                              std::to_string(timeout.count()) + " ms");
    }
    for (size_t i = 0; i < pf.size(); ++i) {
      if (pf[i].revents == 0) continue;
      std::vector<std::byte> none;
      KVMESH_RETURN_IF_ERROR(RecvFrame(pf[i].fd, Header{Op::kReady, 0, 0, 0, 0}, &none, deadline, RankName(who[i])));
      ready[static_cast<size_t>(who[i])] = true;
    }
  }
}

Result<std::unique_ptr<StepComm>> Listen(const TcpCommOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  sockaddr_in sa{};
  KVMESH_RETURN_IF_ERROR(ResolveIpv4(o.host, o.port, &sa));
  KVMESH_ASSIGN_OR_RETURN(UniqueFd ls, ListenOn(&sa, o.size + 8));
  const std::string addr = o.host + ":" + std::to_string(ntohs(sa.sin_port));
  struct FileGuard {  // the file names this run only while it is joining
    std::string path;
    ~FileGuard() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } guard;
  if (!o.rendezvous_file.empty()) {
    KVMESH_RETURN_IF_ERROR(WriteRendezvousFile(o.rendezvous_file, addr));
    guard.path = o.rendezvous_file;
  }

  std::vector<UniqueFd> peers(static_cast<size_t>(o.size));
  std::vector<PeerAddr> addrs(static_cast<size_t>(o.size));
  auto fail = [&](Status s) {  // tell the ranks that did join
    const auto until = Clock::now() + kAbortWait;
    for (int r = 1; r < o.size; ++r)
      if (peers[r].valid()) SendAbort(peers[r].get(), s, 0, until, RankName(r));
    return s;
  };
  int joined = 1;
  while (joined < o.size) {
    pollfd p{ls.get(), POLLIN, 0};
    const int left = MsLeft(deadline);
    if (left == 0 || ::poll(&p, 1, left) == 0) {
      std::string missing;
      for (int r = 1; r < o.size; ++r)
        if (!peers[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return fail(DeadlineExceeded("tcp step rendezvous on " + addr + ": " + std::to_string(joined) + " of " +
                                   std::to_string(o.size) + " ranks joined within " +
                                   std::to_string(o.connect_timeout.count()) + " ms (missing: " + missing + ")"));
    }
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) continue;
    SetNoDelay(c.get());
    // A hello must follow the connect at once; a silent or foreign
    // connection is dropped without failing the rendezvous.
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    std::vector<std::byte> hello;
    Status s = RecvFrame(c.get(), Header{Op::kHello, 0, 0, kHelloBytes, 0}, &hello, hello_deadline, "a joining rank");
    if (!s.ok()) continue;
    const int r = static_cast<int>(Get(&hello[0], 4));
    const int n = static_cast<int>(Get(&hello[4], 4));
    std::string refuse;
    if (n != o.size) refuse = "world size " + std::to_string(n) + " differs from rank 0's " + std::to_string(o.size);
    else if (r < 1 || r >= o.size) refuse = "rank " + std::to_string(r) + " out of [1, " + std::to_string(o.size) + ")";
    else if (peers[r].valid()) refuse = "rank " + std::to_string(r) + " has already joined";
    if (!refuse.empty()) {
      SendAbort(c.get(), InvalidArgument(refuse), 0, Clock::now() + kAbortWait, "a joining rank");
      continue;
    }
    addrs[r] = PeerAddr{static_cast<uint32_t>(Get(&hello[8], 4)), static_cast<uint32_t>(Get(&hello[12], 4))};
    peers[r] = std::move(c);
    ++joined;
  }
  // Every rank gets every rank's listener and the group id; rank r connects
  // to ranks 1..r-1 and accepts r+1..N-1, then reports ready.
  std::vector<std::byte> welcome(8 + 8 * static_cast<size_t>(o.size));
  Put(&welcome[0], NewGroupId(), 8);
  for (int r = 0; r < o.size; ++r) {
    Put(&welcome[8 + 8 * r], addrs[r].ip, 4);
    Put(&welcome[12 + 8 * r], addrs[r].port, 4);
  }
  for (int r = 1; r < o.size; ++r) {
    Status s = SendFrame(peers[r].get(), Header{Op::kWelcome, 0, 0, 0, 0}, welcome, deadline, RankName(r));
    if (!s.ok()) return fail(s.WithContext("tcp step rendezvous"));
  }
  if (Status s = WaitReady(peers, deadline, o.connect_timeout); !s.ok())
    return fail(s.WithContext("tcp step rendezvous, rank 0"));
  for (int r = 1; r < o.size; ++r)
    KVMESH_RETURN_IF_ERROR(SendFrame(peers[r].get(), Header{Op::kReady, 0, 0, 0, 0}, {}, deadline, RankName(r)));
  return std::unique_ptr<StepComm>(new TcpComm(o, std::move(peers)));
}

// Rank r > 0, after the welcome: connects to ranks 1..r-1 (links[0], to rank
// 0, is already up), accepts ranks r+1..N-1 on `ls`, and watches rank 0 for
// an abort meanwhile.
Status LinkUp(const TcpCommOptions& o, uint64_t group, const std::vector<PeerAddr>& addrs, const UniqueFd& ls,
              std::vector<UniqueFd>& links, Clock::time_point deadline) {
  std::array<std::byte, kPeerHelloBytes> hello;
  Put(&hello[0], group, 8);
  Put(&hello[8], static_cast<uint32_t>(o.rank), 4);
  Put(&hello[12], static_cast<uint32_t>(o.size), 4);
  // Connecting never waits for the lower rank to accept (the kernel's backlog
  // completes the handshake), so every rank connects first, then accepts.
  for (int k = 1; k < o.rank; ++k) {
    const std::string at = RankName(k) + " at " + Ipv4String(addrs[k].ip) + ":" + std::to_string(addrs[k].port);
    auto c = ConnectTcp(Ipv4String(addrs[k].ip), static_cast<uint16_t>(addrs[k].port), deadline);
    if (!c.ok()) return c.status().WithContext("connecting to " + at);
    SetNoDelay(c->get());
    KVMESH_RETURN_IF_ERROR(SendFrame(c->get(), Header{Op::kPeerHello, 0, 0, 0, 0}, hello, deadline, at));
    links[k] = std::move(*c);
  }
  int missing = o.size - 1 - o.rank;
  while (missing > 0) {
    std::array<pollfd, 2> pf{pollfd{ls.get(), POLLIN, 0}, pollfd{links[0].get(), POLLIN, 0}};
    const int n = ::poll(pf.data(), pf.size(), MsLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string who;
      for (int k = o.rank + 1; k < o.size; ++k)
        if (!links[k].valid()) who += (who.empty() ? "" : ", ") + std::to_string(k);
      return DeadlineExceeded("ranks " + who + " did not connect to rank " + std::to_string(o.rank) + " within " +
                              std::to_string(o.connect_timeout.count()) + " ms");
    }
    if (pf[1].revents != 0) {  // before our ready, rank 0 sends nothing but an abort
      std::vector<std::byte> none;
      Status s = RecvFrame(links[0].get(), Header{Op::kAbort, 0, 0, 0, 0}, &none, deadline, RankName(0));
      return s.ok() ? Internal("rank 0 sent an unexpected frame during the rendezvous") : s;
    }
    if (pf[0].revents == 0) continue;
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) continue;
    // A silent or foreign connection (another group, a port scanner) is dropped.
    std::vector<std::byte> in;
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    if (!RecvFrame(c.get(), Header{Op::kPeerHello, 0, 0, kPeerHelloBytes, 0}, &in, hello_deadline, "a connecting rank")
             .ok())
      continue;
    const int k = static_cast<int>(Get(&in[8], 4));
    if (Get(&in[0], 8) != group || Get(&in[12], 4) != static_cast<uint64_t>(o.size) || k <= o.rank || k >= o.size ||
        links[k].valid())
      continue;
    SetNoDelay(c.get());
    links[k] = std::move(c);
    --missing;
  }
  return Status::Ok();
}

Result<std::unique_ptr<StepComm>> Join(const TcpCommOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  Status last = DeadlineExceeded("nothing tried");
  UniqueFd c;
  std::string addr;
  while (!c.valid()) {
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("tcp step rendezvous: rank " + std::to_string(o.rank) + " could not reach rank 0 within " +
                              std::to_string(o.connect_timeout.count()) + " ms (" + last.ToString() + ")");
    }
    std::string host = o.host;
    uint16_t port = o.port;
    if (port == 0) {
      if (!ReadRendezvousFile(o.rendezvous_file, &addr)) {
        last = NotFound("rendezvous file " + o.rendezvous_file + " not written yet");
        std::this_thread::sleep_for(milliseconds(20));
        continue;
      }
      Status s = SplitHostPort(addr, &host, &port);
      if (!s.ok()) return s.WithContext("rendezvous file " + o.rendezvous_file);
    }
    auto r = ConnectTcp(host, port, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
    if (!r.ok()) {  // rank 0 not listening yet (or a stale file): retry
      last = r.status();
      std::this_thread::sleep_for(milliseconds(50));
      continue;
    }
    c = std::move(*r);
    addr = host + ":" + std::to_string(port);
  }
  SetNoDelay(c.get());
  const std::string zero = "rank 0 at " + addr;
  const std::string ctx = "tcp step rendezvous, rank " + std::to_string(o.rank);
  // The mesh listener, on this host's address towards rank 0 (the last rank
  // only connects, so it has none).
  UniqueFd ls;
  PeerAddr mine;
  if (o.rank < o.size - 1) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    if (::getsockname(c.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) return ErrnoStatus("getsockname", errno);
    sa.sin_port = 0;
    auto l = ListenOn(&sa, o.size + 8);
    if (!l.ok()) return l.status().WithContext(ctx);
    ls = std::move(*l);
    mine = PeerAddr{sa.sin_addr.s_addr, ntohs(sa.sin_port)};
  }
  std::array<std::byte, kHelloBytes> hello;
  Put(&hello[0], static_cast<uint32_t>(o.rank), 4);
  Put(&hello[4], static_cast<uint32_t>(o.size), 4);
  Put(&hello[8], mine.ip, 4);
  Put(&hello[12], mine.port, 4);
  KVMESH_RETURN_IF_ERROR(SendFrame(c.get(), Header{Op::kHello, 0, 0, 0, 0}, hello, deadline, zero));
  std::vector<std::byte> welcome;
  const Header want{Op::kWelcome, 0, 0, 8 + 8 * static_cast<uint64_t>(o.size), 0};
  if (Status s = RecvFrame(c.get(), want, &welcome, deadline, zero); !s.ok()) return s.WithContext(ctx);
  std::vector<PeerAddr> addrs(static_cast<size_t>(o.size));
  for (int r = 0; r < o.size; ++r)
    addrs[r] = PeerAddr{static_cast<uint32_t>(Get(&welcome[8 + 8 * r], 4)),
                        static_cast<uint32_t>(Get(&welcome[12 + 8 * r], 4))};
  std::vector<UniqueFd> links(static_cast<size_t>(o.size));
  links[0] = std::move(c);
  if (Status s = LinkUp(o, Get(&welcome[0], 8), addrs, ls, links, deadline); !s.ok()) {
    s = s.WithContext(ctx);
    if (s.message().find("rank 0 aborted") == std::string::npos)  // tell rank 0, which tells the others
      SendAbort(links[0].get(), s, 0, Clock::now() + kAbortWait, zero);
    return s;
  }
  KVMESH_RETURN_IF_ERROR(SendFrame(links[0].get(), Header{Op::kReady, 0, 0, 0, 0}, {}, deadline, zero));
  std::vector<std::byte> none;
  if (Status s = RecvFrame(links[0].get(), Header{Op::kReady, 0, 0, 0, 0}, &none, deadline, zero); !s.ok())
    return s.WithContext(ctx);
  return std::unique_ptr<StepComm>(new TcpComm(o, std::move(links)));
}

}  // namespace

Result<std::unique_ptr<StepComm>> MakeTcpComm(const TcpCommOptions& o) {
  if (o.size < 1 || o.size > 65535) return InvalidArgument("tcp step comm: world size must be in [1, 65535]");
  if (o.rank < 0 || o.rank >= o.size)
    return InvalidArgument("tcp step comm: rank " + std::to_string(o.rank) + " out of [0, " + std::to_string(o.size) +
                           ")");
  if (o.step_timeout.count() <= 0 || o.connect_timeout.count() <= 0)
    return InvalidArgument("tcp step comm: timeouts must be positive");
  if (o.size > 1 && o.port == 0 && o.rendezvous_file.empty())
    return InvalidArgument("tcp step comm: port 0 needs a rendezvous file (rank 0 publishes its port there)");
  if (o.host.empty()) return InvalidArgument("tcp step comm: empty rendezvous host");
  if (o.size == 1) return std::unique_ptr<StepComm>(new TcpComm(o, {}));
  return o.rank == 0 ? Listen(o) : Join(o);
}

}  // namespace kvmesh::decode
