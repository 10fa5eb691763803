#include "transport/http_server.h"

#include "transport/asio_listener.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <limits>
#include <type_traits>
#include <vector>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "transport/asio_tls.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

// {"error": what}; `what` is a fixed text of this file, never a client's bytes.
HttpServerResponse Error(int status, const std::string& what) {
  return {status, "application/json", "{\"error\": \"" + what + "\"}\n", ""};
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The body's framing from the Transfer-Encoding fields of a request's head
// (RFC 9112 6.1, 6.3): none, or exactly "chunked", once. "chunked" not last
// or twice, or a list without it ("identity"), leaves the body's length
// ambiguous: 400. Another coding before a final "chunked" ("gzip, chunked")
// is one this server does not implement: 501. Beast itself refuses a
// Content-Length next to "chunked" and Content-Lengths that disagree.
std::optional<HttpServerResponse> CheckFraming(const http::request_header<>& h) {
  std::vector<std::string> codings;
  bool any = false;
  for (auto [it, end] = h.equal_range(http::field::transfer_encoding); it != end; ++it) {
    any = true;
    std::string_view v(it->value().data(), it->value().size());
    for (;;) {
      const size_t comma = v.find(',');
      std::string_view t = v.substr(0, comma);
      while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
      codings.push_back(Lower(t));
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  if (!any) return std::nullopt;
  if (h.version() < 11) return Error(400, "Transfer-Encoding in an HTTP/1.0 request");
  if (h.find(http::field::content_length) != h.end())
    return Error(400, "both Transfer-Encoding and Content-Length");
  const auto chunked = std::count(codings.begin(), codings.end(), "chunked");
  if (chunked != 1 || codings.back() != "chunked")
    return Error(400, "ambiguous Transfer-Encoding: the only coding accepted is chunked, once and last");
  if (codings.size() != 1) return Error(501, "unsupported Transfer-Encoding: only chunked is implemented");
  return std::nullopt;
}

// The answer to a request the parser refused while reading its head.
std::optional<HttpServerResponse> ParseErrorAnswer(const boost::system::error_code& ec) {
  if (ec.category() != http::make_error_code(http::error::bad_target).category()) return std::nullopt;
  if (ec == http::error::end_of_stream || ec == http::error::partial_message) return std::nullopt;  // gone
  if (ec == http::error::header_limit) return Error(431, "request header fields too large");
  if (ec == http::error::body_limit) return Error(413, "request body too large");
  return Error(400, "malformed request");
}

class BeastServer final : public HttpServer {
 public:
  BeastServer(HttpHandler h, HttpServerOptions o) : handler_(std::move(h)), options_(std::move(o)) {}
  ~BeastServer() override { Stop(); }

  Status Bind(const std::string& host, uint16_t port) {
    AsioListenerOptions o;
    o.host = host;
    o.port = port;
    o.what = options_.tls ? "HTTPS" : "HTTP";
    KVMESH_ASSIGN_OR_RETURN(listener_,
                            AsioListener::Start(o, [this](tcp::socket s) { return Session(std::move(s)); }));
    return Status::Ok();
  }

  uint16_t port() const override { return listener_->port(); }

  void Stop() override {
    if (listener_) listener_->Stop();
  }

 private:
  // Counts a session for as long as it lives (its frame may be destroyed by Stop).
  struct Slot {
    std::atomic<size_t>* n;
    ~Slot() { n->fetch_sub(1, std::memory_order_relaxed); }
  };

  asio::awaitable<void> Session(tcp::socket socket) {
    boost::system::error_code ec;
    if (sessions_.fetch_add(1, std::memory_order_relaxed) >= kHttpMaxConnections) {
      sessions_.fetch_sub(1, std::memory_order_relaxed);
      socket.close(ec);  // over the limit: closed at once
      co_return;
    }
    Slot slot{&sessions_};
    const tcp::endpoint ep = socket.remote_endpoint(ec);
    const std::string peer = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    beast::tcp_stream stream(std::move(socket));
    AcceptOptions accept;
    accept.tls = options_.tls.get();
    accept.limits.handshake_timeout_ms = options_.handshake_timeout.count();  // a handshake that stalls is dropped
    co_await ServeAccepted<beast::ssl_stream<beast::tcp_stream&>>(
        stream, accept, [this, &peer](auto& s, ConnectionWatch& watch) { return Connection(s, watch, peer); });
  }

  // The requests of one connection (credentials come with each request: the
  // connection is authenticated once accepted), then TLS's close_notify.
  template <typename Stream>
  asio::awaitable<void> Connection(Stream& s, ConnectionWatch& watch, const std::string& peer) {
    watch.Authenticated();
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      co_await Serve(s, peer, /*client_cert=*/false);
    } else {
      co_await Serve(s, peer, TlsPeerVerified(s.native_handle()));
      boost::system::error_code ec;
      beast::get_lowest_layer(s).expires_after(std::chrono::seconds(2));
      co_await s.async_shutdown(asio::redirect_error(asio::use_awaitable, ec));  // close_notify
    }
  }

  template <typename Stream>
  static asio::awaitable<bool> Write(Stream& stream, const HttpServerResponse& out, unsigned version, bool keep_alive) {
    http::response<http::string_body> res{static_cast<http::status>(out.status), version};
    res.set(http::field::server, "kvmesh");
    res.set(http::field::content_type, out.content_type);
    if (!out.www_authenticate.empty()) res.set(http::field::www_authenticate, out.www_authenticate);
    res.keep_alive(keep_alive);
    res.body() = out.body;
    res.prepare_payload();
    boost::system::error_code ec;
    co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
    co_return !ec;
  }

  // The last answer on a connection whose client may still be sending (a
  // body we will not read): closes our side, then discards what arrives for
  // a bounded time, so the client reads the answer rather than a reset.
  template <typename Stream>
  static asio::awaitable<void> Refuse(Stream& stream, const HttpServerResponse& out, unsigned version) {
    const bool written = co_await Write(stream, out, version, /*keep_alive=*/false);
    if (!written) co_return;
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      boost::system::error_code ec;
      stream.socket().shutdown(tcp::socket::shutdown_send, ec);
      stream.expires_after(kHttpDrainTimeout);
      char sink[16384];
      for (uint64_t drained = 0; drained < kHttpDrainBytes;) {
        const size_t n =
            co_await stream.async_read_some(asio::buffer(sink), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        drained += n;
      }
    }
  }

  // Requests on one connection until it closes or asks to.
  template <typename Stream>
  asio::awaitable<void> Serve(Stream& stream, const std::string& peer, bool client_cert) {
    beast::flat_buffer buf;
    for (;;) {
      boost::system::error_code ec;
      http::request_parser<http::string_body> parser;
      parser.header_limit(kHttpMaxHeaderBytes);
      // Decided below, from the head. (Not boost::none: Beast compares a Content-Length with it, and none is
      // smaller than any length.)
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      beast::get_lowest_layer(stream).expires_after(kHttpHeadTimeout);
      co_await http::async_read_header(stream, buf, parser, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        const std::optional<HttpServerResponse> answer = ParseErrorAnswer(ec);
        if (answer) co_await Refuse(stream, *answer, 11);
        co_return;
      }
      const http::request_header<>& head = parser.get().base();
      const unsigned version = head.version();
      const bool keep_alive = parser.keep_alive();
      const std::optional<HttpServerResponse> bad = CheckFraming(head);
      if (bad) {
        co_await Refuse(stream, *bad, version);
        co_return;
      }
      HttpServerRequest r{std::string(head.method_string()), std::string(head.target()), "",
                          std::string(head[http::field::authorization]), peer, client_cert};
      const bool body_pending = !parser.is_done();
      HttpHeadDecision d;
      if (options_.head_check) {
        try {
          d = options_.head_check(r);
        } catch (const std::exception&) {
          d.refuse = Error(500, "internal error");
        }
      }
      if (d.refuse) {
        if (body_pending) {
          co_await Refuse(stream, *d.refuse, version);
          co_return;
        }
        const bool written = co_await Write(stream, *d.refuse, version, keep_alive);
        if (!written || !keep_alive) co_return;
        continue;
      }
      const uint64_t limit = std::min(d.max_body_bytes, kHttpMaxBodyBytes);
      if (body_pending) {
        if (parser.content_length() && *parser.content_length() > limit) {
          const HttpServerResponse too_large = Error(413, "request body too large");
          co_await Refuse(stream, too_large, version);
          co_return;
        }
        parser.body_limit(limit);  // a chunked body: checked at each chunk's size
        if (version >= 11 && beast::iequals(head[http::field::expect], "100-continue")) {
          http::response<http::empty_body> cont{http::status::continue_, version};
          co_await http::async_write(stream, cont, asio::redirect_error(asio::use_awaitable, ec));
          if (ec) co_return;
        }
        const size_t fields = static_cast<size_t>(std::distance(head.begin(), head.end()));
        beast::get_lowest_layer(stream).expires_after(kHttpBodyTimeout);
        co_await http::async_read(stream, buf, parser, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {
          const std::optional<HttpServerResponse> answer = ParseErrorAnswer(ec);
          if (answer) co_await Refuse(stream, *answer, version);
          co_return;
        }
        // Beast adds a chunked body's trailer fields to the head's: refused.
        if (static_cast<size_t>(std::distance(head.begin(), head.end())) != fields) {
          const HttpServerResponse trailers = Error(400, "trailer fields are not accepted");
          co_await Refuse(stream, trailers, version);
          co_return;
        }
        r.body = std::move(parser.get().body());
      }
      HttpServerResponse out;
      try {
        out = handler_(r);
      } catch (const std::exception& e) {  // exceptions never cross the handler
        out = {500, "text/plain", std::string("internal error: ") + e.what() + "\n"};
      }
      const bool written = co_await Write(stream, out, version, keep_alive);
      if (!written || !keep_alive) co_return;
    }
  }

  HttpHandler handler_;
  HttpServerOptions options_;
  std::atomic<size_t> sessions_{0};
  std::unique_ptr<AsioListener> listener_;  // last: sessions use handler_, options_ and sessions_
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, uint16_t port, HttpHandler handler,
                                                      HttpServerOptions options) {
  auto s = std::make_unique<BeastServer>(std::move(handler), std::move(options));
  KVMESH_RETURN_IF_ERROR(s->Bind(host, port));
  return std::unique_ptr<HttpServer>(std::move(s));
}

}  // namespace kvmesh
