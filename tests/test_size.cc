#include <catch2/catch.hpp>

#include "kvmesh/size.h"

using namespace kvmesh;

TEST_CASE("ParseSize accepts decimal and binary units and plain bytes", "[size]") {
  CHECK(*ParseSize("8GB") == 8'000'000'000ull);
  CHECK(*ParseSize("512MiB") == 512ull << 20);
  CHECK(*ParseSize("1.5GiB") == 3ull << 29);
  CHECK(*ParseSize("4096") == 4096);
  CHECK(*ParseSize("4096B") == 4096);
  CHECK(*ParseSize("64 kib") == 65536);
  CHECK(*ParseSize("2TiB") == 2ull << 40);
  CHECK(*ParseSize("0") == 0);
}

TEST_CASE("ParseSize rejects garbage with a reason", "[size]") {
  for (const char* bad : {"", "GB", "-1GB", "12XB", "1.2.3MB", "8 GB extra", "1e30TB"}) {
    INFO(bad);
    auto r = ParseSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("cannot parse size") != std::string::npos);
  }
}

TEST_CASE("FormatSize prints binary units", "[size]") {
  CHECK(FormatSize(64ull << 20) == "64MiB");
  CHECK(FormatSize(1536) == "1.50KiB");
  CHECK(FormatSize(100) == "100B");
}
