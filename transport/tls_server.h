// transport/tls_server.h — the server side of TLS for kvmesh's Asio servers
// (a node's data port, the HTTP ports), from $.tls of the cluster config
// (docs/security.md, "TLS"). Includes Asio: .cc files only.
//
//   auto ctx = MakeTlsServerContext(config.tls, /*require_client_cert=*/false).value();
//   boost::asio::ssl::stream<tcp::socket&> s(socket, *ctx);
//   co_await s.async_handshake(boost::asio::ssl::stream_base::server, ...);
//   bool signed_client = TlsPeerVerified(s.native_handle());
//
// Thread-safety: a context is shared by every session of a server; OpenSSL
// allows that once it is set up.
#pragma once

#include <memory>

#include <boost/asio/ssl.hpp>

#include "kvmesh/config.h"
#include "kvmesh/status.h"

namespace kvmesh {

// A TLS 1.2+ server context presenting tls.cert / tls.key. Clients may show a
// certificate, which is verified against tls.ca; with require_client_cert a
// client without one (or with one the CA did not sign) fails the handshake.
// InvalidArgument naming the JSON path ($.tls.cert, $.tls.key, $.tls.ca) and
// OpenSSL's reason when a file does not load or the key does not match.
Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsServerContext(const TlsConfig& tls, bool require_client_cert);

// After the handshake: the client showed a certificate that chains to the CA.
bool TlsPeerVerified(SSL* ssl);

}  // namespace kvmesh
