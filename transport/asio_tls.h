// transport/asio_tls.h — the Asio TLS stack, from $.tls of the cluster config
// (docs/security.md, "TLS"): the server side of every kvmesh server (a
// node's data port, the HTTP ports, the RESP ports), and the client side of
// Asio clients (the RESP proxy's node links). The fd stack
// (blocking-with-deadline clients over plain sockets) is
// transport/fd_tls_client.h; both load their files and check the peer's name
// with transport/openssl_util.h. Includes Asio: .cc files only.
//
//   auto ctx = MakeTlsServerContext(config.tls, /*require_client_cert=*/false).value();
//   boost::asio::ssl::stream<tcp::socket&> s(socket, *ctx);
//   co_await s.async_handshake(boost::asio::ssl::stream_base::server, ...);
//   bool signed_client = TlsPeerVerified(s.native_handle());
//
//   auto cctx = MakeAsioTlsClientContext(config.tls).value();
//   boost::asio::ssl::stream<tcp::socket&> c(socket, *cctx);
//   PrepareTlsClient(c.native_handle(), host, config.tls.verify_hostname);
//   co_await c.async_handshake(boost::asio::ssl::stream_base::client, ...);
//
// Thread-safety: a context is shared by every session of a server; OpenSSL
// allows that once it is set up.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/ssl.hpp>

#include "kvmesh/config.h"
#include "kvmesh/status.h"
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

}  // namespace kvmesh
