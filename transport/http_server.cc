#include "transport/http_server.h"

#include <thread>

#include "transport/asio.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace kvmesh {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

class BeastServer final : public HttpServer {
 public:
  BeastServer(HttpHandler h) : handler_(std::move(h)), acceptor_(io_) {}
  ~BeastServer() override { Stop(); }

  Status Bind(const std::string& host, uint16_t port) {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(host, ec);
    if (ec) return InvalidArgument("bad listen address " + host + ": " + ec.message());
    tcp::endpoint ep(addr, port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable("HTTP listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, Accept(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

 private:
  asio::awaitable<void> Accept() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor_.is_open()) co_return;
        continue;
      }
      asio::co_spawn(io_, Session(std::move(s)), asio::detached);
    }
  }

  asio::awaitable<void> Session(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buf;
    for (;;) {
      boost::system::error_code ec;
      http::request_parser<http::string_body> parser;
      parser.body_limit(1u << 20);
      stream.expires_after(std::chrono::seconds(30));
      co_await http::async_read(stream, buf, parser, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      auto& req = parser.get();
      HttpServerRequest r{std::string(req.method_string()), std::string(req.target()), req.body()};
      HttpServerResponse out;
      try {
        out = handler_(r);
      } catch (const std::exception& e) {  // exceptions never cross the handler
        out = {500, "text/plain", std::string("internal error: ") + e.what() + "\n"};
      }
      http::response<http::string_body> res{static_cast<http::status>(out.status), req.version()};
      res.set(http::field::server, "kvmesh");
      res.set(http::field::content_type, out.content_type);
      res.keep_alive(req.keep_alive());
      res.body() = std::move(out.body);
      res.prepare_payload();
      co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || !res.keep_alive()) {
        stream.socket().shutdown(tcp::socket::shutdown_send, ec);
        co_return;
      }
    }
  }

  HttpHandler handler_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, uint16_t port, HttpHandler handler) {
  auto s = std::make_unique<BeastServer>(std::move(handler));
  KVMESH_RETURN_IF_ERROR(s->Bind(host, port));
  return std::unique_ptr<HttpServer>(std::move(s));
}

}  // namespace kvmesh
