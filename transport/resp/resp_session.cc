#include "transport/resp/resp_session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kFlushBytes = 8u << 20;        // answer what we have past this (or the limit), then parse on
constexpr size_t kFirstReadBytes = 64u << 10;   // an authenticated connection's read buffer at first
constexpr size_t kPreauthReadBytes = 4u << 10;  // one that has not authenticated yet
constexpr size_t kKeepReadBytes = 1u << 20;     // a buffer grown past this for one command shrinks back once empty

std::vector<asio::const_buffer> Buffers(const RespReply& r) {
  std::vector<asio::const_buffer> b;
  b.reserve(r.pieces().size());
  for (auto p : r.pieces()) b.emplace_back(p.data(), p.size());
  return b;
}

// Writes `out` (TLS: small pieces merged into records), closed by the watch
// when the client does not take it within the write timeout.
template <typename Stream>
asio::awaitable<void> WriteOut(Stream& s, const RespReply& out, ConnectionWatch& watch, boost::system::error_code& ec) {
  std::vector<asio::const_buffer> bufs = Buffers(out);
  if constexpr (std::is_same_v<Stream, tcp::socket>) {
    co_await WatchedWrite(s, bufs, watch, ec);
  } else {
    std::string stage;
    std::vector<asio::const_buffer> merged = CoalesceForTls(bufs, &stage);
    co_await WatchedWrite(s, merged, watch, ec);
  }
}

// The commands of one connection over a plain or a TLS stream.
template <typename Stream>
asio::awaitable<void> Serve(Stream& s, const RespCommands* commands, RespSyncBackend* backend,
                            const RespConnectionOptions& o, ConnectionWatch& watch) {
  boost::system::error_code ec;
  const RespFrontOptions& fo = commands->options();
  const bool needs_auth = fo.auth && fo.auth->required();
  const uint64_t preauth = RespPreauthBytes(o.limits, o.max_bulk_bytes);
  const uint64_t flush_bytes = std::min<uint64_t>(kFlushBytes, o.limits.max_pending_answer_bytes);
  RespSessionState state;
  state.id = commands->NextClientId();
  if (!needs_auth) watch.Authenticated();
  auto authed = [&] { return !needs_auth || state.authenticated; };
  RespReadBuffer buf;
  size_t filled = 0;
  RespCommandParser parser;
  RespCommand args;
  bool quit = false;
  bool need_read = true;
  uint64_t held = 0;  // bytes the answers in `out` keep beyond their values (pinned chunks)
  auto run_io = [backend, &state, &held](std::span<BlockIo> ios) { backend->Run(state.identity, ios, &held); };
  while (!quit) {
    if (need_read) {
      const size_t max_buf = authed() ? o.max_bulk_bytes + kRespMaxInline + 64 : preauth;
      if (!buf.MakeRoom(filled, authed() ? kFirstReadBytes : kPreauthReadBytes, parser.wanted(), max_buf)) {
        if (!authed()) {  // cannot be a valid command (before AUTH: larger than it may be)
          RespReply out;
          out.Err("ERR Protocol error: command longer than " + std::to_string(preauth) + " bytes before AUTH");
          co_await WriteOut(s, out, watch, ec);
        }
        break;
      }
      if (filled > 0) watch.Reading();  // a command has begun: it must keep arriving
      else watch.Idle();
      const size_t n = co_await s.async_read_some(asio::buffer(buf.data() + filled, buf.capacity() - filled),
                                                  asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      filled += n;
    }
    RespReply out;
    size_t pos = 0;
    bool error = false;
    std::string err;
    need_read = true;
    // Each command runs as it is parsed: the store answers at once.
    for (;;) {
      const bool was_authed = authed();
      size_t used = 0;
      const RespParse p = parser.Parse(std::string_view(buf.data() + pos, filled - pos),
                                       was_authed ? o.max_bulk_bytes : preauth, &args, &used, &err);
      if (p == RespParse::kNeedMore) break;
      if (p == RespParse::kError) {
        if (!was_authed) err += " (at most " + std::to_string(preauth) + " bytes before AUTH)";
        error = true;
        break;
      }
      pos += used;
      if (args.empty()) continue;
      std::unique_ptr<RespOp> op = commands->Compile(args, &state, &quit);
      RunRespOpSync(*op, commands->Env(), run_io);
      op->Answer(&out);
      if (!was_authed && authed()) watch.Authenticated();
      if (quit) break;
      if (out.bytes() + held > flush_bytes) {  // bounded: answer these first, read nothing more meanwhile
        need_read = false;
        break;
      }
    }
    if (error) out.Err("ERR Protocol error: " + err);
    if (!out.empty()) {
      co_await WriteOut(s, out, watch, ec);
      if (ec) break;
    }
    held = 0;
    if (error) break;
    // Keep the unparsed tail (the answers, which may borrow from it, are written).
    if (pos > 0) {
      std::memmove(buf.data(), buf.data() + pos, filled - pos);
      filled -= pos;
    }
    if (filled == 0 && buf.capacity() > kKeepReadBytes) buf.Resize(kFirstReadBytes, 0);
  }
}

}  // namespace

void RespRefuseConnection(tcp::socket& s) {
  static constexpr char kMsg[] = "-ERR max number of clients reached\r\n";
  boost::system::error_code ec;
  s.non_blocking(true, ec);
  s.write_some(asio::buffer(kMsg, sizeof(kMsg) - 1), ec);
}

asio::awaitable<void> ServeRespConnection(tcp::socket s, const RespCommands* commands, RespSyncBackend* backend,
                                          RespConnectionOptions o) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  {
    // The TLS handshake and AUTH within handshake_timeout_ms, a command begun
    // within read_timeout_ms, answers taken within write_timeout_ms.
    ConnectionWatch watch(s, o.limits, o.timeouts);
    if (!o.tls) {
      s.non_blocking(true, ec);  // WatchedWrite writes at once when the socket takes it
      co_await Serve(s, commands, backend, o, watch);
    } else {
      asio::ssl::stream<tcp::socket&> tls(s, *o.tls);
      co_await tls.async_handshake(asio::ssl::stream_base::server, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (o.tls_failures) o.tls_failures->fetch_add(1, std::memory_order_relaxed);
      } else {
        co_await Serve(tls, commands, backend, o, watch);
      }
    }
  }
  s.shutdown(tcp::socket::shutdown_both, ec);
  s.close(ec);
}

}  // namespace kvmesh
