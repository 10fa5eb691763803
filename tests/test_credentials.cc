// Secrets on the wire (common/credentials.h): constant-time comparison,
// base64 and the Authorization header forms of the control plane.
#include <catch2/catch.hpp>

#include "common/credentials.h"

using namespace kvmesh;

TEST_CASE("ConstantTimeEquals: equal only for the same bytes and length", "[credentials]") {
  CHECK(ConstantTimeEquals("s3cret", "s3cret"));
  CHECK(ConstantTimeEquals("", ""));
  CHECK_FALSE(ConstantTimeEquals("s3cret", "s3creT"));
  CHECK_FALSE(ConstantTimeEquals("s3cret", "s3cre"));
  CHECK_FALSE(ConstantTimeEquals("s3cre", "s3cret"));
  CHECK_FALSE(ConstantTimeEquals("", "x"));
  CHECK_FALSE(ConstantTimeEquals(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
}

TEST_CASE("Base64: RFC 4648 vectors round trip; bad text is refused", "[credentials]") {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    CHECK(Base64Encode(plain) == coded);
    CHECK(Base64Decode(coded) == std::optional<std::string>(plain));
  }
  const std::string all = [] {
    std::string s;
    for (int i = 0; i < 256; ++i) s += static_cast<char>(i);
    return s;
  }();
  CHECK(Base64Decode(Base64Encode(all)) == std::optional<std::string>(all));
  for (const char* bad : {"Zg=", "Z===", "Zg=a", "Zm9v!A==", "=Zm9", "Zg==Zg==", "Zm 9"})
    CHECK_FALSE(Base64Decode(bad).has_value());
}

TEST_CASE("ParseAuthorization: Bearer and Basic, anything else is malformed", "[credentials]") {
  HttpCredentials b = ParseAuthorization(BearerAuthorization("tok en"));
  CHECK(b.kind == HttpCredentials::Kind::kBearer);
  CHECK(b.secret == "tok en");
  CHECK(ParseAuthorization("bearer  abc ").secret == "abc");
  HttpCredentials u = ParseAuthorization(BasicAuthorization("tenant-a", "pass:word"));
  CHECK(u.kind == HttpCredentials::Kind::kBasic);
  CHECK(u.user == "tenant-a");
  CHECK(u.secret == "pass:word");
  CHECK(ParseAuthorization("").kind == HttpCredentials::Kind::kNone);
  for (const char* bad : {"Bearer", "Bearer   ", "Basic !!!", "Basic " /* empty */, "Token abc", "Basic Om5vdXNlcg=="})
    CHECK(ParseAuthorization(bad).kind == HttpCredentials::Kind::kMalformed);
}
