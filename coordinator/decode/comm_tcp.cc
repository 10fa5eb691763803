// StepComm over TCP: a star around rank 0 (see comm_tcp.h for the contract).
#include "coordinator/decode/comm_tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
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

enum class Op : uint8_t {
  kHello = 1,    // rank -> 0: u32 rank, u32 size
  kWelcome = 2,  // 0 -> rank: every rank has joined
  kSumF32 = 3,
  kMinU64 = 4,
  kSumU64 = 5,
  kBroadcast = 6,
  kBarrier = 7,
  kAbort = 8,  // 0 -> rank: the reason (text); `root` carries the StatusCode
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
  }
  return "unknown";
}

constexpr uint32_t kMagic = 0x4353564bu;  // "KVSC" little-endian
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 40;
constexpr size_t kMaxAbortBytes = 4096;

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

std::array<std::byte, kHeaderBytes> Encode(const Header& h) {
  std::array<std::byte, kHeaderBytes> b{};
  Put(&b[0], kMagic, 4);
  Put(&b[4], kVersion, 1);
  Put(&b[5], static_cast<uint8_t>(h.op), 1);
  Put(&b[6], h.root, 2);
  Put(&b[8], h.seq, 8);
  Put(&b[16], h.len, 8);
  Put(&b[24], h.sum, 8);
  Put(&b[32], Checksum64(b.data(), 32), 8);
  return b;
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

int MsLeft(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

std::string RankName(int r) { return "rank " + std::to_string(r); }

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
    if (r == 0) return Unavailable(from + " closed the connection (process exited or died)");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Unavailable("recv from " + from + ": " + std::strerror(errno));
    pollfd pf{fd, POLLIN, 0};
    const int left = MsLeft(deadline);
    if (left == 0) return DeadlineExceeded("no data from " + from + " within the step timeout");
    ::poll(&pf, 1, left);
  }
  return Status::Ok();
}

Status SendFrame(int fd, Header h, std::span<const std::byte> payload, Clock::time_point deadline,
                 const std::string& to) {
  h.len = payload.size();
  h.sum = Checksum64(payload.data(), payload.size());
  auto head = Encode(h);
  std::vector<iovec> iov{{head.data(), head.size()}};
  if (!payload.empty()) iov.push_back({const_cast<std::byte*>(payload.data()), payload.size()});
  Status s = WriteAllV(fd, iov, deadline);
  return s.ok() ? s : Status(s.code(), "to " + to + ": " + s.message());
}

// Reads one frame that must be `want` (op, root, seq, len) into *payload.
// An abort frame becomes the Status it carries.
Status RecvFrame(int fd, const Header& want, std::vector<std::byte>* payload, Clock::time_point deadline,
                 const std::string& from) {
  std::array<std::byte, kHeaderBytes> b;
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, b.data(), b.size(), deadline, from));
  Header h;
  KVMESH_RETURN_IF_ERROR(DecodeHeader(b.data(), from, &h));
  if (h.op == Op::kAbort) {
    if (h.len > kMaxAbortBytes) return DataLoss("oversized abort frame from " + from);
    std::string why(h.len, '\0');
    KVMESH_RETURN_IF_ERROR(ReadAll(fd, why.data(), why.size(), deadline, from));
    const auto code = static_cast<StatusCode>(h.root);
    return Status(code == StatusCode::kOk ? StatusCode::kUnavailable : code, from + " aborted: " + why);
  }
  if (h.op != want.op || h.root != want.root || h.seq != want.seq || h.len != want.len) {
    std::ostringstream m;
    m << "collective mismatch: " << from << " sent " << OpName(h.op) << " #" << h.seq << " (root " << h.root << ", "
      << h.len << " bytes), expected " << OpName(want.op) << " #" << want.seq << " (root " << want.root << ", "
      << want.len << " bytes)";
    // A valid header for the wrong collective is a program error (the ranks
    // left SPMD order); an unknown op is garbage.
    if (h.op < Op::kHello || h.op > Op::kAbort) return DataLoss(m.str());
    return Internal(m.str());
  }
  payload->resize(h.len);
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, payload->data(), payload->size(), deadline, from));
  if (Checksum64(payload->data(), payload->size()) != h.sum)
    return DataLoss("payload checksum mismatch in " + std::string(OpName(h.op)) + " from " + from);
  return Status::Ok();
}

