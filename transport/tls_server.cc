#include "transport/tls_server.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace kvmesh {
namespace {

std::string OpensslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

}  // namespace

Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsServerContext(const TlsConfig& tls, bool require_client_cert) {
  namespace ssl = boost::asio::ssl;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(c, tls.cert.c_str()) != 1)
    return InvalidArgument("$.tls.cert: \"" + tls.cert + "\": " + OpensslError());
  if (SSL_CTX_use_PrivateKey_file(c, tls.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return InvalidArgument("$.tls.key: \"" + tls.key + "\": " + OpensslError());
  if (SSL_CTX_check_private_key(c) != 1)
    return InvalidArgument("$.tls.key: \"" + tls.key + "\" does not match $.tls.cert \"" + tls.cert + "\"");
  if (SSL_CTX_load_verify_locations(c, tls.ca.c_str(), nullptr) != 1)
    return InvalidArgument("$.tls.ca: \"" + tls.ca + "\": " + OpensslError());
  // The CA names clients may choose a certificate by.
  if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.ca.c_str())) SSL_CTX_set_client_CA_list(c, names);
  // Ask every client for a certificate; a shown one must verify. Without
  // one the handshake still succeeds unless it is required.
  int mode = SSL_VERIFY_PEER;
  if (require_client_cert) mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(c, mode, nullptr);
  return ctx;
}

bool TlsPeerVerified(SSL* ssl) {
  X509* peer = SSL_get1_peer_certificate(ssl);
  if (peer == nullptr) return false;
  X509_free(peer);
  return SSL_get_verify_result(ssl) == X509_V_OK;
}

}  // namespace kvmesh
