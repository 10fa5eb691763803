#include "transport/resp/resp_session.h"

#include <string>
#include <vector>

#include "transport/asio_tls.h"
#include "transport/resp/resp_connection.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// Each command runs as the loop hands it over: the store answers at once.
class SyncRunner final : public RespRunner {
 public:
  SyncRunner(const RespCommands* commands, RespSyncBackend* backend) : commands_(commands), backend_(backend) {}

  asio::awaitable<bool> Run(std::span<const RespCommand> cmds, RespConnection& c) override {
    auto run_io = [this, &c](std::span<BlockIo> ios) { backend_->Run(c.state.identity, ios, &held_); };
    for (const RespCommand& args : cmds) {
      std::unique_ptr<RespOp> op = commands_->Compile(args, &c.state, &c.quit);
      RunRespOpSync(*op, commands_->Env(), run_io);
      op->Answer(&c.out);
      if (c.quit) break;
      // Bounded: answer these first (counting the pinned chunks they keep).
      if (c.out.bytes() + held_ > c.flush_bytes && !co_await c.Flush()) co_return false;
    }
    co_return true;
  }
  void Written(RespConnection&) override { held_ = 0; }

 private:
  const RespCommands* commands_;
  RespSyncBackend* backend_;
  uint64_t held_ = 0;  // bytes the answers in `out` keep beyond their values (pinned chunks)
};

constexpr size_t kFlushBytes = 8u << 20;  // answer what we have past this (or the limit), then parse on

}  // namespace

void RespRefuseConnection(tcp::socket& s) {
  static constexpr char kMsg[] = "-ERR max number of clients reached\r\n";
  boost::system::error_code ec;
  s.non_blocking(true, ec);
  s.write_some(asio::buffer(kMsg, sizeof(kMsg) - 1), ec);
}

asio::awaitable<void> ServeRespConnection(tcp::socket s, const RespCommands* commands, RespSyncBackend* backend,
                                          RespConnectionOptions o) {
  RespLoopOptions lo;
  lo.max_bulk = o.max_bulk_bytes;
  lo.preauth = RespPreauthBytes(o.limits, o.max_bulk_bytes);
  lo.flush_bytes = std::min<uint64_t>(kFlushBytes, o.limits.max_pending_answer_bytes);
  lo.max_run = 1024;
  lo.first_read_bytes = 64u << 10;
  lo.keep_read_bytes = 1u << 20;  // a buffer grown past this for one command shrinks back once empty
  SyncRunner runner(commands, backend);
  // The TLS handshake and AUTH within handshake_timeout_ms, a command begun
  // within read_timeout_ms, answers taken within write_timeout_ms.
  co_await ServeAccepted(s, {o.tls.get(), o.limits, o.timeouts, o.tls_failures},
                         [&](auto& stream, ConnectionWatch& watch) {
                           return ServeRespCommands(stream, watch, *commands, lo, runner);
                         });
}

}  // namespace kvmesh
