// transport/asio_tls.h — the Asio TLS stack, from $.tls of the cluster config
// (docs/security.md, "TLS"): the server side of every kvmesh server (a
// node's data port, the HTTP ports, the RESP ports) with the one accept path
// they share (ServeAccepted), and the client side of Asio clients (the RESP
// proxy's node links). The fd stack (blocking-with-deadline clients over
// plain sockets) is transport/fd_tls_client.h; both load their files and
// check the peer's name with transport/openssl_util.h. Includes Asio: .cc
// files only.
//
//   auto ctx = MakeTlsServerContext(config.tls, /*require_client_cert=*/false).value();
//   co_await ServeAccepted(socket, {ctx.get(), config.limits, &timeouts, &tls_failures},
//                          [&](auto& stream, ConnectionWatch& watch) { return Serve(stream, watch); });
//   bool signed_client = TlsPeerVerified(stream.native_handle());  // in Serve, over TLS
//
//   auto cctx = MakeAsioTlsClientContext(config.tls).value();
//   boost::asio::ssl::stream<tcp::socket&> c(socket, *cctx);
//   PrepareTlsClient(c.native_handle(), host, config.tls.verify_hostname);
//   co_await c.async_handshake(boost::asio::ssl::stream_base::client, ...);
//
// Thread-safety: a context is shared by every session of a server; OpenSSL
// allows that once it is set up.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/asio/ssl.hpp>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
#include "transport/asio_listener.h"
#include "transport/openssl_util.h"

namespace kvmesh {

// A TLS 1.2+ server context presenting tls.cert / tls.key. Clients may show a
// certificate, which is verified against tls.ca; with require_client_cert a
// client without one (or with one the CA did not sign) fails the handshake.
// InvalidArgument naming the JSON path ($.tls.cert, $.tls.key, $.tls.ca), the
// file and the reason when a file does not load or the key does not match
// (LoadTlsIdentity).
Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsServerContext(const TlsConfig& tls, bool require_client_cert);

// After the handshake: the client showed a certificate that chains to the CA.
bool TlsPeerVerified(SSL* ssl);

// A TLS 1.2+ client context that trusts servers whose certificates chain to
// tls.ca and presents tls.cert / tls.key (mutual TLS). Errors as
// MakeTlsServerContext's. Before each handshake: PrepareTlsClient
// (openssl_util.h), the server's name.
Result<std::shared_ptr<boost::asio::ssl::context>> MakeAsioTlsClientContext(const TlsConfig& tls);

// A failed handshake's reason, with OpenSSL's verification result when the
// peer's certificate was the cause (an unknown CA, a name mismatch).
std::string TlsErrorMessage(const boost::system::error_code& ec, SSL* ssl = nullptr);

// Asio's SSL stream writes one record per buffer it is given: `in` with each
// run of small pieces (under 16 KiB) copied into *stage, large pieces kept in
// place. The result points into *stage and into what `in` points to.
std::vector<boost::asio::const_buffer> CoalesceForTls(std::span<const boost::asio::const_buffer> in, std::string* stage);

// What a server gives ServeAccepted for each connection it accepted.
struct AcceptOptions {
  boost::asio::ssl::context* tls = nullptr;  // the server context; null: plain TCP
  // The connection's ConnectionWatch: its handshake_timeout_ms bounds the
  // TLS handshake and then the server's own (HELLO, AUTH), from the accept.
  LimitsConfig limits;
  WatchCounters* timeouts = nullptr;                // connections a timeout closed (may be null)
  std::atomic<uint64_t>* tls_failures = nullptr;  // handshakes that failed or timed out (may be null)
};

// The one accept path of every kvmesh server (data port, RESP fronts, HTTP):
// one accepted connection, from TCP_NODELAY to close. Watches it with a
// ConnectionWatch over o.limits; plain (o.tls null): runs serve(next, watch)
// with the socket non-blocking. TLS: makes the server handshake, and a
// client that fails it or does not finish it within handshake_timeout_ms
// (the watch closes the socket) is counted in *o.tls_failures and dropped
// without reaching `serve`; otherwise runs serve(tls_stream, watch). `serve`
// calls watch.Authenticated() once the client proved who it is (at once on
// ports that want no credentials). At the end the socket is shut down and
// closed.
//
// `next` is the accepted tcp::socket, or a stream that owns it and has
// socket() (beast::tcp_stream). The TLS stream is TlsStream
// (boost::asio::ssl::stream<Next&> unless the caller names one, e.g.
// beast::ssl_stream<beast::tcp_stream&>). REQUIRES: `next` outlives the
// coroutine; `serve` returns an awaitable for each stream type.
template <typename TlsStream = void, typename Next, typename Serve>
boost::asio::awaitable<void> ServeAccepted(Next& next, AcceptOptions o, Serve serve) {
  namespace asio = boost::asio;
  using Stream = std::conditional_t<std::is_void_v<TlsStream>, asio::ssl::stream<Next&>, TlsStream>;
  asio::ip::tcp::socket* socket;
  if constexpr (std::is_same_v<Next, asio::ip::tcp::socket>) socket = &next;
  else socket = &next.socket();
  boost::system::error_code ec;
  socket->set_option(asio::ip::tcp::no_delay(true), ec);
  {
    ConnectionWatch watch(*socket, o.limits, o.timeouts);
    if (o.tls == nullptr) {
      socket->non_blocking(true, ec);  // plain writes go at once when the socket takes them (WatchedWrite)
      co_await serve(next, watch);
    } else {
      Stream tls(next, *o.tls);
      co_await tls.async_handshake(asio::ssl::stream_base::server, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (o.tls_failures) o.tls_failures->fetch_add(1, std::memory_order_relaxed);
      } else {
        co_await serve(tls, watch);
      }
    }
  }
  socket->shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket->close(ec);
}

}  // namespace kvmesh
