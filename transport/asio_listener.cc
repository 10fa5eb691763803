#include "transport/asio_listener.h"

#include <atomic>
#include <thread>
#include <vector>

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class Listener final : public AsioListener {
 public:
  Listener(AsioListenerOptions o, Session session) : o_(std::move(o)), session_(std::move(session)) {
    for (uint32_t i = 0; i < o_.session_threads; ++i) ios_.push_back(std::make_unique<asio::io_context>(1));
  }
  ~Listener() override { Stop(); }

  Status Bind() {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(o_.host, ec);
    if (ec) return InvalidArgument("bad listen address " + o_.host + ": " + ec.message());
    tcp::endpoint ep(addr, o_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable(o_.what + " listen on " + o_.host + ":" + std::to_string(o_.port) + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(accept_io_, Accept(), asio::detached);
    for (auto& io : ios_) guards_.emplace_back(asio::make_work_guard(*io));
    threads_.emplace_back([this] { accept_io_.run(); });
    for (auto& io : ios_) threads_.emplace_back([p = io.get()] { p->run(); });
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(accept_io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      accept_io_.stop();
    });
    for (auto& io : ios_) io->stop();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  asio::awaitable<void> Accept() {
    for (;;) {
      boost::system::error_code ec;
      asio::io_context& io = ios_.empty() ? accept_io_ : *ios_[next_io_++ % ios_.size()];
      tcp::socket s = co_await acceptor_.async_accept(io, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor_.is_open()) co_return;
        continue;
      }
      asio::co_spawn(io, session_(std::move(s)), asio::detached);
    }
  }

  const AsioListenerOptions o_;
  const Session session_;
  // Order matters for destruction: the pending accept on accept_io_ holds a
  // socket of one of ios_, so accept_io_ must go first (declared after).
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  asio::io_context accept_io_{1};
  tcp::acceptor acceptor_{accept_io_};
  size_t next_io_ = 0;  // accept thread only
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace

Result<std::unique_ptr<AsioListener>> AsioListener::Start(AsioListenerOptions options, Session session) {
  auto l = std::make_unique<Listener>(std::move(options), std::move(session));
  KVMESH_RETURN_IF_ERROR(l->Bind());
  return std::unique_ptr<AsioListener>(std::move(l));
}

}  // namespace kvmesh
