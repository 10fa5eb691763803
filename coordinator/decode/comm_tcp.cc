// StepComm over TCP: the collectives over the full mesh, driven by one
// poll() loop per collective (see comm_tcp.h for the contract and the
// design). The mesh comes from the rendezvous (comm_tcp_rendezvous.h); the
// frames are those of comm_tcp_frame.h.
#include "coordinator/decode/comm_tcp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "common/checksum.h"
#include "coordinator/decode/comm_tcp_frame.h"
#include "coordinator/decode/comm_tcp_rendezvous.h"
#include "transport/socket_util.h"

namespace kvmesh::decode {
namespace {

using std::chrono::milliseconds;
using tcp_step::CheckExpected;
using tcp_step::Clock;
using tcp_step::DecodeHeader;
using tcp_step::EncodeHeader;
using tcp_step::Header;
using tcp_step::kAbortWait;
using tcp_step::kHeaderBytes;
using tcp_step::Op;
using tcp_step::OpName;
using tcp_step::RankName;
using tcp_step::ReadAbort;
using tcp_step::SendAbort;

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
      return PeerSocketError("send to", l.name, errno);
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
      if (r == 0) return PeerClosed(l.name);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
        return PeerSocketError("recv from", l.name, errno);
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
    EncodeHeader(h, head_.data());
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
  KVMESH_ASSIGN_OR_RETURN(std::vector<UniqueFd> links, tcp_step::ConnectMesh(o));
  return std::unique_ptr<StepComm>(new TcpComm(o, std::move(links)));
}

}  // namespace kvmesh::decode
