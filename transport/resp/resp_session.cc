#include "transport/resp/resp_session.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kFlushBytes = 8u << 20;        // answer what we have past this, then parse on
constexpr size_t kMaxRunCommands = 256;         // commands per run (offloaded or on a connection thread)
constexpr uint64_t kMaxRunReadBytes = 64u << 20;  // GET keys x value bound per run

// Runs on a worker; its parameters live in this coroutine's frame.
asio::awaitable<bool> RunOnWorker(RespCommands* commands, std::span<const RespCommand> run, RespReply* out) {
  co_return commands->Run(run, out);
}

// Keys a command reads (GET, MGET): sizes a run's answer.
size_t ReadKeys(const RespCommand& c) {
  if (c.empty()) return 0;
  auto up = [](std::string_view s) {
    std::string u(s.substr(0, 8));
    for (char& ch : u) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return u;
  };
  std::string name = up(c[0]);
  return name == "GET" || name == "MGET" ? c.size() - 1 : 0;
}

std::vector<asio::const_buffer> Buffers(const RespReply& r) {
  std::vector<asio::const_buffer> b;
  b.reserve(r.pieces().size());
  for (auto p : r.pieces()) b.emplace_back(p.data(), p.size());
  return b;
}

// A run of commands parsed from the front of a connection's input.
struct ParsedRun {
  size_t used = 0;   // input bytes the run (and blank lines) took
  size_t n = 0;      // commands in run[0, n)
  bool full = false; // stopped at a run limit: more input may be parsed without reading
  bool error = false;
  std::string err;   // why, when error
};

// Parses commands from `in` into (*run)[0, n) until the input runs out, a run
// limit (kMaxRunCommands, kMaxRunReadBytes) is reached or a protocol error.
// The commands point into `in`.
ParsedRun ParseRun(std::string_view in, const RespConnectionOptions& o, std::vector<RespCommand>* run) {
  ParsedRun r;
  uint64_t read_bytes = 0;
  for (;;) {
    if (run->size() <= r.n) run->resize(r.n + 1);
    RespCommand& args = (*run)[r.n];
    size_t used = 0;
    RespParse p = ParseRespCommand(in.substr(r.used), o.max_bulk_bytes, &args, &used, &r.err);
    if (p == RespParse::kNeedMore) break;
    if (p == RespParse::kError) {
      r.error = true;
      break;
    }
    r.used += used;
    if (args.empty()) continue;
    ++r.n;
    read_bytes += ReadKeys(args) * o.max_value_bytes;
    if (r.n >= kMaxRunCommands || read_bytes >= kMaxRunReadBytes) {
      r.full = true;
      break;
    }
  }
  return r;
}

// Writes every piece of `r` to the blocking socket fd; false when the peer is gone
// (or the socket was shut down to stop this connection).
bool WriteReply(int fd, const RespReply& r) {
  std::vector<iovec> iov;
  iov.reserve(r.pieces().size());
  for (auto p : r.pieces())
    if (!p.empty()) iov.push_back({const_cast<char*>(p.data()), p.size()});
  size_t at = 0;
  while (at < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + at;
    m.msg_iovlen = std::min<size_t>(iov.size() - at, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (at < iov.size() && left >= iov[at].iov_len) left -= iov[at++].iov_len;
    if (left > 0) {
      iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
  return true;
}

}  // namespace

asio::awaitable<void> ServeRespConnection(tcp::socket s, RespCommands* commands, RespConnectionOptions o) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  const size_t max_buf = o.max_bulk_bytes + kRespMaxInline + 64;
  std::vector<char> buf(64 << 10);
  size_t filled = 0;
  std::vector<RespCommand> run;  // reused: the parsed commands of one offloaded run
  bool quit = false;
  bool need_read = true;
  while (!quit) {
    if (need_read) {
      if (filled == buf.size()) {
        if (buf.size() >= max_buf) break;  // cannot be a valid command
        buf.resize(std::min(buf.size() * 2, max_buf));
      }
      size_t n = co_await s.async_read_some(asio::buffer(buf.data() + filled, buf.size() - filled),
                                            asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      filled += n;
    }
    RespReply out;
    size_t pos = 0;
    bool error = false;
    std::string err;
    need_read = true;
    if (o.workers == nullptr) {  // inline: run each command as it is parsed
      if (run.empty()) run.resize(1);
      RespCommand& args = run[0];
      for (;;) {
        size_t used = 0;
        RespParse p = ParseRespCommand(std::string_view(buf.data() + pos, filled - pos), o.max_bulk_bytes, &args,
                                       &used, &err);
        if (p == RespParse::kNeedMore) break;
        if (p == RespParse::kError) {
          error = true;
          break;
        }
        pos += used;
        if (args.empty()) continue;
        if (!commands->Run(std::span<const RespCommand>(&args, 1), &out)) {
          quit = true;
          break;
        }
        if (out.bytes() > kFlushBytes) {
          need_read = false;
          break;
        }
      }
    } else {  // offloaded: parse a run, then run it on a worker
      ParsedRun pr = ParseRun(std::string_view(buf.data(), filled), o, &run);
      pos = pr.used, error = pr.error, err = std::move(pr.err), need_read = !pr.full;
      if (pr.n > 0) {
        // The run's args point into buf, untouched until the run is answered.
        quit = !co_await asio::co_spawn(*o.workers, RunOnWorker(commands, std::span<const RespCommand>(run.data(), pr.n), &out),
                                        asio::use_awaitable);
      }
    }
    if (error) out.Err("ERR Protocol error: " + err);
    if (!out.empty()) {
      co_await asio::async_write(s, Buffers(out), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
    }
    if (error) break;
    // Keep the unparsed tail (no args reference it: the answers are written).
    std::memmove(buf.data(), buf.data() + pos, filled - pos);
    filled -= pos;
  }
  s.shutdown(tcp::socket::shutdown_both, ec);
  s.close(ec);
}

void ServeRespConnectionBlocking(int fd, RespCommands* commands, const RespConnectionOptions& o) {
  const size_t max_buf = o.max_bulk_bytes + kRespMaxInline + 64;
  std::vector<char> buf(64 << 10);
  size_t filled = 0;
  std::vector<RespCommand> run;  // reused: the parsed commands of one run
  bool need_read = true;
  for (;;) {
    if (need_read) {
      if (filled == buf.size()) {
        if (buf.size() >= max_buf) return;  // cannot be a valid command
        buf.resize(std::min(buf.size() * 2, max_buf));
      }
      ssize_t n = ::recv(fd, buf.data() + filled, buf.size() - filled, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // closed, reset, or shut down by Stop
      filled += static_cast<size_t>(n);
    }
    // A pipelined run: everything that has arrived, up to the run limits, as
    // one RespCommands::Run here (consecutive GETs/SETs: one router batch).
    ParsedRun pr = ParseRun(std::string_view(buf.data(), filled), o, &run);
    need_read = !pr.full;
    RespReply out;
    bool quit = false;
    if (pr.n > 0) quit = !commands->Run(std::span<const RespCommand>(run.data(), pr.n), &out);
    if (pr.error) out.Err("ERR Protocol error: " + pr.err);
    if (!out.empty() && !WriteReply(fd, out)) return;
    if (quit || pr.error) return;
    // Keep the unparsed tail (no args reference it: the answers are written).
    std::memmove(buf.data(), buf.data() + pr.used, filled - pr.used);
    filled -= pr.used;
  }
}

}  // namespace kvmesh
