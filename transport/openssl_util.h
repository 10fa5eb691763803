// transport/openssl_util.h — the two OpenSSL helpers the TLS client
// (tls_client.cc) and the TLS servers (tls_server.cc) share. Header-only:
// both libraries link OpenSSL already. Thread-safe (OpenSSL's error queue is
// per thread).
#pragma once

#include <arpa/inet.h>
#include <openssl/err.h>

#include <string>

namespace kvmesh::tls_util {

// OpenSSL's reasons for the last failures on this thread (and clears its queue).
inline std::string OpensslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

// True when host is an IPv4 or IPv6 literal (checked as an IP subjectAltName, sent without SNI).
inline bool IsIpAddress(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace kvmesh::tls_util
