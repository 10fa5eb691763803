#include "transport/tls_server.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cstring>

#include "transport/openssl_util.h"

namespace kvmesh {
namespace {

using tls_util::IsIpAddress;
using tls_util::OpensslError;

constexpr size_t kSmallPiece = 16u << 10;

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

Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsClientContext(const TlsConfig& tls) {
  namespace ssl = boost::asio::ssl;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(c, tls.ca.c_str(), nullptr) != 1)
    return InvalidArgument("$.tls.ca: \"" + tls.ca + "\": " + OpensslError());
  if (!tls.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(c, tls.cert.c_str()) != 1)
      return InvalidArgument("$.tls.cert: \"" + tls.cert + "\": " + OpensslError());
    if (SSL_CTX_use_PrivateKey_file(c, tls.key.c_str(), SSL_FILETYPE_PEM) != 1)
      return InvalidArgument("$.tls.key: \"" + tls.key + "\": " + OpensslError());
    if (SSL_CTX_check_private_key(c) != 1)
      return InvalidArgument("$.tls.key: \"" + tls.key + "\" does not match $.tls.cert \"" + tls.cert + "\"");
  }
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  return ctx;
}

Status PrepareTlsClient(SSL* ssl, const std::string& host, bool verify_hostname) {
  const bool ip = IsIpAddress(host);
  if (verify_hostname) {
    X509_VERIFY_PARAM* p = SSL_get0_param(ssl);
    X509_VERIFY_PARAM_set_hostflags(p, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    const bool ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(p, host.c_str()) == 1
                       : X509_VERIFY_PARAM_set1_host(p, host.c_str(), 0) == 1;
    if (!ok) return InvalidArgument("TLS: cannot verify against host name \"" + host + "\"");
  }
  if (!ip) SSL_set_tlsext_host_name(ssl, host.c_str());
  return Status::Ok();
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
