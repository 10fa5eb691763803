#include "shard_node/server/resp_session.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kFlushBytes = 8u << 20;        // answer what we have past this, then parse on
constexpr size_t kMaxRunCommands = 256;         // commands per offloaded run
constexpr uint64_t kMaxRunReadBytes = 64u << 20;  // GET keys x value bound per offloaded run

// Runs on a worker; its parameters live in this coroutine's frame.
asio::awaitable<bool> RunOnWorker(RespCommands* commands, std::span<const RespCommand> run, RespReply* out) {
  co_return commands->Run(run, out);
}

// Keys a command reads (GET, MGET): sizes an offloaded run's answer.
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

}  // namespace

asio::awaitable<void> ServeRespConnection(tcp::socket s, RespCommands* commands, RespConnectionOptions o) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  const size_t max_buf = o.max_bulk_bytes + kRespMaxInline + 64;
  std::vector<char> buf(64 << 10);
  size_t filled = 0;
  std::vector<RespCommand> run;  // reused: the parsed commands of one offloaded run
  size_t n_run = 0;
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
    n_run = 0;
    uint64_t run_read_bytes = 0;
    for (;;) {
      if (run.size() <= n_run) run.resize(n_run + 1);
      RespCommand& args = run[n_run];
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
      if (o.workers == nullptr) {  // inline: run it now
        if (!commands->Run(std::span<const RespCommand>(&args, 1), &out)) {
          quit = true;
          break;
        }
        if (out.bytes() > kFlushBytes) {
          need_read = false;
          break;
        }
        continue;
      }
      ++n_run;
      run_read_bytes += ReadKeys(args) * o.max_value_bytes;
      if (n_run >= kMaxRunCommands || run_read_bytes >= kMaxRunReadBytes) {
        need_read = false;  // run these, then parse the rest
        break;
      }
    }
    if (n_run > 0) {
      // The run's args point into buf, untouched until the run is answered.
      quit = !co_await asio::co_spawn(*o.workers, RunOnWorker(commands, std::span<const RespCommand>(run.data(), n_run), &out),
                                      asio::use_awaitable);
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

}  // namespace kvmesh
