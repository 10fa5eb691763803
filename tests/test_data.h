// tests/test_data.h — data the tests make: seeded pseudo-random bytes, a
// temporary directory removed with its contents on destruction, and cluster
// configs of n nodes (the test PKI is tests/test_pki.h).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kvmesh/config.h"

namespace kvmesh::testing {

// n bytes, one draw of mt19937_64(seed) each: the same seed, the same bytes.
inline std::vector<std::byte> RandomBytes(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// A fresh directory under /tmp, removed with what it holds on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/kvmesh-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// A cluster config of `members` (the JSON object's members before "nodes",
// such as R"("model": {...}, "store": {...})") and nodes "n0".."n<count-1>",
// each with `host` of host memory. REQUIREs that it parses.
inline ClusterConfig NodesConfig(const std::string& members, int count, const std::string& host) {
  std::string j = "{" + members + R"(, "nodes": [)";
  for (int i = 0; i < count; ++i)
    j += std::string(i ? "," : "") + R"({"id": "n)" + std::to_string(i) + R"(", "memory": {"host": ")" + host + R"("}})";
  j += "]}";
  auto c = ParseConfig(j);
  REQUIRE(c.ok());
  return *c;
}

}  // namespace kvmesh::testing
