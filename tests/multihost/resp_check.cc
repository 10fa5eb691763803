#include "resp_check.h"

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "transport/socket_util.h"

namespace kvmesh::multihost {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kValueBytes = 16 << 10;
constexpr uint32_t kKeys = 4096;

struct Reply {
  char type = 0;  // + - : $ *
  std::string str;
  bool nil = false;
  std::vector<Reply> items;
};

// One RESP connection with a read buffer; every read is bounded by a deadline.
class Conn {
 public:
  Status Open(const std::string& host, uint16_t port) {
    auto fd = ConnectTcp(host, port, Clock::now() + std::chrono::seconds(2));
    if (!fd.ok()) return fd.status();
    fd_ = std::move(*fd);
    SetNoDelay(fd_.get());
    buf_.clear();
    pos_ = 0;
    return Status::Ok();
  }
  bool open() const { return fd_.valid(); }
  void Close() { fd_.reset(); }

  Status Send(const std::string& s, Clock::time_point deadline) { return WriteAll(fd_.get(), s.data(), s.size(), deadline); }

  Result<Reply> Read(Clock::time_point deadline) {
    KVMESH_ASSIGN_OR_RETURN(std::string line, Line(deadline));
    if (line.empty()) return DataLoss("empty RESP reply line");
    Reply r;
    r.type = line[0];
    const std::string rest = line.substr(1);
    switch (r.type) {
      case '+':
      case '-':
      case ':':
        r.str = rest;
        return r;
      case '$': {
        const long n = std::strtol(rest.c_str(), nullptr, 10);
        if (n < 0) {
          r.nil = true;
          return r;
        }
        KVMESH_RETURN_IF_ERROR(Need(static_cast<size_t>(n) + 2, deadline));
        r.str.assign(buf_, pos_, static_cast<size_t>(n));
        pos_ += static_cast<size_t>(n) + 2;
        return r;
      }
      case '*': {
        const long n = std::strtol(rest.c_str(), nullptr, 10);
        for (long i = 0; i < n; ++i) {
          KVMESH_ASSIGN_OR_RETURN(Reply item, Read(deadline));
          r.items.push_back(std::move(item));
        }
        return r;
      }
      default:
        return DataLoss("not a RESP reply: \"" + line.substr(0, 40) + "\"");
    }
  }

 private:
  Status Fill(Clock::time_point deadline) {
    if (pos_ > 0 && pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return DeadlineExceeded("RESP reply not in time");
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return DeadlineExceeded("RESP reply not in time");
    char tmp[64 << 10];
    const ssize_t n = ::recv(fd_.get(), tmp, sizeof(tmp), 0);
    if (n == 0) return Unavailable("proxy closed the connection");
    if (n < 0) return errno == EAGAIN || errno == EINTR ? Status::Ok() : Unavailable(std::strerror(errno));
    buf_.append(tmp, static_cast<size_t>(n));
    return Status::Ok();
  }
  Status Need(size_t n, Clock::time_point deadline) {
    while (buf_.size() - pos_ < n) KVMESH_RETURN_IF_ERROR(Fill(deadline));
    return Status::Ok();
  }
  Result<std::string> Line(Clock::time_point deadline) {
    for (;;) {
      const size_t e = buf_.find("\r\n", pos_);
      if (e != std::string::npos) {
        std::string l = buf_.substr(pos_, e - pos_);
        pos_ = e + 2;
        return l;
      }
      KVMESH_RETURN_IF_ERROR(Fill(deadline));
    }
  }

  UniqueFd fd_;
  std::string buf_;
  size_t pos_ = 0;
};

std::string Command(const std::vector<std::string>& args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) s += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return s;
}

std::string KeyName(uint32_t i) { return "mh:" + std::to_string(i); }

std::string Value(uint64_t seed, uint32_t i) {
  std::string v(kValueBytes, '\0');
  soak::Payload(BlockKey{soak::Mix(i ^ 0x5e7ull), soak::Mix(i ^ 0x6e7ull)}, seed,
                std::as_writable_bytes(std::span(v.data(), v.size())));
  return v;
}

}  // namespace

