#include "transport/resp/resp_session.h"

#include <algorithm>
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

}  // namespace

asio::awaitable<void> ServeRespConnection(tcp::socket s, const RespCommands* commands, RespSyncBackend* backend,
                                          RespConnectionOptions o) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  const size_t max_buf = o.max_bulk_bytes + kRespMaxInline + 64;
  std::vector<char> buf(64 << 10);
  size_t filled = 0;
  RespSessionState state;
  state.id = commands->NextClientId();
  RespCommand args;
  bool quit = false;
  bool need_read = true;
  auto run_io = [backend](std::span<BlockIo> ios) { backend->Run(ios); };
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
  s.shutdown(tcp::socket::shutdown_both, ec);
  s.close(ec);
}

}  // namespace kvmesh
