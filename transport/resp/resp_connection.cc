#include "transport/resp/resp_connection.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// Writes `r` (TLS: small pieces merged into records), closed by the watch
// when the client does not take it within the write timeout.
template <typename Stream>
asio::awaitable<void> WriteReply(Stream& s, const RespReply& r, ConnectionWatch& watch, boost::system::error_code& ec) {
  std::vector<asio::const_buffer> bufs;
  bufs.reserve(r.pieces().size());
  for (auto p : r.pieces()) bufs.emplace_back(p.data(), p.size());
  if constexpr (std::is_same_v<Stream, tcp::socket>) {
    co_await WatchedWrite(s, bufs, watch, ec);  // at once when the socket takes it all
  } else {
    std::string stage;
    std::vector<asio::const_buffer> merged = CoalesceForTls(bufs, &stage);
    co_await WatchedWrite(s, merged, watch, ec);
  }
}

template <typename Stream>
class Connection final : public RespConnection {
 public:
  Connection(Stream& s, ConnectionWatch& watch, RespRunner& runner) : RespConnection(watch), s_(s), runner_(runner) {}

  asio::awaitable<bool> Flush() override {
    boost::system::error_code ec;
    co_await WriteReply(s_, out, watch, ec);
    out = RespReply();
    runner_.Written(*this);
    co_return !ec;
  }

 private:
  Stream& s_;
  RespRunner& runner_;
};

}  // namespace

template <typename Stream>
asio::awaitable<void> ServeRespCommands(Stream& s, ConnectionWatch& watch, const RespCommands& commands,
                                        const RespLoopOptions& o, RespRunner& runner) {
  boost::system::error_code ec;
  Connection<Stream> c(s, watch, runner);
  c.flush_bytes = o.flush_bytes;
  c.state.id = commands.NextClientId();
  const RespFrontOptions& fo = commands.options();
  const bool needs_auth = fo.auth && fo.auth->required();
  if (!needs_auth) watch.Authenticated();
  auto authed = [&] { return !needs_auth || c.state.authenticated; };
  RespReadBuffer buf;
  size_t filled = 0;
  RespCommandParser parser;
  std::vector<RespCommand> cmds;  // grows with the pipeline, up to max_run; kept for the connection
  bool need_read = true;
  while (!c.quit) {
    if (need_read) {
      const size_t max_buf = authed() ? o.max_bulk + kRespMaxInline + 64 : o.preauth;
      if (!buf.MakeRoom(filled, authed() ? o.first_read_bytes : o.preauth_read_bytes, parser.wanted(), max_buf)) {
        if (!authed()) {  // cannot be a valid command (before AUTH: larger than it may be)
          c.out = RespReply();
          c.out.Err("ERR Protocol error: command longer than " + std::to_string(o.preauth) + " bytes before AUTH");
          co_await c.Flush();
        }
        break;
      }
      if (filled > 0) watch.Reading();  // a command has begun: it must keep arriving
      else watch.Idle();
      const size_t n = co_await s.async_read_some(asio::buffer(buf.data() + filled, buf.capacity() - filled),
                                                  asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      filled += n;
      // A read that filled the buffer: the client pipelines more than it
      // holds. Grow it so that one run takes the whole pipeline, not a
      // buffer's worth of it.
      if (filled == buf.capacity() && buf.capacity() < o.grow_read_bytes && authed())
        buf.Resize(std::min(buf.capacity() * 2, o.grow_read_bytes), filled);
    }
    // Parse what has arrived (up to max_run commands; one at a time before
    // AUTH, so that what follows it is read with the limits it lifts).
    const bool was_authed = authed();
    const size_t max_cmds = was_authed ? std::max<size_t>(1, o.max_run) : 1;
    size_t used = 0, n = 0;
    bool error = false;
    std::string err;
    while (n < max_cmds) {
      if (n == cmds.size()) cmds.emplace_back();
      size_t u = 0;
      const RespParse p = parser.Parse(std::string_view(buf.data() + used, filled - used),
                                       was_authed ? o.max_bulk : o.preauth, &cmds[n], &u, &err);
      if (p == RespParse::kNeedMore) break;
      if (p == RespParse::kError) {
        if (!was_authed) err += " (at most " + std::to_string(o.preauth) + " bytes before AUTH)";
        error = true;
        break;
      }
      used += u;
      if (!cmds[n].empty()) ++n;
    }
    need_read = n < max_cmds;
    if (n > 0 && !co_await runner.Run(std::span<const RespCommand>(cmds.data(), n), c)) break;
    if (!was_authed && authed()) watch.Authenticated();
    if (error) c.out.Err("ERR Protocol error: " + err);
    if (!c.out.empty() && !co_await c.Flush()) break;
    if (error) break;
    // Keep the unparsed tail (the answers, which may borrow from the buffer, are written).
    if (used > 0) {
      std::memmove(buf.data(), buf.data() + used, filled - used);
      filled -= used;
    }
    if (filled == 0 && buf.capacity() > o.keep_read_bytes) buf.Resize(o.first_read_bytes, 0);  // after one large command
  }
}

template asio::awaitable<void> ServeRespCommands(tcp::socket&, ConnectionWatch&, const RespCommands&,
                                                 const RespLoopOptions&, RespRunner&);
template asio::awaitable<void> ServeRespCommands(asio::ssl::stream<tcp::socket&>&, ConnectionWatch&,
                                                 const RespCommands&, const RespLoopOptions&, RespRunner&);

}  // namespace kvmesh
