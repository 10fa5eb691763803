#include "transport/http_server.h"

#include "transport/asio_listener.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "transport/tls_server.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

class BeastServer final : public HttpServer {
 public:
  BeastServer(HttpHandler h, HttpTls tls) : handler_(std::move(h)), tls_(std::move(tls)) {}
  ~BeastServer() override { Stop(); }

  Status Bind(const std::string& host, uint16_t port) {
    AsioListenerOptions o;
    o.host = host;
    o.port = port;
    o.what = tls_ ? "HTTPS" : "HTTP";
    KVMESH_ASSIGN_OR_RETURN(listener_,
                            AsioListener::Start(o, [this](tcp::socket s) { return Session(std::move(s)); }));
    return Status::Ok();
  }

  uint16_t port() const override { return listener_->port(); }

  void Stop() override {
    if (listener_) listener_->Stop();
  }

 private:
  asio::awaitable<void> Session(tcp::socket socket) {
    boost::system::error_code ec;
    const tcp::endpoint ep = socket.remote_endpoint(ec);
    const std::string peer = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    beast::tcp_stream stream(std::move(socket));
    if (!tls_) {
      co_await Serve(stream, peer, /*client_cert=*/false);
      stream.socket().shutdown(tcp::socket::shutdown_send, ec);
      co_return;
    }
    beast::ssl_stream<beast::tcp_stream&> s(stream, *tls_);
    stream.expires_after(std::chrono::seconds(10));  // a handshake that stalls is dropped
    co_await s.async_handshake(asio::ssl::stream_base::server, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;  // not TLS, an unknown CA, no certificate where one is required
    co_await Serve(s, peer, TlsPeerVerified(s.native_handle()));
    stream.expires_after(std::chrono::seconds(2));
    co_await s.async_shutdown(asio::redirect_error(asio::use_awaitable, ec));  // close_notify
  }

  // Requests on one connection until it closes or asks to.
  template <typename Stream>
  asio::awaitable<void> Serve(Stream& stream, const std::string& peer, bool client_cert) {
    beast::flat_buffer buf;
    for (;;) {
      boost::system::error_code ec;
      http::request_parser<http::string_body> parser;
      parser.body_limit(1u << 20);
      beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(30));
      co_await http::async_read(stream, buf, parser, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      auto& req = parser.get();
      HttpServerRequest r{std::string(req.method_string()), std::string(req.target()), req.body(),
                          std::string(req[http::field::authorization]), peer, client_cert};
      HttpServerResponse out;
      try {
        out = handler_(r);
      } catch (const std::exception& e) {  // exceptions never cross the handler
        out = {500, "text/plain", std::string("internal error: ") + e.what() + "\n"};
      }
      http::response<http::string_body> res{static_cast<http::status>(out.status), req.version()};
      res.set(http::field::server, "kvmesh");
      res.set(http::field::content_type, out.content_type);
      if (!out.www_authenticate.empty()) res.set(http::field::www_authenticate, out.www_authenticate);
      res.keep_alive(req.keep_alive());
      res.body() = std::move(out.body);
      res.prepare_payload();
      co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || !res.keep_alive()) co_return;
    }
  }

  HttpHandler handler_;
  HttpTls tls_;
  std::unique_ptr<AsioListener> listener_;  // last: sessions use handler_ and tls_
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, uint16_t port, HttpHandler handler,
                                                      HttpTls tls) {
  auto s = std::make_unique<BeastServer>(std::move(handler), std::move(tls));
  KVMESH_RETURN_IF_ERROR(s->Bind(host, port));
  return std::unique_ptr<HttpServer>(std::move(s));
}

}  // namespace kvmesh