class TcpComm final : public StepComm {
 public:
  // peers: on rank 0, index r holds rank r's socket (index 0 unused); on
  // other ranks, index 0 holds the socket to rank 0.
  TcpComm(const TcpCommOptions& o, std::vector<UniqueFd> peers)
      : rank_(o.rank), size_(o.size), step_timeout_(o.step_timeout), peers_(std::move(peers)) {}
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

  Status Broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size_)
      return InvalidArgument("Broadcast root " + std::to_string(root) + " out of [0, " + std::to_string(size_) + ")");
    if (size_ == 1) return Status::Ok();
    KVMESH_RETURN_IF_ERROR(broken_);
    Header h{Op::kBroadcast, static_cast<uint16_t>(root), ++seq_, 0, 0};
    const size_t n = data.size();
    if (rank_ == 0) {
      const auto deadline = Clock::now() + step_timeout_;
      for (int r = 1; r < size_; ++r) {  // the root's data; from the others, their arrival
        h.len = r == root ? n : 0;
        KVMESH_RETURN_IF_ERROR(Check(RecvFrame(fd(r), h, &in_, deadline, RankName(r))));
        if (r == root && n > 0) std::memcpy(data.data(), in_.data(), n);
      }
      const auto send_deadline = Clock::now() + step_timeout_;
      for (int r = 1; r < size_; ++r) {
        std::span<const std::byte> out = r == root ? std::span<const std::byte>() : data;
        KVMESH_RETURN_IF_ERROR(Check(SendFrame(fd(r), h, out, send_deadline, RankName(r))));
      }
      return Status::Ok();
    }
    const bool mine = rank_ == root;
    KVMESH_RETURN_IF_ERROR(Check(SendToRoot(h, mine ? std::span<const std::byte>(data) : std::span<const std::byte>())));
    h.len = mine ? 0 : n;
    KVMESH_RETURN_IF_ERROR(Check(RecvFrame(fd(0), h, &in_, PeerDeadline(), RankName(0))));
    if (!mine && n > 0) std::memcpy(data.data(), in_.data(), n);
    return Status::Ok();
  }

  Status Barrier() override {
    if (size_ == 1) return Status::Ok();
    std::span<std::byte> none;
    return Exchange(Op::kBarrier, none, [](std::span<const std::byte>) {});
  }

 private:
  int fd(int r) const { return peers_[static_cast<size_t>(r)].get(); }

  Clock::time_point PeerDeadline() const {
    // A non-root rank waits a grace period longer than rank 0, so that when a
    // third rank stalls, rank 0's abort (naming it) arrives before this
    // rank's own timer fires.
    const auto grace = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(500), step_timeout_ / 4);
    return Clock::now() + step_timeout_ + grace;
  }

  template <typename T, typename F>
  Status Reduce(Op op, std::span<T> data, F f) {
    if (size_ == 1) return Status::Ok();
    auto bytes = std::as_writable_bytes(data);
    // Rank 0 folds each rank's data into its own, in rank order: the same
    // additions in the same order as the thread backend.
    return Exchange(op, bytes, [&](std::span<const std::byte> in) {
      const T* x = reinterpret_cast<const T*>(in.data());
      for (size_t i = 0; i < data.size(); ++i) data[i] = f(data[i], x[i]);
    });
  }

  // Gather `data` to rank 0 (fold called with ranks 1.. in order, after
  // rank 0's data is already in place), then rank 0's result to every rank.
  template <typename Fold>
  Status Exchange(Op op, std::span<std::byte> data, Fold fold) {
    KVMESH_RETURN_IF_ERROR(broken_);
    Header h{op, 0, ++seq_, data.size(), 0};
    if (rank_ == 0) {
      const auto deadline = Clock::now() + step_timeout_;
      for (int r = 1; r < size_; ++r) {
        KVMESH_RETURN_IF_ERROR(Check(RecvFrame(fd(r), h, &in_, deadline, RankName(r))));
        fold(in_);
      }
      const auto send_deadline = Clock::now() + step_timeout_;
      for (int r = 1; r < size_; ++r)
        KVMESH_RETURN_IF_ERROR(Check(SendFrame(fd(r), h, data, send_deadline, RankName(r))));
      return Status::Ok();
    }
    KVMESH_RETURN_IF_ERROR(Check(SendToRoot(h, data)));
    KVMESH_RETURN_IF_ERROR(Check(RecvFrame(fd(0), h, &in_, PeerDeadline(), RankName(0))));
    if (!data.empty()) std::memcpy(data.data(), in_.data(), data.size());  // output only on success
    return Status::Ok();
  }

  // A non-root rank whose send failed: rank 0 may have aborted the step and
  // closed; its abort frame (the reason) may still be waiting to be read.
  Status SendToRoot(const Header& h, std::span<const std::byte> data) {
    Status s = SendFrame(fd(0), h, data, Clock::now() + step_timeout_, RankName(0));
    if (s.ok()) return s;
    std::vector<std::byte> none;
    Status why = RecvFrame(fd(0), Header{Op::kAbort, 0, 0, 0, 0}, &none,
                           Clock::now() + std::chrono::milliseconds(100), RankName(0));
    return why.message().find("aborted") != std::string::npos ? why : s;
  }

  // On failure the group is finished: rank 0 tells every rank why, all
  // sockets close, and the error sticks.
  Status Check(Status s) {
    if (s.ok()) return s;
    s = s.WithContext("tcp step #" + std::to_string(seq_) + " on rank " + std::to_string(rank_));
    if (rank_ == 0) {
      std::string why = s.ToString().substr(0, kMaxAbortBytes);
      Header h{Op::kAbort, static_cast<uint16_t>(s.code()), seq_, 0, 0};
      const auto deadline = Clock::now() + std::chrono::milliseconds(200);
      for (int r = 1; r < size_; ++r) {
        if (!peers_[r].valid()) continue;
        // Drain what the peer already sent, so that closing sends FIN after
        // the abort frame rather than a reset that could discard it.
        char sink[65536];
        for (int i = 0; i < 1024 && ::recv(fd(r), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
        }
        (void)SendFrame(fd(r), h, std::as_bytes(std::span(why.data(), why.size())), deadline, RankName(r));
      }
    }
    for (auto& p : peers_) p.reset();
    broken_ = s;
    return s;
  }

  const int rank_, size_;
  const std::chrono::milliseconds step_timeout_;
  std::vector<UniqueFd> peers_;
  uint64_t seq_ = 0;
  Status broken_;
  std::vector<std::byte> in_;  // receive scratch, reused
};

