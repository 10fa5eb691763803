#include "transport/openssl_util.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvmesh {
namespace {

// True when host is an IPv4 or IPv6 literal (checked as an IP subjectAltName, sent without SNI).
bool IsIpAddress(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Why `path` did not load: the system's reason when it cannot be read,
// OpenSSL's otherwise (not PEM, the wrong kind of object).
std::string Reason(const std::string& path) {
  errno = 0;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return tls_util::OpensslError();
  }
  const int e = errno;
  ERR_clear_error();
  return std::strerror(e);
}

Status CannotLoad(const std::string& setting, const std::string& path) {
  return InvalidArgument(setting + ": cannot load \"" + path + "\": " + Reason(path));
}

}  // namespace

namespace tls_util {

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

}  // namespace tls_util

Status LoadTlsIdentity(SSL_CTX* ctx, const TlsIdentityFiles& f, bool require_cert) {
  const std::string ca = f.setting + "ca", cert = f.setting + "cert", key = f.setting + "key";
  if (f.ca.empty()) return InvalidArgument(ca + ": a CA file is required (peers' certificates chain to it)");
  if (require_cert && f.cert.empty()) return InvalidArgument(cert + ": a certificate is required");
  if (f.cert.empty() != f.key.empty()) return InvalidArgument(cert + ", " + key + ": give both, or neither");
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(ctx, f.ca.c_str(), nullptr) != 1) return CannotLoad(ca, f.ca);
  if (f.cert.empty()) return Status::Ok();
  if (SSL_CTX_use_certificate_chain_file(ctx, f.cert.c_str()) != 1) return CannotLoad(cert, f.cert);
  if (SSL_CTX_use_PrivateKey_file(ctx, f.key.c_str(), SSL_FILETYPE_PEM) != 1) return CannotLoad(key, f.key);
  if (SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return InvalidArgument(key + ": \"" + f.key + "\" does not match " + cert + " \"" + f.cert + "\"");
  }
  return Status::Ok();
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

}  // namespace kvmesh
