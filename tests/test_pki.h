// tests/test_pki.h — a fresh PKI for a test binary (CA, node, client
// certificates and keys that tests/make_test_certs.sh makes with the openssl
// CLI), removed at exit. Certs()("node.pem") is a file's path; ServerTls()
// the $.tls of a server showing node.pem. REQUIRES:
// KVMESH_SOURCE_DIR (the repository root) is defined for the test.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "kvmesh/config.h"

namespace kvmesh::testing {

struct TestPki {
  std::string dir;
  TestPki() {
    dir = "/tmp/kvmesh-pki-" + std::to_string(::getpid());
    const std::string cmd =
        "bash " + std::string(KVMESH_SOURCE_DIR) + "/tests/make_test_certs.sh " + dir + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) dir.clear();
  }
  ~TestPki() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  std::string operator()(const std::string& file) const { return dir + "/" + file; }
};

// The binary's PKI, made at first use.
inline const TestPki& Certs() {
  static TestPki pki;
  REQUIRE(!pki.dir.empty());
  return pki;
}

// $.tls serving `name`.pem / `name`.key, trusting the PKI's CA.
inline TlsConfig ServerTls(const std::string& name = "node", const std::string& client_auth = "none") {
  TlsConfig t;
  t.cert = Certs()(name + ".pem");
  t.key = Certs()(name + ".key");
  t.ca = Certs()("ca.pem");
  t.client_auth = client_auth;
  return t;
}

}  // namespace kvmesh::testing
