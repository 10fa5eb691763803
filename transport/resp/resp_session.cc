#include "transport/resp/resp_session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kFlushBytes = 8u << 20;  // answer what we have past this, then parse on

std::vector<asio::const_buffer> Buffers(const RespReply& r) {
  std::vector<asio::const_buffer> b;
  b.reserve(r.pieces().size());
  for (auto p : r.pieces()) b.emplace_back(p.data(), p.size());
  return b;
}

// The commands of one connection over a plain or a TLS stream.
template <typename Stream>
asio::awaitable<void> Serve(Stream& s, const RespCommands* commands, RespSyncBackend* backend,
                            const RespConnectionOptions& o) {
  boost::system::error_code ec;
  const size_t max_buf = o.max_bulk_bytes + kRespMaxInline + 64;
  std::vector<char> buf(64 << 10);
  size_t filled = 0;
  RespSessionState state;
  state.id = commands->NextClientId();
  RespCommand args;
  bool quit = false;
  bool need_read = true;
  auto run_io = [backend, &state](std::span<BlockIo> ios) { backend->Run(state.identity, ios); };
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
    // Each command runs as it is parsed: the store answers at once.
    for (;;) {
      size_t used = 0;
      RespParse p = ParseRespCommand(std::string_view(buf.data() + pos, filled - pos), o.max_bulk_bytes, &args, &used,
                                     &err);
      if (p == RespParse::kNeedMore) break;
      if (p == RespParse::kError) {
        error = true;
        break;
      }
      pos += used;
      if (args.empty()) continue;
      std::unique_ptr<RespOp> op = commands->Compile(args, &state, &quit);
      RunRespOpSync(*op, commands->Env(), run_io);
      op->Answer(&out);
      if (quit) break;
      if (out.bytes() > kFlushBytes) {
        need_read = false;
        break;
      }
    }
    if (error) out.Err("ERR Protocol error: " + err);
    if (!out.empty()) {
      co_await asio::async_write(s, Buffers(out), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
    }
    if (error) break;
    // Keep the unparsed tail (the answers, which may borrow from it, are written).
    std::memmove(buf.data(), buf.data() + pos, filled - pos);
    filled -= pos;
  }
}

}  // namespace

asio::awaitable<void> ServeRespConnection(tcp::socket s, const RespCommands* commands, RespSyncBackend* backend,
                                          RespConnectionOptions o) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  if (!o.tls) {
    co_await Serve(s, commands, backend, o);
  } else {
    asio::ssl::stream<tcp::socket&> tls(s, *o.tls);
    // A client that never finishes its handshake is dropped after 10 s.
    asio::steady_timer timer(s.get_executor());
    timer.expires_after(std::chrono::seconds(10));
    timer.async_wait([&s](boost::system::error_code e) {
      if (!e) s.cancel();
    });
    co_await tls.async_handshake(asio::ssl::stream_base::server, asio::redirect_error(asio::use_awaitable, ec));
    timer.cancel();
    if (ec) {
      if (o.tls_failures) o.tls_failures->fetch_add(1, std::memory_order_relaxed);
    } else {
      co_await Serve(tls, commands, backend, o);
    }
  }
  s.shutdown(tcp::socket::shutdown_both, ec);
  s.close(ec);
}

}  // namespace kvmesh
