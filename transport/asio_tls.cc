#include "transport/asio_tls.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

namespace kvmesh {
namespace {

constexpr size_t kSmallPiece = 16u << 10;

}  // namespace

Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsServerContext(const TlsConfig& tls, bool require_client_cert) {
  namespace ssl = boost::asio::ssl;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  KVMESH_RETURN_IF_ERROR(LoadTlsIdentity(c, {tls.ca, tls.cert, tls.key}, /*require_cert=*/true));
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

Result<std::shared_ptr<boost::asio::ssl::context>> MakeAsioTlsClientContext(const TlsConfig& tls) {
  namespace ssl = boost::asio::ssl;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
  KVMESH_RETURN_IF_ERROR(LoadTlsIdentity(c, {tls.ca, tls.cert, tls.key}, /*require_cert=*/false));
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  return ctx;
}

std::string TlsErrorMessage(const boost::system::error_code& ec, SSL* ssl) {
  std::string m = ec.message();
  if (ssl != nullptr) {
    const long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) m += " (certificate: " + std::string(X509_verify_cert_error_string(v)) + ")";
  }
  return m;
}

std::vector<boost::asio::const_buffer> CoalesceForTls(std::span<const boost::asio::const_buffer> in, std::string* stage) {
  size_t small = 0;
  for (const auto& b : in)
    if (b.size() < kSmallPiece) small += b.size();
  stage->clear();
  stage->reserve(small);  // no reallocation below: the result points into it
  std::vector<boost::asio::const_buffer> out;
  size_t run = 0;  // start of the current run in *stage
  auto end_run = [&] {
    if (stage->size() > run) out.emplace_back(stage->data() + run, stage->size() - run);
    run = stage->size();
  };
  for (const auto& b : in) {
    if (b.size() == 0) continue;
    if (b.size() < kSmallPiece) {
      stage->append(static_cast<const char*>(b.data()), b.size());
      continue;
    }
    end_run();
    out.push_back(b);
  }
  end_run();
  return out;
}

}  // namespace kvmesh
