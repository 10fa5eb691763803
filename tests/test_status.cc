#include <catch2/catch.hpp>

#include "common/histogram.h"
#include "kvmesh/status.h"

using namespace kvmesh;

namespace {
Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd");
  return x / 2;
}
Result<int> Quarter(int x) {
  KVMESH_ASSIGN_OR_RETURN(int h, Half(x));
  KVMESH_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}
Status Check(int x) {
  KVMESH_RETURN_IF_ERROR(Quarter(x).status());
  return Status::Ok();
}
}  // namespace

TEST_CASE("Status carries code and message, Result carries value or status", "[status]") {
  CHECK(Status().ok());
  Status s = NotFound("block 1");
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.ToString() == "NotFound: block 1");
  CHECK(s.WithContext("get").message() == "get: block 1");
  CHECK(IsMiss(DataLoss("x")));
  CHECK_FALSE(IsMiss(InvalidArgument("x")));

  REQUIRE(Quarter(8).ok());
  CHECK(*Quarter(8) == 2);
  CHECK(Quarter(6).status().code() == StatusCode::kInvalidArgument);
  CHECK(Check(4).ok());
  CHECK(Check(2).message() == "odd");
  Result<int> bad{Status::Ok()};
  CHECK(bad.status().code() == StatusCode::kInternal);
}

TEST_CASE("LatencyHistogram percentiles are within one sub-bucket", "[histogram]") {
  LatencyHistogram h;
  for (int i = 1; i <= 1000; ++i) h.Record(i * 1000);  // 1us..1ms
  CHECK(h.count() == 1000);
  auto p50 = static_cast<double>(h.Percentile(0.5));
  auto p99 = static_cast<double>(h.Percentile(0.99));
  CHECK(p50 == Approx(500'000).epsilon(1.0 / 16));
  CHECK(p99 == Approx(990'000).epsilon(1.0 / 16));
  CHECK(h.Percentile(1.0) == 1'000'000);
  LatencyHistogram g;
  g.Record(5);
  g.Merge(h);
  CHECK(g.count() == 1001);
  CHECK(g.Percentile(0.0) == 5);
}
