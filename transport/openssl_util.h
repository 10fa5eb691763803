// transport/openssl_util.h — the OpenSSL code both TLS stacks share: the Asio
// one (transport/asio_tls.h: the servers, the proxy's node links) and the fd
// one (transport/fd_tls_client.h: blocking-with-deadline clients). Each is
// written once here: loading an endpoint's identity (CA, certificate, key)
// into a context, and naming the peer a client must find in the server's
// certificate. Thread-safe (OpenSSL's error queue is per thread).
#pragma once

#include <string>

#include "kvmesh/status.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kvmesh {

// The PEM files an endpoint trusts and shows, and what errors call them.
struct TlsIdentityFiles {
  std::string ca;    // the CA(s) a peer's certificate must chain to (required)
  std::string cert;  // the certificate (chain) this endpoint shows ("": none)
  std::string key;   // its private key (required with cert)
  // Errors name each file by the setting it came from: setting + "ca",
  // "cert" or "key" ("$.tls." for the cluster config's $.tls).
  std::string setting = "$.tls.";
};

// Loads `f` into `ctx`: the CA as the trust anchor, and the certificate and
// key when given (required with require_cert). One error text for every
// endpoint, naming the setting, the file and why:
//   InvalidArgument `$.tls.cert: cannot load "/etc/kvmesh/node.pem": No such file or directory`
//   InvalidArgument `$.tls.key: "/etc/kvmesh/node.key" does not match $.tls.cert "/etc/kvmesh/node.pem"`
Status LoadTlsIdentity(SSL_CTX* ctx, const TlsIdentityFiles& f, bool require_cert);

// Before a client handshake on `ssl`: the server name sent (SNI, for a host
// name) and, with verify_hostname, the peer-name check: the DNS name or IP
// address the server's certificate must carry (subjectAltName, no partial
// wildcards). InvalidArgument for a host OpenSSL cannot check.
Status PrepareTlsClient(SSL* ssl, const std::string& host, bool verify_hostname);

namespace tls_util {

// OpenSSL's reasons for the last failures on this thread (and clears its queue).
std::string OpensslError();

}  // namespace tls_util
}  // namespace kvmesh