void RespWorker(soak::Context& c, const std::string& host, uint16_t port, uint32_t thread, RespCounters* rc) {
  std::mt19937_64 rng(c.o.seed * 31337 + thread);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  Conn conn;
  const auto bound = std::chrono::milliseconds(c.o.timeout_ms + c.o.timeout_margin_ms);
  auto pick = [&] { const double u = uni(rng); return static_cast<uint32_t>(kKeys * u * u); };
  // A value read back for key i: it is the only one i ever held, or a nil.
  auto check = [&](uint32_t i, const Reply& r) {
    if (r.type == '-') {
      rc->errors++;
      return;
    }
    if (r.type != '$') {
      c.inv.Violation("resp_protocol", "GET " + KeyName(i) + " answered type '" + std::string(1, r.type) + "'");
      return;
    }
    if (r.nil) {
      rc->nils++;
      return;
    }
    const std::string want = Value(c.o.seed, i);
    if (r.str != want) {
      rc->wrong_bytes += r.str.size();
      c.st.wrong_bytes++;
      c.inv.Violation("wrong_bytes", "GET " + KeyName(i) + " through the proxy returned " +
                                         std::to_string(r.str.size()) + " bytes that differ from what was set");
      return;
    }
    rc->values_ok++;
    rc->bytes_compared += want.size();
  };
  while (!c.stop.load()) {
    if (!conn.open()) {
      if (Status s = conn.Open(host, port); !s.ok()) {
        rc->reconnects++;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
    }
    const uint32_t op = static_cast<uint32_t>(rng() % 10);
    std::vector<uint32_t> keys;
    std::string cmd;
    size_t replies = 1;
    if (op < 3) {  // SET, then GET the same key back
      keys = {pick()};
      cmd = Command({"SET", KeyName(keys[0]), Value(c.o.seed, keys[0])}) + Command({"GET", KeyName(keys[0])});
      replies = 2;
    } else if (op < 8) {
      keys = {pick()};
      cmd = Command({"GET", KeyName(keys[0])});
    } else if (op < 9) {
      std::vector<std::string> args{"MSET"};
      for (int k = 0; k < 4; ++k) {
        keys.push_back(pick());
        args.push_back(KeyName(keys.back()));
        args.push_back(Value(c.o.seed, keys.back()));
      }
      cmd = Command(args);
      keys.clear();
    } else {
      std::vector<std::string> args{"MGET"};
      for (int k = 0; k < 4; ++k) {
        keys.push_back(pick());
        args.push_back(KeyName(keys.back()));
      }
      cmd = Command(args);
    }
    const auto t0 = Clock::now();
    const auto deadline = t0 + bound + std::chrono::seconds(5);
    Status s = conn.Send(cmd, deadline);
    std::vector<Reply> got;
    for (size_t i = 0; s.ok() && i < replies; ++i) {
      auto r = conn.Read(deadline);
      if (!r.ok()) s = r.status();
      else got.push_back(std::move(*r));
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    rc->commands += replies;
    uint64_t prev = rc->max_us.load();
    while (static_cast<uint64_t>(us) > prev && !rc->max_us.compare_exchange_weak(prev, static_cast<uint64_t>(us))) {
    }
    if (!s.ok()) {
      c.inv.Violation("resp_timeout", "proxy command: " + s.ToString());
      conn.Close();
      rc->reconnects++;
      continue;
    }
    if (us > std::chrono::duration_cast<std::chrono::microseconds>(bound).count())
      c.inv.Violation("resp_timeout", "a proxy command took " + std::to_string(us / 1000) + " ms");
    if (op < 3) {
      if (got[0].type == '-') rc->errors++;
      else if (got[0].type != '+') c.inv.Violation("resp_protocol", "SET answered type '" + std::string(1, got[0].type) + "'");
      check(keys[0], got[1]);
    } else if (op < 8) {
      check(keys[0], got[0]);
    } else if (op < 9) {
      if (got[0].type == '-') rc->errors++;
      else if (got[0].type != '+') c.inv.Violation("resp_protocol", "MSET answered type '" + std::string(1, got[0].type) + "'");
    } else if (got[0].type == '-') {
      rc->errors++;
    } else if (got[0].type != '*' || got[0].items.size() != keys.size()) {
      c.inv.Violation("resp_protocol", "MGET of 4 keys answered type '" + std::string(1, got[0].type) + "' with " +
                                           std::to_string(got[0].items.size()) + " items");
    } else {
      for (size_t k = 0; k < keys.size(); ++k) check(keys[k], got[0].items[k]);
    }
  }
}

}  // namespace kvmesh::multihost