// ---- Rendezvous ---------------------------------------------------------------

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

Result<std::unique_ptr<StepComm>> Listen(const TcpCommOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  sockaddr_in sa{};
  KVMESH_RETURN_IF_ERROR(ResolveIpv4(o.host, o.port, &sa));
  UniqueFd ls(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!ls.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const std::string want = o.host + ":" + std::to_string(o.port);
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return Unavailable("tcp step rendezvous: bind " + want + ": " + std::strerror(errno));
  if (::listen(ls.get(), o.size + 8) != 0) return ErrnoStatus("listen " + want, errno);
  socklen_t len = sizeof sa;
  ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&sa), &len);
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
  int joined = 1;
  while (joined < o.size) {
    pollfd p{ls.get(), POLLIN, 0};
    const int left = MsLeft(deadline);
    if (left == 0 || ::poll(&p, 1, left) == 0) {
      std::string missing;
      for (int r = 1; r < o.size; ++r)
        if (!peers[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      Status s = DeadlineExceeded("tcp step rendezvous on " + addr + ": " + std::to_string(joined) + " of " +
                              std::to_string(o.size) + " ranks joined within " +
                              std::to_string(o.connect_timeout.count()) + " ms (missing: " + missing + ")");
      const std::string why = s.ToString();
      for (int r = 1; r < o.size; ++r)  // tell the ranks that did join
        if (peers[r].valid())
          (void)SendFrame(peers[r].get(), Header{Op::kAbort, static_cast<uint16_t>(s.code()), 0, 0, 0},
                          std::as_bytes(std::span(why.data(), why.size())),
                          Clock::now() + std::chrono::milliseconds(200), RankName(r));
      return s;
    }
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) continue;
    SetNoDelay(c.get());
    // A hello must follow the connect at once; a silent or foreign
    // connection is dropped without failing the rendezvous.
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    std::vector<std::byte> hello;
    Status s = RecvFrame(c.get(), Header{Op::kHello, 0, 0, 8, 0}, &hello, hello_deadline, "a joining rank");
    if (!s.ok()) continue;
    const int r = static_cast<int>(Get(&hello[0], 4));
    const int n = static_cast<int>(Get(&hello[4], 4));
    std::string refuse;
    if (n != o.size) refuse = "world size " + std::to_string(n) + " differs from rank 0's " + std::to_string(o.size);
    else if (r < 1 || r >= o.size) refuse = "rank " + std::to_string(r) + " out of [1, " + std::to_string(o.size) + ")";
    else if (peers[r].valid()) refuse = "rank " + std::to_string(r) + " has already joined";
    if (!refuse.empty()) {
      Header a{Op::kAbort, static_cast<uint16_t>(StatusCode::kInvalidArgument), 0, 0, 0};
      (void)SendFrame(c.get(), a, std::as_bytes(std::span(refuse.data(), refuse.size())),
                      Clock::now() + std::chrono::milliseconds(200), "a joining rank");
      continue;
    }
    peers[r] = std::move(c);
    ++joined;
  }
  for (int r = 1; r < o.size; ++r)
    KVMESH_RETURN_IF_ERROR(SendFrame(peers[r].get(), Header{Op::kWelcome, 0, 0, 0, 0}, {}, deadline, RankName(r)));
  return std::unique_ptr<StepComm>(new TcpComm(o, std::move(peers)));
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
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      Status s = SplitHostPort(addr, &host, &port);
      if (!s.ok()) return s.WithContext("rendezvous file " + o.rendezvous_file);
    }
    auto r = ConnectTcp(host, port, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
    if (!r.ok()) {  // rank 0 not listening yet (or a stale file): retry
      last = r.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    c = std::move(*r);
    addr = host + ":" + std::to_string(port);
  }
  SetNoDelay(c.get());
  std::array<std::byte, 8> hello;
  Put(&hello[0], static_cast<uint32_t>(o.rank), 4);
  Put(&hello[4], static_cast<uint32_t>(o.size), 4);
  KVMESH_RETURN_IF_ERROR(SendFrame(c.get(), Header{Op::kHello, 0, 0, 0, 0}, hello, deadline, "rank 0 at " + addr));
  std::vector<std::byte> none;
  Status s = RecvFrame(c.get(), Header{Op::kWelcome, 0, 0, 0, 0}, &none, deadline, "rank 0 at " + addr);
  if (!s.ok()) return s.WithContext("tcp step rendezvous, rank " + std::to_string(o.rank));
  std::vector<UniqueFd> peers;
  peers.push_back(std::move(c));
  return std::unique_ptr<StepComm>(new TcpComm(o, std::move(peers)));
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
